"""Digit-Five (IMA's "Digit Five", label + feature skew): MNIST, SVHN, USPS, SynthDigits and MNIST-M as
FedBN distributes them (the files IMA's code reads), one folder per domain under the dataset's root
(the params file's ``data.root``/digit5, as for every dataset):

    <root>/<MNIST|SVHN|USPS|SynthDigits|MNIST_M>/partitions/train_part0.pkl .. train_part9.pkl
    <root>/<...>/test.pkl

each file a pickled pair (uint8 images N x H x W or N x H x W x 3, labels N). The training split of a
domain is its ten parts in order (IMA's code reads them all: percent = 1), the test split its test.pkl.
Preprocessing as IMA's code: every image resized to 28 x 28 (PIL bilinear, torchvision's Resize on a PIL
image), grey images repeated to 3 channels, Normalize(0.5, 0.5) per channel; no augmentation.
The files are pickles: load only copies from a source you trust.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from fedrepro.data.base import DataError
from fedrepro.data.domains import DomainDataset, concatenate, missing

DATASET = "digit5"
# IMA's code's domain order (and FedBN's folder names); metrics.csv names the domains by these
DOMAINS = ("MNIST", "SVHN", "USPS", "SynthDigits", "MNIST_M")
TRAIN_PARTS = 10
SIDE = 28


def folder(root: str | Path) -> Path:
    return Path(root)


def files(root: str | Path) -> list[Path]:
    """Every file the family reads, domain by domain."""
    out = []
    for name in DOMAINS:
        out += [folder(root) / name / "partitions" / f"train_part{i}.pkl" for i in range(TRAIN_PARTS)]
        out.append(folder(root) / name / "test.pkl")
    return out


def download(dataset: str, root: str | Path, mirrors=None, timeout: float = 0.0, log=print) -> Path:
    """Nothing is fetched (no licence-clean mirror): check that every file is in place; return the folder."""
    for path in files(root):
        if not path.is_file():
            raise missing(DATASET, path)
    log(f"{DATASET}: {len(files(root))} files present in {folder(root)}")
    return folder(root)


def read_pair(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One FedBN file: (uint8 images N x H x W [x 3], integer labels N)."""
    if not path.is_file():
        raise missing(DATASET, path)
    try:
        with open(path, "rb") as fh:
            images, labels = pickle.load(fh)
        images, labels = np.asarray(images), np.asarray(labels).reshape(-1)
    except Exception as err:  # noqa: BLE001 - UnpicklingError, ValueError (not a pair), EOFError
        raise DataError(f"{path}: not a pickled (images, labels) pair ({type(err).__name__}: {err})") from None
    if images.dtype != np.uint8 or images.ndim not in (3, 4) or len(images) != len(labels):
        raise DataError(
            f"{path}: images must be uint8 N x H x W [x C] with one label each; found "
            f"{images.dtype} {images.shape} and {len(labels)} labels"
        )
    return images, labels.astype(np.int64)


def to_rgb28(images: np.ndarray) -> np.ndarray:
    """N x 28 x 28 x 3 uint8: PIL's bilinear resize (as torchvision's Resize([28, 28])), grey to RGB."""
    from PIL import Image

    if images.ndim == 4 and images.shape[-1] == 1:
        images = images[..., 0]
    out = np.empty((len(images), SIDE, SIDE, 3), dtype=np.uint8)
    for i, image in enumerate(images):
        picture = Image.fromarray(image, mode="L" if image.ndim == 2 else "RGB")
        if picture.size != (SIDE, SIDE):
            picture = picture.resize((SIDE, SIDE), Image.BILINEAR)
        out[i] = np.asarray(picture.convert("RGB"))
    return out


def read_domain(root: str | Path, name: str, train: bool) -> tuple[np.ndarray, np.ndarray]:
    base = folder(root) / name
    paths = [base / "partitions" / f"train_part{i}.pkl" for i in range(TRAIN_PARTS)] if train else [base / "test.pkl"]
    pairs = [read_pair(p) for p in paths]
    return to_rgb28(np.concatenate([x for x, _ in pairs])), np.concatenate([y for _, y in pairs])


def load(
    dataset: str, root: str | Path, train: bool, preprocess: dict | None = None, pretrained: dict | None = None
) -> DomainDataset:
    return concatenate([read_domain(root, name, train) for name in DOMAINS], DOMAINS, (0.5,) * 3, (0.5,) * 3)


def train_labels(dataset: str, root: str | Path) -> np.ndarray:
    """The training labels in load's order, without decoding the images."""
    return np.concatenate(
        [
            read_pair(folder(root) / name / "partitions" / f"train_part{i}.pkl")[1]
            for name in DOMAINS
            for i in range(TRAIN_PARTS)
        ]
    )


def train_domains(dataset: str, root: str | Path) -> np.ndarray:
    """Each training sample's domain index, in load's order."""
    return np.concatenate(
        [
            np.full(len(read_pair(folder(root) / name / "partitions" / f"train_part{i}.pkl")[1]), d)
            for d, name in enumerate(DOMAINS)
            for i in range(TRAIN_PARTS)
        ]
    )
