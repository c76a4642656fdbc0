"""Client index lists another program produced (.npz ``client_0`` .. or JSON ``{"clients": [...]}``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from fedrepro.partitions.base import PartitionError


def read_file(path: str | Path, num_clients: int, train_size: int, sha256: str | None = None) -> list[np.ndarray]:
    """Kind ``file``: the client index lists of an .npz (int arrays ``client_0`` .. ``client_{n-1}``) or a JSON
    (``{"clients": [[...], ...]}``), checked: num_clients lists, none empty, every index an integer in
    [0, train_size), none twice; each list is kept in the file's order. With ``sha256`` the file must have
    that content hash. One-line errors name the file and the first bad client."""
    path = Path(path)
    if not path.is_file():
        raise PartitionError(f"partition file {path}: no such file")
    raw = path.read_bytes()
    if sha256 is not None and hashlib.sha256(raw).hexdigest() != sha256:
        raise PartitionError(
            f"partition file {path}: its content changed (SHA-256 {hashlib.sha256(raw).hexdigest()}, "
            f"the setting pins {sha256})"
        )
    try:
        if path.suffix == ".npz":
            import io

            with np.load(io.BytesIO(raw), allow_pickle=False) as data:
                keys = set(data.files)
                lists = [data[f"client_{i}"] if f"client_{i}" in keys else None for i in range(len(keys))]
                extra = sorted(k for k in keys if k not in {f"client_{i}" for i in range(len(keys))})
        elif path.suffix == ".json":
            doc = json.loads(raw)
            if not isinstance(doc, dict) or not isinstance(doc.get("clients"), list):
                raise PartitionError(
                    f'partition file {path}: a JSON partition is an object {{"clients": [[...], ...]}}'
                )
            lists, extra = [np.asarray(c) if isinstance(c, list) else None for c in doc["clients"]], []
        else:
            raise PartitionError(f"partition file {path}: must end in .npz or .json, not '{path.suffix}'")
    except PartitionError:
        raise
    except Exception as err:  # noqa: BLE001 - BadZipFile, JSONDecodeError, ValueError (pickled arrays)
        raise PartitionError(f"partition file {path}: cannot be read ({type(err).__name__}: {err})") from None
    if extra:
        raise PartitionError(
            f"partition file {path}: keys must be client_0 .. client_{len(lists) - 1}; found {extra[0]}"
        )
    if len(lists) != num_clients:
        raise PartitionError(
            f"partition file {path}: holds {len(lists)} clients, the setting asks for num_clients = {num_clients}"
        )
    seen = np.zeros(train_size, dtype=bool)
    parts = []
    for i, part in enumerate(lists):
        bad = None
        if part is None or part.ndim != 1:
            bad = "is not a list of indices"
        elif not len(part):
            bad = "is empty"
        elif part.dtype.kind not in "iu":
            bad = f"holds non-integer indices ({part.dtype})"
        elif part.min() < 0 or part.max() >= train_size:
            off = part[(part < 0) | (part >= train_size)][0]
            bad = f"holds index {off}, outside the training set's 0..{train_size - 1}"
        elif len(np.unique(part)) != len(part) or seen[part].any():
            ordered = np.sort(part)
            twice = part[seen[part]] if seen[part].any() else ordered[np.flatnonzero(np.diff(ordered) == 0)]
            bad = f"holds index {twice[0]} a second time"
        if bad:
            raise PartitionError(f"partition file {path}: client {i} {bad}")
        seen[part] = True
        parts.append(part.astype(np.int64))  # in the file's order: the order the other program kept them in
    return parts


def make(labels: np.ndarray, setting: dict, groups=None) -> list[np.ndarray]:
    return read_file(setting["path"], setting["num_clients"], len(labels), setting.get("sha256"))
