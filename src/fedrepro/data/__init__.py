"""Datasets by name: ``download``/``prepare`` fetch (or generate, or check) them, ``load`` gives a split as a
device dataset (``base.Dataset``), ``train_labels`` the labels a partition splits, ``train_domains`` the
domain of each training sample (multi-domain families only).

A family is a module over ``base`` and its fragment: ``data/<family>.py`` and ``data/<family>.yaml``, which
declares the datasets it serves and their facts (fedrepro.catalog). The module provides ``download(dataset,
root, mirrors, timeout, log)`` and ``load(dataset, root, train, preprocess, pretrained)``, optionally
``train_labels(dataset, root)`` (labels without decoding the inputs) and ``train_domains(dataset, root)``.
Nothing here names a dataset or a family; the families never import this module.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

from fedrepro.catalog import DATASETS
from fedrepro.data.base import DataError, Dataset, DownloadError, TensorDataset, fetch_from_mirrors, gather

__all__ = [
    "DataError",
    "Dataset",
    "DownloadError",
    "TensorDataset",
    "download",
    "families",
    "family",
    "fetch_from_mirrors",
    "gather",
    "load",
    "prepare",
    "train_domains",
    "train_labels",
]


def family(dataset: str) -> ModuleType:
    """The module that serves ``dataset`` (the fragment that declares it names it)."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset '{dataset}'; known: {', '.join(sorted(DATASETS))}")
    return importlib.import_module(f"{__name__}.{DATASETS[dataset]['family']}")


def families() -> dict[str, ModuleType]:
    """Every family module by name."""
    return {facts["family"]: family(name) for name, facts in DATASETS.items()}


def download(
    dataset: str, root: str | Path, mirrors: list[str] | None = None, timeout: float = 20.0, log=print
) -> Path:
    """Fetch every file of ``dataset`` into ``root`` (or check the files a user put there); return its
    folder. Idempotent."""
    return family(dataset).download(dataset, root, mirrors, timeout=timeout, log=log)


def prepare(
    dataset: str,
    root: str | Path,
    mirrors: list[str] | None,
    out: str | Path | None,
    log_file: str | Path | None = None,
    timeout: float = 20.0,
) -> Path:
    """Download (idempotent) and, with ``out``, write the list of files as the step's output."""
    logs = open(log_file, "a") if log_file else None
    log = (lambda msg: print(msg, file=logs, flush=True)) if logs else print
    try:
        folder = download(dataset, root, mirrors, timeout=timeout, log=log)
    finally:
        if logs:
            logs.close()
    if out:
        files = sorted(p.name for p in Path(folder).iterdir() if not p.name.startswith("."))
        Path(out).write_text(json.dumps({"dataset": dataset, "folder": str(folder), "files": files}, indent=2))
    return Path(folder)


def load(
    dataset: str, root: str | Path, train: bool, preprocess: dict | None = None, pretrained: dict | None = None
) -> Dataset:
    """Load a downloaded split (``preprocess``: CIFAR only; ``pretrained``: the tokenizer's path and
    token length, text datasets only)."""
    return family(dataset).load(dataset, root, train, preprocess=preprocess, pretrained=pretrained)


def train_labels(dataset: str, root: str | Path):
    module = family(dataset)
    if hasattr(module, "train_labels"):  # the labels alone: no tokenising or decoding to partition
        return module.train_labels(dataset, root)
    return load(dataset, root, train=True).labels.numpy()


def train_groups(dataset: str, root: str | Path):
    """Each training sample's own client (a dataset with natural clients, Synthetic's users), or None."""
    module = family(dataset)
    return module.train_groups(dataset, root) if hasattr(module, "train_groups") else None


def train_domains(dataset: str, root: str | Path):
    """Each training sample's domain (in load's order), or None for a single-domain dataset."""
    module = family(dataset)
    return module.train_domains(dataset, root) if hasattr(module, "train_domains") else None
