"""What every partition kind shares: the error, the helpers of splitting (a long-tailed subset, a multi-domain
dataset split domain by domain, a draw among the labels left), and the counts and content hash of a split.

Every partitioner takes the labels and a local ``numpy.random.Generator`` (never the global RNG) and returns
one sorted index array per client.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fedrepro.errors import FedreproError


class PartitionError(FedreproError, RuntimeError):
    """A partition that cannot be made or read; the message names the setting or the file."""


def per_domain(labels: np.ndarray, setting: dict, domains: np.ndarray, make) -> list[np.ndarray]:
    """IMA's feature-skew split: each domain's samples over its own num_clients / D clients, drawn with the
    setting's kind and seed (the same seed in every domain, as IMA's code seeds each domain's partitioner);
    clients are numbered domain by domain (IMA's code assigns domains to client ids at random, which changes
    nothing when cohorts are drawn uniformly). Indices are the whole training set's."""
    names = np.unique(domains)
    per, rest = divmod(setting["num_clients"], len(names))
    if rest or not per:
        raise PartitionError(
            f"num_clients = {setting['num_clients']} must be a positive multiple of the "
            f"{len(names)} domains of {setting.get('dataset')}"
        )
    inner = {**setting, "num_clients": per}
    parts = []
    for d in names:
        at = np.flatnonzero(domains == d)
        parts += [at[p] for p in make(labels[at], inner)]
    return parts


def draw(p: np.ndarray, alive: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from p restricted to ``alive`` and renormalised. Dir(0.1) can put all of a client's
    mass (to float precision) on labels that have run out; then the remaining labels are equally likely."""
    w = np.where(alive, p, 0.0)
    total = w.sum()
    if not total > 0:
        w, total = alive.astype(float), float(alive.sum())
    i = int(np.searchsorted(np.cumsum(w), rng.random() * total, side="right"))
    # side="right" never lands on a zero weight; only rounding can push past the end.
    return i if i < len(w) else int(np.flatnonzero(w > 0)[-1])


def long_tail_counts(class_sizes: np.ndarray, rho: float) -> np.ndarray:
    """Class c of C keeps floor(N_c rho^(-c/(C-1))) samples: class 0 all of them, the last a rho-th
    (FedLAW's code's long-tailed CIFAR; Cao et al. 2019's exponential profile)."""
    c = len(class_sizes)
    keep = class_sizes * rho ** (-np.arange(c) / max(c - 1, 1))
    return np.floor(keep + 1e-9).astype(int)


def long_tailed(labels: np.ndarray, setting: dict, rng: np.random.Generator, split) -> list[np.ndarray]:
    """Keep a long-tailed subset of the training set (drawn by the partition seed), then split only it
    with ``split`` (the setting's kind); the indices returned are the training set's."""
    classes = int(labels.max()) + 1
    keep = long_tail_counts(np.bincount(labels, minlength=classes), setting["long_tail_rho"])
    kept = np.sort(np.concatenate([rng.permutation(np.flatnonzero(labels == c))[: keep[c]] for c in range(classes)]))
    inner = {k: v for k, v in setting.items() if k != "long_tail_rho"}
    return [kept[part] for part in split(labels[kept], inner)]


def class_counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


def content_hash(parts: list[np.ndarray]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(np.asarray(part, dtype=np.int64).tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:16]
