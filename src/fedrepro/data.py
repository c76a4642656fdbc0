"""Datasets: download from a list of mirrors with checksums, then load as device tensors.

A mirror is a URL prefix or a local folder. Each file is fetched into a temporary name, checked,
and only then renamed into place, so a corrupt or partial file never becomes an output.

Fashion-MNIST checksums: torchvision's md5 of the published ``.gz`` files, or, because Debian's
``dataset-fashion-mnist`` recompresses the same files (other ``.gz`` bytes, same content), the
sha256 of the decompressed idx content, recorded from that package.
"""
from __future__ import annotations

import gzip
import json
import hashlib
import os
import shutil
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import torch

DEBIAN_FMNIST = "/usr/share/datasets/fashion-mnist/"

# torchvision.datasets.FashionMNIST.mirrors, then the Debian package's folder.
DEFAULT_MIRRORS = {
    "fmnist": ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/", DEBIAN_FMNIST],
}

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
# For a file whose size is not known in advance
DEFAULT_MAX_BYTES = 1 << 30

HOW_TO_GET_OFFLINE = {
    "fmnist": "Without internet: install Debian's package 'dataset-fashion-mnist' (apt-get install "
              f"dataset-fashion-mnist) which puts the files in {DEBIAN_FMNIST}, or copy the four "
              "*-ubyte.gz files into a folder and list that folder first under data.mirrors.fmnist.",
}


class DownloadError(RuntimeError):
    pass


def _resources(dataset: str) -> list[tuple[str, str]]:
    if dataset == "fmnist":
        from torchvision.datasets import FashionMNIST
        return list(FashionMNIST.resources)
    raise DownloadError(f"dataset '{dataset}' has no downloader")


def raw_folder(root: str | Path, dataset: str) -> Path:
    """Where torchvision expects the raw files (``<root>/FashionMNIST/raw``)."""
    return Path(root) / {"fmnist": "FashionMNIST"}[dataset] / "raw"


def _content_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with gzip.open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_ok(path: Path, md5: str, content_sha256: str | None) -> bool:
    from torchvision.datasets.utils import check_integrity
    if check_integrity(str(path), md5):
        return True
    if content_sha256 is None:
        return False
    try:
        return _content_sha256(path) == content_sha256
    except (OSError, EOFError, gzip.BadGzipFile):
        return False


