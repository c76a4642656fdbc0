"""Synthetic(alpha, beta), generated, following the recipe of FedProx's generator (specs/fednova.md
4.1): 30 users, 60 features, 10 classes, user sizes lognormal(4, 2) + 50 ("power law"), each user
split 90/10 into train/test. It is generated from a fixed seed so every clone gets the same data;
its clients are its users, so it is partitioned with ``partition.kind: natural``.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedrepro.partitions.base import PartitionError

# Synthetic(alpha, beta): name -> (alpha, beta). The generation seed is fixed: the data is part of
# the benchmark, not of a run, and FedProx's own script set none (so no seed is "the paper's").
SYNTHETIC = {"synthetic_1_1": (1.0, 1.0), "synthetic_0_0": (0.0, 0.0)}
SYNTHETIC_SEED = 0
SYNTHETIC_USERS, SYNTHETIC_DIM, SYNTHETIC_CLASSES = 30, 60, 10
SYNTHETIC_FILE = "synthetic.npz"


def download(dataset: str, root: str | Path, mirrors=None, timeout: float = 0.0, log=print) -> Path:
    """Generate ``dataset`` into ``root`` (nothing to fetch); return ``root``. Idempotent."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / SYNTHETIC_FILE
    if not path.exists():
        alpha, beta = SYNTHETIC[dataset]
        write_synthetic(path, alpha, beta, SYNTHETIC_SEED)
        log(f"{dataset}: generated (alpha={alpha}, beta={beta}, seed={SYNTHETIC_SEED})")
    return root


@dataclass
class FeatureDataset:
    """Float feature vectors (Synthetic): batches are index gathers, nothing to normalise."""

    features: torch.Tensor
    labels: torch.Tensor
    groups: torch.Tensor | None = None  # the user each sample belongs to
    augment = False
    batched_cohort = True

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.features[index], self.labels[index]

    def to(self, device) -> "FeatureDataset":
        return FeatureDataset(
            self.features.to(device), self.labels.to(device), None if self.groups is None else self.groups.to(device)
        )

    def subset(self, index: torch.Tensor) -> "FeatureDataset":
        return FeatureDataset(
            self.features[index], self.labels[index], None if self.groups is None else self.groups[index]
        )


def load(
    dataset: str, root: str | Path, train: bool, preprocess: dict | None = None, pretrained: dict | None = None
) -> FeatureDataset:
    with np.load(Path(root) / SYNTHETIC_FILE) as data:
        split = "train" if train else "test"
        return FeatureDataset(
            torch.from_numpy(data[f"x_{split}"]),
            torch.from_numpy(data[f"y_{split}"]),
            torch.from_numpy(data[f"user_{split}"]),
        )


def train_groups(dataset: str, root: str | Path) -> np.ndarray:
    """The natural client (user) of every training sample, for ``partition.kind: natural``."""
    if dataset not in SYNTHETIC:
        raise PartitionError(f"dataset '{dataset}' has no natural clients; use partition kind iid, dirichlet or shards")
    with np.load(Path(root) / SYNTHETIC_FILE) as data:
        return data["user_train"].copy()


def generate_synthetic(
    alpha: float,
    beta: float,
    seed: int,
    num_users: int = SYNTHETIC_USERS,
    dim: int = SYNTHETIC_DIM,
    num_classes: int = SYNTHETIC_CLASSES,
):
    """Per user i: u_i ~ N(0, alpha), W_i, b_i ~ N(u_i, 1); B_i ~ N(0, beta), v_i ~ N(B_i, 1)^dim;
    x ~ N(v_i, diag(j^-1.2)); y = argmax(x W_i + b_i). Sizes lognormal(4, 2) + 50.
    Returns per-user (x, y) arrays (FedProx's recipe, written from its description)."""
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4, 2, num_users).astype(int) + 50
    u = rng.normal(0, alpha, num_users)
    b_centre = rng.normal(0, beta, num_users)
    cov_diag = np.arange(1, dim + 1, dtype=np.float64) ** -1.2
    users = []
    for i in range(num_users):
        v = rng.normal(b_centre[i], 1, dim)
        w = rng.normal(u[i], 1, (dim, num_classes))
        b = rng.normal(u[i], 1, num_classes)
        # diagonal covariance: independent normals with std sqrt(j^-1.2)
        x = v + rng.standard_normal((sizes[i], dim)) * np.sqrt(cov_diag)
        y = np.argmax(x @ w + b, axis=1)
        users.append((x.astype(np.float32), y.astype(np.int64)))
    return users


def write_synthetic(path: Path, alpha: float, beta: float, seed: int) -> None:
    """Shuffle each user and split it 90/10 into train/test (as FedProx does); write atomically."""
    rng = np.random.default_rng([seed, 1])
    parts = {k: [] for k in ("x_train", "y_train", "user_train", "x_test", "y_test", "user_test")}
    for user, (x, y) in enumerate(generate_synthetic(alpha, beta, seed)):
        order = rng.permutation(len(y))
        n_train = int(0.9 * len(y))
        for split, idx in (("train", order[:n_train]), ("test", order[n_train:])):
            parts[f"x_{split}"].append(x[idx])
            parts[f"y_{split}"].append(y[idx])
            parts[f"user_{split}"].append(np.full(len(idx), user, dtype=np.int64))
    arrays = {k: np.concatenate(v) for k, v in parts.items()}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".npz")
    os.close(fd)
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)
