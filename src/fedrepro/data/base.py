"""What every dataset shares: the protocol the engine trains on, and the download machinery.

A mirror is a URL prefix or a local folder. Each file is fetched into a temporary name, checked,
and only then renamed into place, so a corrupt or partial file never becomes an output. Decompressed
files get their sha256 recorded at download, and ``load`` checks them against it.

Nothing here knows a dataset by name: the families (fmnist, cifar, synthetic, agnews) import this
module, and the package's ``__init__`` dispatches to them by name.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from fedrepro.errors import FedreproError

# For a file whose size is not known in advance
DEFAULT_MAX_BYTES = 1 << 30


@runtime_checkable
class Dataset(Protocol):
    """A whole split on one device, as the engine trains and evaluates on it.

    Capabilities are declared, not probed: ``augment`` says batches draw random augmentation from
    the device's global RNG (so a vmapped cohort would draw other crops), ``batched_cohort`` says a
    (K, B) index batch gives an input the model can be vmapped over."""

    labels: torch.Tensor
    augment: bool
    batched_cohort: bool

    def __len__(self) -> int: ...

    def batch(self, index: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """``index`` of any shape; the input and the labels have its shape in front."""

    def subset(self, index: torch.Tensor) -> "Dataset":
        """The samples at ``index`` (a test split's hold-out and its rest), preprocessing kept."""

    def to(self, device) -> "Dataset": ...


class DownloadError(FedreproError, RuntimeError):
    """No mirror gave a file that passes its check; the message lists what was tried."""


def content_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with gzip.open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_ok(path: Path, md5: str, content_digest: str | None) -> bool:
    from torchvision.datasets.utils import check_integrity

    if check_integrity(str(path), md5):
        return True
    if content_digest is None:
        return False
    try:
        return content_sha256(path) == content_digest
    except (OSError, EOFError, gzip.BadGzipFile):
        return False


def _fetch(mirror: str, filename: str, dest: Path, timeout: float, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Copy ``filename`` from the mirror to ``dest``, refusing more than ``max_bytes``."""
    # Our own fetch (not torchvision's download_url) so a timeout, the size limit and the temp file
    # are ours; torchvision's downloader cannot read a local folder, so a folder is a mirror here too.
    url = mirror.rstrip("/") + "/" + filename
    with (
        urllib.request.urlopen(url, timeout=timeout) if "://" in mirror else open(Path(mirror) / filename, "rb") as src,
        open(dest, "wb") as out,
    ):
        copied = 0
        while chunk := src.read(1 << 20):
            copied += len(chunk)
            if copied > max_bytes:
                raise DownloadError(f"more than {max_bytes} bytes, the file's size; stopped there")
            out.write(chunk)


def fetch_from_mirrors(
    filename: str,
    target: Path,
    mirrors: list[str],
    valid,
    timeout: float,
    log,
    what: str,
    offline_help: str,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> None:
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


# Written next to the decompressed files at download; ``load`` checks the files against it, so a
# file altered after the download (labels overwritten, a truncated image file) is never trained on.
LOADED_SUMS = "SHA256SUMS.json"


class DataError(FedreproError, RuntimeError):
    """A dataset file that is not what was downloaded; the message names it."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def extract(folder: Path, expected: dict[str, str]) -> None:
    """Decompress next to the archives, as torchvision's own download() leaves them; a decompressed
    file whose content is not the expected one is decompressed again. Record the digests for ``load``."""
    sums = {}
    for archive in folder.glob("*.gz"):
        out = archive.with_suffix("")
        if not (out.exists() and file_sha256(out) == (expected.get(out.name) or content_sha256(archive))):
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{out.name}.", suffix=".part")
            with os.fdopen(fd, "wb") as dst, gzip.open(archive, "rb") as src:
                shutil.copyfileobj(src, dst)
            os.replace(tmp, out)
        sums[out.name] = file_sha256(out)
    (folder / LOADED_SUMS).write_text(json.dumps(sums, indent=2, sort_keys=True))


def not_downloaded(dataset: str, root: str | Path, err: Exception) -> DataError:
    """torchvision's reader found no files under ``root``: say which folder and how to fill it."""
    return DataError(
        f"{root}: no {dataset} files to read ({err}); run `fedrepro download --dataset {dataset} "
        f"--root {root}` (snakemake does, when the params file's data.root names this folder)"
    )


def verify_loaded(folder: Path) -> None:
    """Check the decompressed files against the digests recorded at download (when there is a record)."""
    record = folder / LOADED_SUMS
    if not record.exists():
        return
    from fedrepro.records import read_json

    for name, sha in read_json(record).items():
        path = folder / name
        if not path.exists() or file_sha256(path) != sha:
            raise DataError(
                f"{path} is missing or differs from what was downloaded (sha256 recorded in {record}); "
                f"run the download again (fedrepro download, or delete its download.json and rerun "
                f"snakemake), which decompresses it anew"
            )


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
    augment = False
    batched_cohort = True

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