def _fetch(mirror: str, filename: str, dest: Path, timeout: float, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Copy ``filename`` from the mirror to ``dest``, refusing more than ``max_bytes``."""
    # Our own fetch (not torchvision's download_url) so a timeout, the size limit and the temp file
    # are ours; torchvision's downloader cannot read a local folder, so a folder is a mirror here too.
    url = mirror.rstrip("/") + "/" + filename
    with (urllib.request.urlopen(url, timeout=timeout) if "://" in mirror else open(Path(mirror) / filename, "rb")) \
            as src, open(dest, "wb") as out:
        copied = 0
        while chunk := src.read(1 << 20):
            copied += len(chunk)
            if copied > max_bytes:
                raise DownloadError(f"more than {max_bytes} bytes, the file's size; stopped there")
            out.write(chunk)


def fetch_from_mirrors(filename: str, target: Path, mirrors: list[str], valid, timeout: float, log,
                       what: str, offline_help: str, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Try each mirror in order; the first copy that passes ``valid`` is renamed to ``target``.

    Every attempt goes to a temporary name first, so a corrupt or partial file never takes
    ``target``'s place; the error lists every mirror tried and why it failed."""
    tried = []
    for mirror in mirrors:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
        os.close(fd)
        tmp_path = Path(tmp)
        try:
            _fetch(mirror, filename, tmp_path, timeout, max_bytes)
            if not valid(tmp_path):
                raise DownloadError("checksum mismatch")
            os.replace(tmp_path, target)
            log(f"{filename}: from {mirror}")
            return
        except Exception as err:  # noqa: BLE001 - every failure means: try the next mirror
            tried.append(f"  {mirror}: {type(err).__name__}: {err}")
        finally:
            tmp_path.unlink(missing_ok=True)
    raise DownloadError(f"could not get {what} from any mirror; tried:\n" + "\n".join(tried) + "\n" + offline_help)


def download(dataset: str, root: str | Path, mirrors: list[str] | None = None,
             timeout: float = 20.0, log=print) -> Path:
    """Fetch every file of ``dataset`` into ``root``; return the raw folder. Idempotent."""
    from fedrepro import datasets_extra, text
    if dataset in datasets_extra.HANDLED:  # CIFAR archives, generated Synthetic
        return datasets_extra.download(dataset, root, mirrors, timeout, log)
    if dataset in text.HANDLED:  # AGNews parquet or csv
        return text.download(dataset, root, mirrors, timeout, log)
    mirrors = list(mirrors or DEFAULT_MIRRORS[dataset])
    folder = raw_folder(root, dataset)
    folder.mkdir(parents=True, exist_ok=True)
    content = FMNIST_CONTENT_SHA256 if dataset == "fmnist" else {}
    for filename, md5 in _resources(dataset):
        target = folder / filename
        if target.exists() and file_ok(target, md5, content.get(filename)):
            continue
        fetch_from_mirrors(filename, target, mirrors, lambda p: file_ok(p, md5, content.get(filename)),
                           timeout, log, f"{filename} of '{dataset}'", HOW_TO_GET_OFFLINE.get(dataset, ""),
                           FMNIST_BYTES.get(filename, DEFAULT_MAX_BYTES))
    _extract(folder, {name.removesuffix(".gz"): sha for name, sha in content.items()})
    return folder


def prepare(dataset: str, root: str | Path, mirrors: list[str] | None, out: str | Path | None,
            log_file: str | Path | None = None, timeout: float = 20.0) -> Path:
    """Download (idempotent) and, with ``out``, write the list of files as the step's output."""
    logs = open(log_file, "a") if log_file else None
    log = (lambda msg: print(msg, file=logs, flush=True)) if logs else print
    try:
        folder = download(dataset, root, mirrors, timeout=timeout, log=log)
    finally:
        if logs:
            logs.close()
    if out:
        files = sorted(p.name for p in Path(folder).iterdir() if not p.name.startswith("."))
        Path(out).write_text(json.dumps({"dataset": dataset, "folder": str(folder), "files": files}, indent=2))
    return Path(folder)


# Written next to the decompressed files at download; ``load`` checks the files against it, so a
# file altered after the download (labels overwritten, a truncated image file) is never trained on.
LOADED_SUMS = "SHA256SUMS.json"


class DataError(RuntimeError):
    """A dataset file that is not what was downloaded; the message names it."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _extract(folder: Path, expected: dict[str, str]) -> None:
    """Decompress next to the archives, as torchvision's own download() leaves them; a decompressed
    file whose content is not the expected one is decompressed again. Record the digests for ``load``."""
    sums = {}
    for archive in folder.glob("*.gz"):
        out = archive.with_suffix("")
        if not (out.exists() and file_sha256(out) == (expected.get(out.name) or _content_sha256(archive))):
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{out.name}.", suffix=".part")
            with os.fdopen(fd, "wb") as dst, gzip.open(archive, "rb") as src:
                shutil.copyfileobj(src, dst)
            os.replace(tmp, out)
        sums[out.name] = file_sha256(out)
    (folder / LOADED_SUMS).write_text(json.dumps(sums, indent=2, sort_keys=True))


def verify_loaded(folder: Path) -> None:
    """Check the decompressed files against the digests recorded at download (when there is a record)."""
    record = folder / LOADED_SUMS
    if not record.exists():
        return
    from fedrepro.config import read_json
    for name, sha in read_json(record).items():
        path = folder / name
        if not path.exists() or file_sha256(path) != sha:
            raise DataError(f"{path} is missing or differs from what was downloaded (sha256 recorded in {record}); "
                            f"run the download again (fedrepro download, or delete its download.json and rerun "
                            f"snakemake), which decompresses it anew")


def gather(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``rows[index]`` by index_select: the same values, ~10x faster on CPU for image batches
    (advanced indexing cost about 30 us of a 0.8 ms MLP step, index_select 3 us)."""
    return rows.index_select(0, index.reshape(-1)).view(*index.shape, *rows.shape[1:])


@dataclass
class TensorDataset:
    """A whole split on one device: uint8 images and int64 labels; batches are index gathers."""
    images: torch.Tensor
    labels: torch.Tensor
    mean: float
    std: float

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``index`` of any shape (a cohort batches with (K, B)); the result has its shape in front."""
        x = gather(self.images, index).to(torch.float32).div_(255.0)
        if self.std != 1.0 or self.mean != 0.0:
            x = x.sub_(self.mean).div_(self.std)
        return x, gather(self.labels, index)

    def to(self, device) -> "TensorDataset":
        return TensorDataset(self.images.to(device), self.labels.to(device), self.mean, self.std)

    def subset(self, index: torch.Tensor) -> "TensorDataset":
        """The samples at ``index`` (a test split's hold-out and its rest), normalisation kept."""
        return TensorDataset(self.images[index], self.labels[index], self.mean, self.std)


def load(dataset: str, root: str | Path, train: bool, preprocess: dict | None = None,
         pretrained: dict | None = None) -> TensorDataset:
    """Load a downloaded split through torchvision's own reader (``preprocess``: CIFAR only;
    ``pretrained``: the tokenizer's path and token length, text datasets only)."""
    from fedrepro import datasets_extra, text
    if dataset in datasets_extra.HANDLED:
        return datasets_extra.load(dataset, root, train, preprocess)
    if dataset in text.HANDLED:
        return text.load(dataset, root, train, pretrained)
    if dataset == "fmnist":
        from torchvision.datasets import FashionMNIST
        verify_loaded(raw_folder(root, dataset))
        ds = FashionMNIST(str(root), train=train, download=False)
        # ToTensor only, as IMA's and FedLAW's code do for Fashion-MNIST.
        return TensorDataset(ds.data.unsqueeze(1).contiguous(), ds.targets.clone(), 0.0, 1.0)
    raise ValueError(f"unknown dataset '{dataset}'")


def train_labels(dataset: str, root: str | Path):
    from fedrepro import text
    if dataset in text.HANDLED:  # the label column alone; tokenising is not needed to partition
        return text.train_labels(root)
    return load(dataset, root, train=True).labels.numpy()
