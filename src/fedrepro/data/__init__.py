"""Datasets by name: ``download``/``prepare`` fetch (or generate, or check) them, ``load`` gives a split as a
device dataset (``base.Dataset``), ``train_labels`` the labels a partition splits, ``train_domains`` the
domain of each training sample (multi-domain families only).

A family is one module over ``base`` listed in ``FAMILIES``; it declares the names it serves (``HANDLED``)
and provides ``download(dataset, root, mirrors, timeout, log)`` and ``load(dataset, root, train,
preprocess, pretrained)``, optionally ``train_labels(dataset, root)`` (labels without decoding the inputs)
and ``train_domains(dataset, root)``. Nothing here names a dataset; the families never import this module.
"""
from __future__ import annotations

import json
from pathlib import Path

from fedrepro.data import agnews, cifar, digit5, fmnist, pacs, synthetic
from fedrepro.data.base import DataError, Dataset, DownloadError, TensorDataset, fetch_from_mirrors, gather

__all__ = ["DataError", "Dataset", "DownloadError", "FAMILIES", "TensorDataset", "download", "family",
           "fetch_from_mirrors", "gather", "load", "prepare", "train_domains", "train_labels"]

# The one list of families (imported above by name, so a run's code hash covers each of them)
FAMILIES = (fmnist, cifar, synthetic, agnews, digit5, pacs)


def family(dataset: str):
    """The module that serves ``dataset``."""
    for module in FAMILIES:
        if dataset in module.HANDLED:
            return module
    known = sorted(name for module in FAMILIES for name in module.HANDLED)
    raise ValueError(f"unknown dataset '{dataset}'; known: {', '.join(known)}")


def download(dataset: str, root: str | Path, mirrors: list[str] | None = None,
             timeout: float = 20.0, log=print) -> Path:
    """Fetch every file of ``dataset`` into ``root`` (or check the files a user put there); return its
    folder. Idempotent."""
    return family(dataset).download(dataset, root, mirrors, timeout=timeout, log=log)


def prepare(dataset: str, root: str | Path, mirrors: list[str] | None, out: str | Path | None,
            log_file: str | Path | None = None, timeout: float = 20.0) -> Path:
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


def load(dataset: str, root: str | Path, train: bool, preprocess: dict | None = None,
         pretrained: dict | None = None) -> Dataset:
    """Load a downloaded split (``preprocess``: CIFAR only; ``pretrained``: the tokenizer's path and
    token length, text datasets only)."""
    return family(dataset).load(dataset, root, train, preprocess=preprocess, pretrained=pretrained)


def train_labels(dataset: str, root: str | Path):
    module = family(dataset)
    if hasattr(module, "train_labels"):  # the labels alone: no tokenising or decoding to partition
        return module.train_labels(dataset, root)
    return load(dataset, root, train=True).labels.numpy()


def train_domains(dataset: str, root: str | Path):
    """Each training sample's domain (in load's order), or None for a single-domain dataset."""
    module = family(dataset)
    return module.train_domains(dataset, root) if hasattr(module, "train_domains") else None
