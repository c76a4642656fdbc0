"""The dataset's own clients (Synthetic's users); nothing to draw."""

from __future__ import annotations

import numpy as np

from fedrepro.partitions.base import PartitionError


def split(groups: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """The dataset's own clients (Synthetic's users): client i holds the samples of group i."""
    found = int(groups.max()) + 1 if len(groups) else 0
    if found != num_clients:
        raise PartitionError(f"the dataset has {found} natural clients, the setting asks for {num_clients}")
    return [np.flatnonzero(groups == i) for i in range(num_clients)]


def make(labels: np.ndarray, setting: dict, groups: np.ndarray | None = None) -> list[np.ndarray]:
    """``groups``: each sample's natural client."""
    if groups is None:
        raise PartitionError("partition kind 'natural' needs the dataset's client of each sample")
    return split(groups, setting["num_clients"])
