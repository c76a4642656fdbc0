"""CIFAR-100's Pachinko allocation: alpha over coarse labels, beta over each one's fine labels."""

from __future__ import annotations

import numpy as np

from fedrepro.partitions.base import PartitionError, draw

# CIFAR-100's superclass of each fine label (fine labels in torchvision's order, i.e. the archive's
# alphabetical ``fine_label_names``; superclasses in the order of its ``coarse_label_names``). It is
# the fine->coarse map that the archive's per-sample ``coarse_labels`` encode, and agrees with the
# superclass table of https://www.cs.toronto.edu/~kriz/cifar.html (tests/inputs/test_pachinko.py checks it
# name by name). torchvision's CIFAR100 loader keeps the fine labels only, so the map lives here.
CIFAR100_COARSE = np.array(
    [
        4,
        1,
        14,
        8,
        0,
        6,
        7,
        7,
        18,
        3,
        3,
        14,
        9,
        18,
        7,
        11,
        3,
        9,
        7,
        11,
        6,
        11,
        5,
        10,
        7,
        6,
        13,
        15,
        3,
        15,
        0,
        11,
        1,
        10,
        12,
        14,
        16,
        9,
        11,
        5,
        5,
        19,
        8,
        8,
        15,
        13,
        14,
        17,
        18,
        10,
        16,
        4,
        17,
        4,
        2,
        0,
        17,
        4,
        18,
        17,
        10,
        3,
        2,
        12,
        12,
        16,
        12,
        1,
        9,
        19,
        2,
        10,
        0,
        1,
        16,
        12,
        9,
        13,
        15,
        13,
        16,
        19,
        2,
        4,
        6,
        19,
        5,
        5,
        8,
        19,
        18,
        1,
        2,
        15,
        6,
        0,
        17,
        8,
        14,
        13,
    ],
    dtype=np.int64,
)


def split(
    labels: np.ndarray,
    coarse: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha: float,
    beta: float,
    samples_per_client: int | None = None,
) -> list[np.ndarray]:
    """Pachinko allocation (Reddi et al. 2021, App. C; TFF's federated CIFAR-100), as IMA's "+PA".

    Client by client: theta ~ Dir_C(alpha) over the C coarse labels and, for every coarse label c,
    phi_c ~ Dir(beta) over its fine labels. Each of the client's samples draws c ~ theta, then a fine
    label f ~ phi_c, then an unused sample of label f uniformly at random (without replacement).
    When f runs out it is dropped from every client's phi_c and phi_c is renormalised (TFF); when all
    fine labels of c have run out, c is dropped from theta and theta renormalised (nothing is left to
    draw under it). Clients are filled in order, so the last ones see the most exhausted labels, as in
    TFF's generation. ``samples_per_client`` defaults to len(labels) // num_clients (IMA: K = 100
    clients on 50,000 images, so 500 each; TFF: 500 clients of 100).
    """
    labels, coarse = np.asarray(labels), np.asarray(coarse)
    n = len(labels)
    per = n // num_clients if samples_per_client is None else samples_per_client
    if per < 1 or per * num_clients > n:
        raise PartitionError(
            f"pachinko: {num_clients} clients x {per} samples need {num_clients * per} samples, the dataset has {n}"
        )
    fine_ids = np.unique(labels)
    parent = {}
    for f in fine_ids:
        cs = np.unique(coarse[labels == f])
        if len(cs) != 1:
            raise PartitionError(
                f"pachinko: fine label {f} falls under coarse labels {cs.tolist()}; "
                "each fine label needs exactly one coarse label"
            )
        parent[int(f)] = int(cs[0])
    coarse_ids = sorted(set(parent.values()))
    children = [np.array([f for f in fine_ids if parent[int(f)] == c]) for c in coarse_ids]
    # One shuffled pool per fine label; popping from its end draws uniformly without replacement.
    pools = {int(f): rng.permutation(np.flatnonzero(labels == f)).tolist() for f in fine_ids}
    fine_alive = [np.ones(len(ch), dtype=bool) for ch in children]
    coarse_alive = np.ones(len(coarse_ids), dtype=bool)
    parts = []
    for _ in range(num_clients):
        theta = rng.dirichlet(np.full(len(coarse_ids), alpha))
        phi = [rng.dirichlet(np.full(len(ch), beta)) for ch in children]
        taken = []
        for _ in range(per):
            c = draw(theta, coarse_alive, rng)
            j = draw(phi[c], fine_alive[c], rng)
            pool = pools[int(children[c][j])]
            taken.append(pool.pop())
            if not pool:
                fine_alive[c][j] = False
                coarse_alive[c] = fine_alive[c].any()
        parts.append(np.sort(np.asarray(taken, dtype=np.int64)))
    return parts


def make(labels: np.ndarray, setting: dict, groups=None) -> list[np.ndarray]:
    # CIFAR-100 only (the settings refuse other datasets): coarse labels from the fixed map
    return split(
        labels,
        CIFAR100_COARSE[labels],
        setting["num_clients"],
        np.random.default_rng(setting["seed"]),
        setting["alpha"],
        setting["beta"],
        setting.get("samples_per_client"),
    )
