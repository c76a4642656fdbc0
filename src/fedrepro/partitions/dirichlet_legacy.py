"""Dirichlet over labels drawn with numpy's legacy generator: FedNova's code's exact client sets.

FedNova's code (JYWa/FedNova, util_v4.py ``DataPartitioner.__getDirichletData__``) follows the NIID-Bench
recipe of ``dirichlet`` (balance rule, redrawn until every client holds 10 samples) but draws it after
``np.random.seed(2020)`` from numpy's global ``RandomState``: in-place shuffles and ``dirichlet`` of the legacy
Mersenne-Twister stream. ``numpy.random.RandomState(seed)`` is that stream (``permutation`` copies then shuffles
exactly as ``shuffle`` does), so ``dirichlet.split`` given it draws the code's sets; ``dirichlet`` itself draws
with ``default_rng`` (PCG64), the same recipe on another stream. A kind of its own, so that every ``dirichlet``
partition keeps its id (a partition id hashes its kind's code)."""

from __future__ import annotations

import numpy as np

from fedrepro.partitions.dirichlet import split


def make(labels: np.ndarray, setting: dict, groups=None) -> list[np.ndarray]:
    rng = np.random.RandomState(setting["seed"])
    return split(labels, setting["num_clients"], rng, setting["alpha"], setting["min_size"], setting["balance"])
