"""What the multi-domain families (digit5, pacs) share: a split that knows each sample's domain.

IMA's feature-skew datasets (Digit-Five, PACS) are several datasets side by side; a split concatenates
their samples in the domain order of the family, and ``domain`` says where each sample came from: the
partition splits each domain over its own clients, and the evaluation scores each domain's test set and
averages the domains (``evaluation.score``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedrepro.data.base import DataError, gather

DATASETS_DOC = "docs/datasets.md"


@dataclass
class DomainDataset:
    """uint8 NCHW images of several domains on one device, normalised per batch (no augmentation:
    IMA's code has none); ``domain`` holds each sample's index into ``domain_names``."""

    images: torch.Tensor
    labels: torch.Tensor
    domain: torch.Tensor
    domain_names: tuple[str, ...]
    mean: torch.Tensor = field(default_factory=lambda: torch.full((3,), 0.5))
    std: torch.Tensor = field(default_factory=lambda: torch.full((3,), 0.5))
    augment = False
    batched_cohort = True

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = gather(self.images, index).to(torch.float32).div_(255.0)
        shape = (1,) * (x.dim() - 3) + (-1, 1, 1)
        x = x.sub_(self.mean.view(shape)).div_(self.std.view(shape))
        return x, gather(self.labels, index)

    def to(self, device) -> "DomainDataset":
        return DomainDataset(
            self.images.to(device),
            self.labels.to(device),
            self.domain.to(device),
            self.domain_names,
            self.mean.to(device),
            self.std.to(device),
        )

    def subset(self, index: torch.Tensor) -> "DomainDataset":
        return DomainDataset(
            self.images[index], self.labels[index], self.domain[index], self.domain_names, self.mean, self.std
        )


def concatenate(
    splits: list[tuple[np.ndarray, np.ndarray]], names: tuple[str, ...], mean: tuple[float, ...], std: tuple[float, ...]
) -> DomainDataset:
    """One split from the domains' (uint8 NHWC images, labels), in ``names``' order."""
    images = torch.from_numpy(np.ascontiguousarray(np.concatenate([x for x, _ in splits]).transpose(0, 3, 1, 2)))
    labels = torch.from_numpy(np.concatenate([y for _, y in splits]).astype(np.int64))
    domain = torch.from_numpy(np.concatenate([np.full(len(y), d, dtype=np.int64) for d, (_, y) in enumerate(splits)]))
    return DomainDataset(images, labels, domain, tuple(names), torch.tensor(mean), torch.tensor(std))


def missing(dataset: str, path: Path) -> DataError:
    """The one-line error for a file the family needs and cannot find (nothing can be downloaded)."""
    return DataError(
        f"{path}: missing; {dataset} cannot be downloaded here, see {DATASETS_DOC} for where to get "
        f"it and where to put it"
    )
