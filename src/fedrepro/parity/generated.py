"""Small data sets written in the real on-disk formats, for the data-pipeline check: torchvision's
``cifar-10-batches-py`` and ``cifar-100-python`` pickles (latin1-decodable dicts, N x 3072 channel-major rows) and
Fashion-MNIST's idx files under ``FashionMNIST/raw``, random pixels and every class present. Both programs read them
through torchvision's own readers, so what is compared is what each does after reading.

Two things stand between an authors' code and these files, and the shim (``on_generated``) handles both without
touching the code: torchvision checks a CIFAR batch file's md5 against the published archive's (the generated
files' md5 are set on the classes), and each code names its own dataset folder (FedLAW's ``/home/Dataset/cifar/``,
FedAWARE's ``./datasets/cifar10/``, IMA's ``data/CIFAR10/``): every torchvision CIFAR and (Fashion-)MNIST opened in
the block reads the generated folder instead.

IMA's feature-skew data sets are written in the layouts its loaders (``mixed_digit_dataloader.py``,
``PACS_dataloader.py``) and fedrepro's (``data.digit5``, ``data.pacs``) both read, so one set of files serves both:
Digit-Five as FedBN distributes it (per domain ten pickled ``(images, labels)`` training parts and a test file, at
FedBN's image shapes) and PACS as its "kfold" folders of images (domain / class / image)."""

from __future__ import annotations

import contextlib
import hashlib
import pickle
import struct
from pathlib import Path

import numpy as np

SIZES = {"train": 60, "test": 30}  # samples a split; CIFAR-10's train split over its five batch files
CLASSES = {"cifar10": 10, "cifar100": 100, "fmnist": 10}
# FedBN's image shapes per domain: grey 28 (MNIST), RGB 32 (SVHN, SynthDigits), grey 16 (USPS), RGB 28 (MNIST-M)
DIGIT_SHAPES = {
    "MNIST": (28, 28),
    "SVHN": (32, 32, 3),
    "USPS": (16, 16),
    "SynthDigits": (32, 32, 3),
    "MNIST_M": (28, 28, 3),
}
DIGIT_PART, DIGIT_TEST = 4, 20  # samples a training part (ten parts: 40 a domain) and a domain's test file
# PACS: images a class (x 7 classes: 35 to 49 a domain, so the 10% test cut differs by domain); the photos, paintings
# and cartoons RGB JPEGs at the kfold release's 227 x 227 or not square (Resize(256) scales the shorter side), the
# sketches grey or RGBA PNGs; a name with an upper-case suffix, and names whose text order is not their numbers'
PACS_PER_CLASS = {"photo": 5, "art_painting": 6, "cartoon": 5, "sketch": 7}
PACS_SIZES = ((227, 227), (180, 240), (300, 210))


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _labels(rng, classes: int, n: int) -> np.ndarray:
    """Every class once where n allows, then uniform draws, in a shuffled order."""
    base = np.arange(min(classes, n))
    return rng.permutation(np.concatenate([base, rng.integers(0, classes, n - len(base))]))


