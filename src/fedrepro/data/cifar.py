"""CIFAR-10/100: torchvision's own archive and reader, and each paper's preprocessing.

CIFAR: the python-pickle ``.tar.gz`` is fetched from a list of mirrors (URL prefixes or local
folders) into a temporary name, checked against torchvision's md5, renamed into place, then
extracted member by member after checking that no member leaves the dataset folder. Loading goes
through ``torchvision.datasets.CIFAR10/100`` (which re-checks every batch file's md5) and yields
uint8 NCHW tensors; normalisation and augmentation happen on the device, per batch.

Preprocessing differs by paper, so it is a setting (``preprocess``), not a property of the data:

==========  ==========================================  ==========================================
paper       normalize                                   augment
==========  ==========================================  ==========================================
IMA         ``ima``  (0.491,0.482,0.447)/(0.247,0.243,   none ("no data augmentation anywhere")
            0.262)
FedLAW      ``half`` (0.5, 0.5)                          none
FedAWARE    C10: ``cifar_fednova`` (0.4914,0.4822,      C10: ``crop_flip_static`` -- the code
            0.4465)/(0.2023,0.1994,0.2010);             transforms once at preprocessing (FedLab
            C100: ``half``                              stores transformed tensors); C100: none
FedNova     ``cifar_fednova``                           ``crop_flip`` (per batch, every epoch)
==========  ==========================================  ==========================================
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedrepro.data.base import DownloadError, fetch_from_mirrors, not_downloaded

CIFAR = {"cifar10": "CIFAR10", "cifar100": "CIFAR100"}

DEFAULT_MIRRORS = {
    "cifar10": ["https://www.cs.toronto.edu/~kriz/"],
    "cifar100": ["https://www.cs.toronto.edu/~kriz/"],
}

HOW_TO_GET_OFFLINE = (
    "Without internet: copy the archive ({filename}, md5 {md5}) into a folder and list that "
    "folder first under data.mirrors.{dataset} in the params file."
)

# Per-channel (mean, std) of each paper's transform; see the table in the module docstring.
NORMALIZE = {
    "none": ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
    "half": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "ima": ((0.491, 0.482, 0.447), (0.247, 0.243, 0.262)),
    "cifar_fednova": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
}
AUGMENT = ("none", "crop_flip", "crop_flip_static")

# Published sizes of the CIFAR archives: a download stops there (base.fetch_from_mirrors)
ARCHIVE_BYTES = {"cifar10": 170498071, "cifar100": 169001437}


def _cifar_class(dataset: str):
    import torchvision.datasets as tvd

    return getattr(tvd, CIFAR[dataset])


def safe_extract(archive: Path, dest: Path) -> None:
    """Extract a tar archive, refusing members that would land outside ``dest`` or are not plain
    files or folders (links, devices): an archive from a mirror is untrusted input."""
    dest = dest.resolve()
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for member in members:
            target = (dest / member.name).resolve()
            if target != dest and dest not in target.parents:
                raise DownloadError(f"{archive.name}: member '{member.name}' would be written outside {dest}")
            if not (member.isfile() or member.isdir()):
                raise DownloadError(f"{archive.name}: member '{member.name}' is a link or special file")
        tar.extractall(dest, members=members)


def download(
    dataset: str, root: str | Path, mirrors: list[str] | None = None, timeout: float = 20.0, log=print
) -> Path:
    """Fetch ``dataset``'s archive into ``root`` and extract it; return ``root``. Idempotent."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    from torchvision.datasets.utils import check_integrity

    cls = _cifar_class(dataset)
    archive = root / cls.filename
    if not check_integrity(str(archive), cls.tgz_md5):
        fetch_from_mirrors(
            cls.filename,
            archive,
            list(mirrors or DEFAULT_MIRRORS[dataset]),
            lambda p: check_integrity(str(p), cls.tgz_md5),
            timeout,
            log,
            f"{cls.filename} of '{dataset}'",
            HOW_TO_GET_OFFLINE.format(filename=cls.filename, md5=cls.tgz_md5, dataset=dataset),
            ARCHIVE_BYTES[dataset],
        )
    if not _extracted_ok(cls, root):
        # Extract into a scratch folder and move the result in, so a half-extracted folder never
        # looks complete.
        scratch = Path(tempfile.mkdtemp(dir=root, prefix=".extract."))
        try:
            safe_extract(archive, scratch)
            final = root / cls.base_folder
            if final.exists():
                shutil.rmtree(final)
            os.replace(scratch / cls.base_folder, final)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if not _extracted_ok(cls, root):
            raise DownloadError(f"{archive}: extracted files fail torchvision's checksums")
    return root


def _extracted_ok(cls, root: Path) -> bool:
    from torchvision.datasets.utils import check_integrity

    folder = root / cls.base_folder
    files = list(cls.train_list) + list(cls.test_list) + [[cls.meta["filename"], cls.meta["md5"]]]
    return all(check_integrity(str(folder / name), md5) for name, md5 in files)


