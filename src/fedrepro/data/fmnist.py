"""Fashion-MNIST: the four idx ``.gz`` files from a list of mirrors, read by torchvision's reader.

Checksums: torchvision's md5 of the published ``.gz`` files, or, because Debian's
``dataset-fashion-mnist`` recompresses the same files (other ``.gz`` bytes, same content), the
sha256 of the decompressed idx content, recorded from that package.
"""

from __future__ import annotations

from pathlib import Path

from fedrepro.data.base import (
    DEFAULT_MAX_BYTES,
    TensorDataset,
    extract,
    fetch_from_mirrors,
    file_ok,
    not_downloaded,
    verify_loaded,
)

DATASET = "fmnist"

DEBIAN_FMNIST = "/usr/share/datasets/fashion-mnist/"

# torchvision.datasets.FashionMNIST.mirrors, then the Debian package's folder.
DEFAULT_MIRRORS = ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/", DEBIAN_FMNIST]

FMNIST_CONTENT_SHA256 = {
    "train-images-idx3-ubyte.gz": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte.gz": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte.gz": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte.gz": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}

# Published sizes of the .gz files: a download stops there (Debian's recompressed copies are 24 bytes
# smaller), so a mirror that streams too much or never stops cannot fill the disk.
FMNIST_BYTES = {
    "train-images-idx3-ubyte.gz": 26421880,
    "train-labels-idx1-ubyte.gz": 29515,
    "t10k-images-idx3-ubyte.gz": 4422102,
    "t10k-labels-idx1-ubyte.gz": 5148,
}

HOW_TO_GET_OFFLINE = (
    "Without internet: install Debian's package 'dataset-fashion-mnist' (apt-get install "
    f"dataset-fashion-mnist) which puts the files in {DEBIAN_FMNIST}, or copy the four "
    "*-ubyte.gz files into a folder and list that folder first under data.mirrors.fmnist."
)


def raw_folder(root: str | Path) -> Path:
    """Where torchvision expects the raw files (``<root>/FashionMNIST/raw``)."""
    return Path(root) / "FashionMNIST" / "raw"


def download(
    dataset: str, root: str | Path, mirrors: list[str] | None = None, timeout: float = 20.0, log=print
) -> Path:
    """Fetch the four files into ``root``; return the raw folder. Idempotent."""
    from torchvision.datasets import FashionMNIST

    mirrors = list(mirrors or DEFAULT_MIRRORS)
    folder = raw_folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    content = FMNIST_CONTENT_SHA256
    for filename, md5 in FashionMNIST.resources:
        target = folder / filename
        if target.exists() and file_ok(target, md5, content.get(filename)):
            continue
        fetch_from_mirrors(
            filename,
            target,
            mirrors,
            lambda p: file_ok(p, md5, content.get(filename)),
            timeout,
            log,
            f"{filename} of '{DATASET}'",
            HOW_TO_GET_OFFLINE,
            FMNIST_BYTES.get(filename, DEFAULT_MAX_BYTES),
        )
    extract(folder, {name.removesuffix(".gz"): sha for name, sha in content.items()})
    return folder


def load(
    dataset: str, root: str | Path, train: bool, preprocess: dict | None = None, pretrained: dict | None = None
) -> TensorDataset:
    from torchvision.datasets import FashionMNIST

    verify_loaded(raw_folder(root))
    try:
        ds = FashionMNIST(str(root), train=train, download=False)
    except RuntimeError as err:  # torchvision's "Dataset not found"
        raise not_downloaded(DATASET, root, err) from None
    # ToTensor only, as IMA's and FedLAW's code do for Fashion-MNIST.
    return TensorDataset(ds.data.unsqueeze(1).contiguous(), ds.targets.clone(), 0.0, 1.0)
