"""Datasets by name: ``download``/``prepare`` fetch (or generate) them, ``load`` gives a split as a
device dataset (``base.Dataset``), ``train_labels`` the labels a partition splits.

One module per family (fmnist, cifar, synthetic, agnews) over ``base``, which holds the dataset
protocol and the download machinery; the families never import this dispatcher.
"""
from __future__ import annotations

import json
from pathlib import Path

from fedrepro.data import agnews, cifar, fmnist, synthetic
from fedrepro.data.base import DataError, Dataset, DownloadError, TensorDataset, fetch_from_mirrors, gather

__all__ = ["DataError", "Dataset", "DownloadError", "TensorDataset", "download", "fetch_from_mirrors", "gather",
           "load", "prepare", "train_labels"]


def _unknown(dataset: str) -> ValueError:
    known = sorted(fmnist.HANDLED | cifar.HANDLED | synthetic.HANDLED | agnews.HANDLED)
    return ValueError(f"unknown dataset '{dataset}'; known: {', '.join(known)}")


def download(dataset: str, root: str | Path, mirrors: list[str] | None = None,
             timeout: float = 20.0, log=print) -> Path:
    """Fetch every file of ``dataset`` into ``root``; return its folder. Idempotent."""
    if dataset in fmnist.HANDLED:
        return fmnist.download(root, mirrors, timeout, log)
    if dataset in cifar.HANDLED:  # the python-pickle archive
        return cifar.download(dataset, root, mirrors, timeout, log)
    if dataset in synthetic.HANDLED:  # generated, nothing to fetch
        return synthetic.download(dataset, root, log)
    if dataset in agnews.HANDLED:  # parquet or csv
        return agnews.download(dataset, root, mirrors, timeout, log)
    raise _unknown(dataset)


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
    if dataset in fmnist.HANDLED:
        return fmnist.load(root, train)
    if dataset in cifar.HANDLED:
        return cifar.load(dataset, root, train, preprocess)
    if dataset in synthetic.HANDLED:
        return synthetic.load(dataset, root, train)
    if dataset in agnews.HANDLED:
        return agnews.load(dataset, root, train, pretrained)
    raise _unknown(dataset)


def train_labels(dataset: str, root: str | Path):
    if dataset in agnews.HANDLED:  # the label column alone; tokenising is not needed to partition
        return agnews.train_labels(root)
    return load(dataset, root, train=True).labels.numpy()