def _write_cifar(root: Path, dataset: str, rng) -> dict:
    import torchvision.datasets as tvd

    cls = tvd.CIFAR10 if dataset == "cifar10" else tvd.CIFAR100
    folder = root / cls.base_folder
    folder.mkdir(parents=True, exist_ok=True)
    label_key = "labels" if dataset == "cifar10" else "fine_labels"
    sums = {"train_list": [], "test_list": []}
    for split, files in (("train", cls.train_list), ("test", cls.test_list)):
        n = SIZES[split] // len(files)
        for name, _ in files:
            images = rng.integers(0, 256, (n, 3 * 32 * 32), dtype=np.uint8)
            entry = {"data": images, label_key: _labels(rng, CLASSES[dataset], n).tolist()}
            if dataset == "cifar100":
                entry["coarse_labels"] = (np.asarray(entry[label_key]) // 5).tolist()
            (folder / name).write_bytes(pickle.dumps(entry))
            sums[f"{split}_list"].append([name, _md5(folder / name)])
    names = [f"class{i}" for i in range(CLASSES[dataset])]
    (folder / cls.meta["filename"]).write_bytes(pickle.dumps({cls.meta["key"]: names}))
    sums["meta"] = {**cls.meta, "md5": _md5(folder / cls.meta["filename"])}
    return sums


def _idx(array: np.ndarray, code: int) -> bytes:
    return struct.pack(">BBBB", 0, 0, 0x08, code) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def _write_fmnist(root: Path, rng, sizes: dict = SIZES) -> None:
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        n = sizes[split]
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(_idx(images, 3))
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(_idx(_labels(rng, 10, n).astype(np.uint8), 1))


def write_fmnist(root: str | Path, train: int, test: int, seed: int = 0) -> Path:
    """Fashion-MNIST's idx files alone under ``root``/FashionMNIST/raw, ``train`` and ``test`` samples (random
    pixels, every class present where the sizes allow)."""
    _write_fmnist(Path(root), np.random.default_rng(seed), {"train": train, "test": test})
    return Path(root)


def write_digit5(root: str | Path, seed: int = 0) -> Path:
    """Digit-Five under ``root`` as FedBN's files: <domain>/partitions/train_part0..9.pkl and <domain>/test.pkl,
    each a pickled (uint8 images, labels) pair; labels int64 in some domains and float64 in others (both
    programs cast them to integers)."""
    from fedrepro.data.digit5 import DOMAINS, TRAIN_PARTS

    root, rng = Path(root), np.random.default_rng(seed)
    for d, name in enumerate(DOMAINS):
        (root / name / "partitions").mkdir(parents=True, exist_ok=True)
        labels = _labels(rng, 10, TRAIN_PARTS * DIGIT_PART).astype(np.float64 if d % 2 else np.int64)
        files = [(f"partitions/train_part{i}.pkl", labels[i * DIGIT_PART : (i + 1) * DIGIT_PART]) for i in range(10)]
        files.append(("test.pkl", _labels(rng, 10, DIGIT_TEST).astype(labels.dtype)))
        for path, part in files:
            images = rng.integers(0, 256, (len(part), *DIGIT_SHAPES[name]), dtype=np.uint8)
            (root / name / path).write_bytes(pickle.dumps((images, part)))
    return root


def write_pacs(root: str | Path, seed: int = 0) -> Path:
    """PACS under ``root`` as its kfold folders: <domain>/<class>/<image>, random pixels."""
    from PIL import Image

    from fedrepro.data.pacs import CLASSES

    root, rng = Path(root), np.random.default_rng(seed)
    for name, per in PACS_PER_CLASS.items():
        for cls in CLASSES:
            (root / name / cls).mkdir(parents=True, exist_ok=True)
            for i in range(per):
                h, w = PACS_SIZES[i % len(PACS_SIZES)]
                if name == "sketch":
                    mode, suffix = ("RGBA", ".png") if i % 3 == 2 else ("L", ".png")
                else:
                    mode, suffix = "RGB", (".JPG" if i == 1 else ".jpg")
                channels = {"L": (), "RGB": (3,), "RGBA": (4,)}[mode]
                pixels = rng.integers(0, 256, (h, w, *channels), dtype=np.uint8)
                Image.fromarray(pixels, mode=mode).save(root / name / cls / f"{cls}_{7 * i}{suffix}")
    return root


def write(root: str | Path, seed: int = 0) -> dict:
    """Write the three data sets under ``root``; return the CIFAR files' checksums (for ``on_generated``)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    sums = {dataset: _write_cifar(root, dataset, rng) for dataset in ("cifar10", "cifar100")}
    _write_fmnist(root, rng)
    return sums


@contextlib.contextmanager
def on_generated(root: str | Path, sums: dict):
    """Inside the block every torchvision CIFAR-10/100 and (Fashion-)MNIST reads ``root``, whatever folder the
    caller names, and accepts the generated CIFAR files' md5; everything is restored on leaving."""
    import torchvision.datasets as tvd

    classes = {"cifar10": tvd.CIFAR10, "cifar100": tvd.CIFAR100}
    saved = {name: {k: getattr(cls, k) for k in ("train_list", "test_list", "meta")} for name, cls in classes.items()}
    inits = {cls: cls.__init__ for cls in (tvd.CIFAR10, tvd.MNIST)}

    def rerooted(original):
        def init(self, root_named=None, *args, **kwargs):
            kwargs.pop("root", None)
            original(self, str(root), *args, **kwargs)

        return init

    try:
        for name, cls in classes.items():
            for key, value in sums[name].items():
                setattr(cls, key, value)
        for cls, original in inits.items():
            cls.__init__ = rerooted(original)
        yield Path(root)
    finally:
        for cls, original in inits.items():
            cls.__init__ = original
        for name, cls in classes.items():
            for key, value in saved[name].items():
                setattr(cls, key, value)
