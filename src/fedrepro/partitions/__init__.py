"""Splitting a training set over clients, one module a kind: ``iid``, ``dirichlet`` (both optionally over a
long-tailed subset, FedLAW Table 7), ``hybrid`` (FedLAW's balanced and imbalanced groups), ``shards``,
``label_quantity`` (NIID-Bench's #C classes a client), ``pachinko`` (CIFAR-100's coarse and fine labels),
``inner_dirichlet`` (FedLab's balanced "inner" Dirichlet), ``natural`` (the dataset's own clients) and ``file``
(index lists another program wrote). A multi-domain dataset (IMA's Digit-Five, PACS) is split domain by domain,
each over its own share of the clients (``base.per_domain``).

Each kind is ``partitions/<kind>.py`` with ``make(labels, setting, groups)`` and ``partitions/<kind>.yaml`` (the
settings its identity reads, its readable name, its own settings: fedrepro.catalog); this package finds the module by
the kind's name (a partition
id hashes its own kind's module and the helpers it imports, ``identity.partition_code``). What a partition
folder holds (indices, counts, record, heatmap) is written and read by ``records``, outside every hash.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import numpy as np

from fedrepro.catalog import DATASETS
from fedrepro.partitions.base import PartitionError, per_domain

NOT_KINDS = ("__init__", "base", "records")


def kind_module(kind: str) -> ModuleType:
    """The module of partition kind ``kind`` (``partitions/<kind>.py``)."""
    if kind in NOT_KINDS or not kind.isidentifier() or not (Path(__file__).parent / f"{kind}.py").is_file():
        raise PartitionError(f"unknown partition kind '{kind}'")
    return importlib.import_module(f"{__name__}.{kind}")


def make(
    labels: np.ndarray, setting: dict, groups: np.ndarray | None = None, domains: np.ndarray | None = None
) -> list[np.ndarray]:
    """Partition from a resolved partition setting (``identity.partition_setting``); ``groups`` (each sample's
    natural client) is needed by kind ``natural`` only; with ``domains`` (each sample's domain: a multi-domain
    dataset) every domain is split on its own."""
    if domains is not None and setting["kind"] != "file":  # a file lists the whole training set's indices
        return per_domain(labels, setting, domains, make)
    return kind_module(setting["kind"]).make(labels, setting, groups)


def groups(setting: dict) -> dict[str, np.ndarray]:
    """Named client groups a partition defines (the run logs each group's coherence): a multi-domain dataset's
    domains, a kind's own groups (hybrid's two halves); {} for the rest."""
    domains = DATASETS.get(setting.get("dataset"), {}).get("domains")
    if domains:
        per = setting["num_clients"] // len(domains)
        return {f"domain_{name}": np.arange(d * per, (d + 1) * per) for d, name in enumerate(domains)}
    kind = kind_module(setting["kind"])
    return kind.groups(setting["num_clients"]) if hasattr(kind, "groups") else {}
