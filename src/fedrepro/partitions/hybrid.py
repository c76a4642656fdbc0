"""FedLAW's hybrid Dirichlet: a balanced and an imbalanced group of clients."""

from __future__ import annotations

import numpy as np

from fedrepro.partitions import dirichlet
from fedrepro.partitions.base import PartitionError


def split(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha_balanced: float,
    alpha: float,
    min_size: int = 10,
    balance: bool = True,
) -> list[np.ndarray]:
    """FedLAW's hybrid Dirichlet (App. D, Fig. 5): draw a ``num_clients`` partition with Dir(alpha_balanced)
    and keep its first half of the clients (the "balanced" group); split the samples left over among the
    other half with Dir(alpha) (the "imbalanced" group). ``groups`` names the two halves."""
    if num_clients < 2:
        raise PartitionError(f"partition.kind = hybrid needs num_clients >= 2, got {num_clients}")
    half = num_clients // 2
    first = dirichlet.split(labels, num_clients, rng, alpha_balanced, min_size, balance)[:half]
    rest = np.setdiff1d(np.arange(len(labels)), np.concatenate(first))
    second = dirichlet.split(labels[rest], num_clients - half, rng, alpha, min_size, balance)
    return first + [np.sort(rest[part]) for part in second]


def make(labels: np.ndarray, setting: dict, groups=None) -> list[np.ndarray]:
    return split(
        labels,
        setting["num_clients"],
        np.random.default_rng(setting["seed"]),
        setting["alpha_balanced"],
        setting["alpha"],
        setting["min_size"],
        setting["balance"],
    )


def groups(num_clients: int) -> dict[str, np.ndarray]:
    """The two halves, whose coherence the run logs apart."""
    half = num_clients // 2
    return {"balanced": np.arange(half), "imbalanced": np.arange(half, num_clients)}
