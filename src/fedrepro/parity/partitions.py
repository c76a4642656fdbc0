"""Does fedrepro draw the code's clients? FedNova's code splits CIFAR-10 over its ranks with
``DataPartitioner(..., isNonIID=True, alpha)`` (util_v4.py: Dirichlet over labels after np.random.seed(2020));
the harness calls it, unchanged, on generated labels in CIFAR-10's layout (5,000 of each of 10 classes, in a
seeded random order) and compares its client sets with fedrepro's ``dirichlet_legacy`` and ``dirichlet`` kinds."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from fedrepro import partitions
from fedrepro.parity.shim import checkout_on_path


def generated_labels(per_class: int = 5000, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), per_class))


def fednova_code_clients(checkout, labels: np.ndarray, num_clients: int, alpha: float) -> list[np.ndarray]:
    """The code's client index lists (sorted), from its own DataPartitioner; its mpi4py import and the
    ``LogisticRegression`` its HEAD imports but does not define are placeholders (shim)."""
    with checkout_on_path(checkout, stubs=("mpi4py",), placeholders={"models": ["LogisticRegression"]}):
        import util_v4
    data = SimpleNamespace(train_labels=labels.tolist())
    split = util_v4.DataPartitioner(data, [1.0 / num_clients] * num_clients, isNonIID=True, alpha=alpha)
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in split.partitions]


def compare_fednova(checkout, num_clients: int = 16, alpha: float = 0.1) -> list[dict]:
    labels = generated_labels()
    code = fednova_code_clients(checkout, labels, num_clients, alpha)
    rows = []
    for kind in ("dirichlet_legacy", "dirichlet"):
        ours = partitions.make(
            labels,
            {"kind": kind, "seed": 2020, "alpha": alpha, "min_size": 10, "balance": True, "num_clients": num_clients},
        )
        same = sum(np.array_equal(a, b) for a, b in zip(code, ours))
        rows.append(
            {
                "dataset": "cifar10",
                "check": f"partition kind {kind}, seed 2020, Dir({alpha:g}), "
                f"{num_clients} clients, generated CIFAR-10 labels",
                "clients_equal": int(same),
                "clients": num_clients,
                "status": "equal" if same == num_clients else "differs",
            }
        )
    return rows
