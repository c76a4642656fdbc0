"""IID: a uniformly random permutation cut into equal parts (optionally over a long-tailed subset)."""

from __future__ import annotations

import numpy as np

from fedrepro.partitions.base import long_tailed


def split(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), num_clients)]


def make(labels: np.ndarray, setting: dict, groups=None) -> list[np.ndarray]:
    rng = np.random.default_rng(setting["seed"])
    if setting.get("long_tail_rho", 1) != 1:
        return long_tailed(labels, setting, rng, make)
    return split(labels, setting["num_clients"], rng)
