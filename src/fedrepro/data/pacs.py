"""PACS (IMA's label + feature skew): photo, art_painting, cartoon, sketch; 7 classes; the folder-of-images
layout of the PACS "kfold" release, which IMA's code reads with torchvision's ImageFolder:

    <root>/<photo|art_painting|cartoon|sketch>/<class>/<image>.jpg|.jpeg|.png

(``<root>``: the params file's ``data.root``/pacs, as for every dataset).

Classes are the sorted class folder names (ImageFolder's rule: dog, elephant, giraffe, guitar, horse,
house, person), images the sorted file names in each. There is no official train/test split in that
layout: as IMA's code, each domain keeps a random 10% as its test set, drawn by numpy's legacy
generator seeded once with 1 and shuffling the domains' index lists in the order above (the code's
np.random.seed(1) followed by np.random.shuffle per domain), so the split is the code's own.
Preprocessing as the code: Resize(256) (shorter side), CenterCrop(224), ImageNet's per-channel
normalisation; no augmentation. Images are decoded at load and kept as uint8 (about 1.5 GB for the
9,991 images).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedrepro.data.base import DataError
from fedrepro.data.domains import DomainDataset, concatenate, missing

DATASET = "pacs"
DOMAINS = ("photo", "art_painting", "cartoon", "sketch")
CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")
EXTENSIONS = (".jpg", ".jpeg", ".png")
TEST_FRACTION, SPLIT_SEED = 0.1, 1
RESIZE, CROP = 256, 224
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def folder(root: str | Path) -> Path:
    return Path(root)


def domain_files(root: str | Path, name: str) -> tuple[list[Path], np.ndarray]:
    """A domain's image files and labels in ImageFolder's order; a missing or empty folder is an error."""
    paths, labels = [], []
    for label, cls in enumerate(CLASSES):
        where = folder(root) / name / cls
        if not where.is_dir():
            raise missing(DATASET, where)
        images = sorted(p for p in where.iterdir() if p.suffix.lower() in EXTENSIONS)
        if not images:
            raise DataError(f"{where}: no .jpg/.jpeg/.png images; see docs/datasets.md for the layout")
        paths += images
        labels += [label] * len(images)
    return paths, np.asarray(labels, dtype=np.int64)


def test_split(sizes: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) positions of each domain: the first 10% of a shuffled index list are its test set."""
    rng = np.random.RandomState(SPLIT_SEED)
    out = []
    for n in sizes:
        order = list(range(n))
        rng.shuffle(order)
        cut = int(TEST_FRACTION * n)
        out.append((np.asarray(order[cut:], dtype=np.int64), np.asarray(order[:cut], dtype=np.int64)))
    return out


def download(dataset: str, root: str | Path, mirrors=None, timeout: float = 0.0, log=print) -> Path:
    """Nothing is fetched: check that every domain has every class folder with images; return the folder."""
    count = sum(len(domain_files(root, name)[0]) for name in DOMAINS)
    log(f"{DATASET}: {count} images present in {folder(root)}")
    return folder(root)


def decode(path: Path) -> np.ndarray:
    """224 x 224 x 3 uint8: torchvision's Resize(256) then CenterCrop(224) of the RGB image."""
    from PIL import Image
    from torchvision.transforms import functional as F

    try:
        with Image.open(path) as image:
            picture = F.center_crop(F.resize(image.convert("RGB"), RESIZE), CROP)
    except OSError as err:
        raise DataError(f"{path}: not a readable image ({err})") from None
    return np.asarray(picture, dtype=np.uint8)


def _split(root, train: bool):
    files = [domain_files(root, name) for name in DOMAINS]
    splits = test_split([len(labels) for _, labels in files])
    for (paths, labels), (train_at, test_at) in zip(files, splits):
        yield paths, labels, (train_at if train else test_at)


def load(
    dataset: str, root: str | Path, train: bool, preprocess: dict | None = None, pretrained: dict | None = None
) -> DomainDataset:
    domains = [
        (np.stack([decode(paths[i]) for i in at]) if len(at) else np.zeros((0, CROP, CROP, 3), np.uint8), labels[at])
        for paths, labels, at in _split(root, train)
    ]
    return concatenate(domains, DOMAINS, *IMAGENET)


def train_labels(dataset: str, root: str | Path) -> np.ndarray:
    """The training labels in load's order, without decoding the images."""
    return np.concatenate([labels[at] for _, labels, at in _split(root, True)])


def train_domains(dataset: str, root: str | Path) -> np.ndarray:
    return np.concatenate([np.full(len(at), d) for d, (_, _, at) in enumerate(_split(root, True))])
