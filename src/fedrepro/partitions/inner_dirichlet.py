"""FedLab's balanced "inner" Dirichlet: equal client sizes, a class prior Dir(alpha) per client."""

from __future__ import annotations

import numpy as np

from fedrepro.partitions.base import draw


def split(labels: np.ndarray, num_clients: int, rng: np.random.Generator, alpha: float) -> list[np.ndarray]:
    """FedLab's balanced "inner" Dirichlet (``client_inner_dirichlet_partition``, the default of its
    CIFAR10/100Partitioner with partition="dirichlet"; IMA's CIFAR-100 notebook): every client gets
    floor(N / J) samples and its own class prior q_j ~ Dir_C(alpha). Sample by sample, a random client that
    still has room takes one sample of a class drawn from q_j; a class that has run out is skipped by drawing
    from q_j renormalised over the classes left (FedLab's loop redraws until it hits one, which can hang)."""
    classes = np.unique(labels)
    pools = [rng.permutation(np.flatnonzero(labels == k)).tolist() for k in classes]
    left = np.array([len(p) for p in pools]) > 0
    priors = rng.dirichlet(np.full(len(classes), alpha), size=num_clients)
    size = len(labels) // num_clients
    taken: list[list[int]] = [[] for _ in range(num_clients)]
    open_clients = list(range(num_clients)) if size else []
    while open_clients:
        slot = int(rng.integers(len(open_clients)))
        j = open_clients[slot]
        c = draw(priors[j], left, rng)
        taken[j].append(pools[c].pop())
        left[c] = bool(pools[c])
        if len(taken[j]) == size:
            open_clients[slot] = open_clients[-1]
            open_clients.pop()
    return [np.sort(np.asarray(t, dtype=np.int64)) for t in taken]


def make(labels: np.ndarray, setting: dict, groups=None) -> list[np.ndarray]:
    return split(labels, setting["num_clients"], np.random.default_rng(setting["seed"]), setting["alpha"])