# --------------------------------------------------------------------------- device datasets


@dataclass
class ImageDataset:
    """A whole split on one device, uint8 NCHW; per-channel normalisation and the paper's
    augmentation (random 32x32 crop of the 4-padded image, horizontal flip) are applied per batch.

    Augmentation draws from the device's global RNG (seeded by the run): a resumed run draws
    other crops than an uninterrupted one, which changes nothing a report compares.
    """

    images: torch.Tensor
    labels: torch.Tensor
    mean: torch.Tensor = field(default_factory=lambda: torch.zeros(3))
    std: torch.Tensor = field(default_factory=lambda: torch.ones(3))
    augment: bool = False
    pad: int = 4
    batched_cohort = True

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.images[index]
        if self.augment:
            x = random_crop_flip(x, self.pad)
        return self._normalised(x), self.labels[index]

    def _normalised(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32).div_(255.0)
        return x.sub_(self.mean.view(-1, 1, 1)).div_(self.std.view(-1, 1, 1))

    def augment_draws(self, n: int) -> tuple[torch.Tensor, ...]:
        """The random numbers ``batch`` draws for a batch of n, drawn now (the batched path draws each
        client's ahead, in the order the clients trained one after another would draw them)."""
        return crop_flip_draws(n, self.pad, self.images.device)

    def batch_drawn(
        self, index: torch.Tensor, draws: list[tuple[torch.Tensor, ...]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch`` of a (K, b) index, row k cropped and flipped by ``draws[k]`` instead of new draws."""
        k, b = index.shape
        dy, dx, flip = (torch.cat(parts) for parts in zip(*draws))
        x = crop_flip(self.images[index.reshape(-1)], dy, dx, flip, self.pad)
        return self._normalised(x).view(k, b, *x.shape[1:]), self.labels[index]

    def to(self, device) -> "ImageDataset":
        return ImageDataset(
            self.images.to(device),
            self.labels.to(device),
            self.mean.to(device),
            self.std.to(device),
            self.augment,
            self.pad,
        )

    def subset(self, index: torch.Tensor) -> "ImageDataset":
        return ImageDataset(self.images[index], self.labels[index], self.mean, self.std, self.augment, self.pad)


def random_crop_flip(x: torch.Tensor, pad: int = 4, generator: torch.Generator | None = None) -> torch.Tensor:
    """torchvision's RandomCrop(side, padding=pad) + RandomHorizontalFlip, batched on the device:
    one gather per batch instead of a Python loop over images."""
    return crop_flip(x, *crop_flip_draws(len(x), pad, x.device, generator), pad)


def crop_flip_draws(n: int, pad: int, device, generator: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:
    """The offsets and flips of n crops, in the order ``random_crop_flip`` has always drawn them."""
    dy = torch.randint(0, 2 * pad + 1, (n,), device=device, generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n,), device=device, generator=generator)
    flip = torch.rand(n, device=device, generator=generator) < 0.5
    return dy, dx, flip


def crop_flip(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, flip: torch.Tensor, pad: int = 4) -> torch.Tensor:
    """Each image padded by ``pad``, cropped at (dy, dx) to its size and mirrored where ``flip``."""
    n, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    rows = dy[:, None] + torch.arange(h, device=x.device)[None, :]  # n x h
    cols = dx[:, None] + torch.arange(w, device=x.device)[None, :]  # n x w
    cols = torch.where(flip[:, None], cols.flip(1), cols)
    out = padded[
        torch.arange(n, device=x.device)[:, None, None, None],
        torch.arange(c, device=x.device)[None, :, None, None],
        rows[:, None, :, None],
        cols[:, None, None, :],
    ]
    return out


def load(
    dataset: str, root: str | Path, train: bool, preprocess: dict | None = None, pretrained: dict | None = None
) -> ImageDataset:
    preprocess = dict(preprocess or {})
    if dataset in CIFAR:
        try:
            ds = _cifar_class(dataset)(str(root), train=train, download=False)
        except RuntimeError as err:  # torchvision's "Dataset not found or corrupted"
            raise not_downloaded(dataset, root, err) from None
        images = torch.from_numpy(np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2)))
        labels = torch.as_tensor(ds.targets, dtype=torch.int64)
        mean, std = NORMALIZE[preprocess.get("normalize", "none")]
        augment = preprocess.get("augment", "none") if train else "none"
        if augment not in AUGMENT:
            raise ValueError(f"unknown augmentation '{augment}'; known: {', '.join(AUGMENT)}")
        if augment == "crop_flip_static":
            # FedAWARE's code transforms the training set once, at preprocessing time.
            gen = torch.Generator().manual_seed(int(preprocess.get("augment_seed", 0)))
            images = random_crop_flip(images, 4, gen)
        return ImageDataset(images, labels, torch.tensor(mean), torch.tensor(std), augment == "crop_flip")
    raise ValueError(f"unknown dataset '{dataset}'")
