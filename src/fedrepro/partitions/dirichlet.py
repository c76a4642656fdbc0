"""Dirichlet over labels (NIID-Bench / FedLab ``hetero_dir``), optionally over a long-tailed subset."""

from __future__ import annotations

import time

import numpy as np

from fedrepro.partitions.base import PartitionError, long_tailed

# Redrawing a Dirichlet partition until every client has min_size samples: a min_size that is
# reachable in principle but not in practice (alpha = 0.001 gives each class to one client) would
# redraw for minutes. The draws are seeded, so this cap decides only whether the partition is found
# in time, never which one it is.
DIRICHLET_SECONDS = 10.0


def split(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha: float,
    min_size: int = 10,
    balance: bool = True,
    max_tries: int = 10000,
    max_seconds: float | None = None,
) -> list[np.ndarray]:
    """The NIID-Bench / FedLab ``hetero_dir`` recipe: per-class proportions over clients.

    For each class, p ~ Dir_J(alpha); with ``balance`` a client already above N/J gets no more;
    the class is cut at floor(cumsum(p) * n_k). Redraw until every client has ``min_size``, at most
    ``max_tries`` times and ``max_seconds`` long.
    """
    n, classes = len(labels), np.unique(labels)
    by_class = [np.flatnonzero(labels == k) for k in classes]
    max_seconds = DIRICHLET_SECONDS if max_seconds is None else max_seconds
    start, best, tries = time.monotonic(), 0, 0
    while tries < max_tries and (tries == 0 or time.monotonic() - start < max_seconds):
        tries += 1
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for idx_k in by_class:
            idx_k = rng.permutation(idx_k)
            p = rng.dirichlet(np.full(num_clients, alpha))
            if balance:
                p = p * np.array([len(c) < n / num_clients for c in parts])
                p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx_k)).astype(int)[:-1]
            for client, piece in zip(parts, np.split(idx_k, cuts)):
                client.extend(piece.tolist())
        smallest = min(len(c) for c in parts)
        if smallest >= min_size:
            return [np.sort(np.asarray(c, dtype=np.int64)) for c in parts]
        best = max(best, smallest)
    raise PartitionError(
        f"partition.min_size = {min_size}: no Dirichlet(alpha = {alpha}) draw over {num_clients} "
        f"clients gave every client that many samples ({tries} draws in "
        f"{time.monotonic() - start:.0f} s; the best draw's smallest client had {best}); "
        f"lower partition.min_size or raise partition.alpha"
    )


def make(labels: np.ndarray, setting: dict, groups=None) -> list[np.ndarray]:
    rng = np.random.default_rng(setting["seed"])
    if setting.get("long_tail_rho", 1) != 1:
        return long_tailed(labels, setting, rng, make)
    return split(labels, setting["num_clients"], rng, setting["alpha"], setting["min_size"], setting["balance"])
