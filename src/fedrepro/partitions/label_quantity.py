"""NIID-Bench's quantity-based label skew: each client holds classes_per_client classes."""

from __future__ import annotations

import numpy as np

from fedrepro.partitions.base import PartitionError


def split(labels: np.ndarray, num_clients: int, rng: np.random.Generator, classes_per_client: int) -> list[np.ndarray]:
    """NIID-Bench's quantity-based label skew ("noniid-#label", FedLab's label_skew_quantity_based_partition;
    IMA's Digit-Five #C=2): client j holds class j mod C and classes_per_client - 1 other classes drawn
    uniformly without repeats; each class's samples, shuffled, are cut into near-equal pieces, one for each
    client holding it. A class no client holds is left out (only when num_clients < C)."""
    classes = int(labels.max()) + 1
    if classes_per_client > classes:
        raise PartitionError(
            f"partition.classes_per_client = {classes_per_client} exceeds the {classes} classes; "
            f"choose at most {classes}"
        )
    held = []
    for j in range(num_clients):
        others = rng.permutation(np.delete(np.arange(classes), j % classes))[: classes_per_client - 1]
        held.append({j % classes, *others.tolist()})
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k in range(classes):
        holders = [j for j in range(num_clients) if k in held[j]]
        if holders:
            pieces = np.array_split(rng.permutation(np.flatnonzero(labels == k)), len(holders))
            for j, piece in zip(holders, pieces):
                parts[j].append(piece)
    return [np.sort(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, dtype=np.int64) for p in parts]


def make(labels: np.ndarray, setting: dict, groups=None) -> list[np.ndarray]:
    return split(labels, setting["num_clients"], np.random.default_rng(setting["seed"]), setting["classes_per_client"])
