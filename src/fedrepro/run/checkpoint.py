"""Atomic, verified checkpoints: written to a temporary name and renamed, loaded with weights_only=True.

With ``digest`` (the resume checkpoints) a file is a header line ``fedrepro-sha256 <digest of the
rest>`` followed by torch's bytes, so a flipped bit or a truncated file is found before anything is
loaded from it (torch's zip reader catches truncation, not a flipped bit in a tensor). Without it
(``model.pt``, read by users with plain ``torch.load``) the file is torch's own; ``load`` reads both.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import time
from pathlib import Path

import torch

from fedrepro.errors import FedreproError

MAGIC = b"fedrepro-sha256 "


class CheckpointError(FedreproError, RuntimeError):
    """A checkpoint that cannot be trusted; the message names the file."""


def save(obj, path: str | Path, digest: bool = False) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    body = buffer.getvalue()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            if digest:
                out.write(MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n")
            out.write(body)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def load(path: str | Path, device: str | torch.device = "cpu"):
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read: {err}") from None
    if raw.startswith(MAGIC):
        header, _, body = raw.partition(b"\n")
        if hashlib.sha256(body).hexdigest().encode() != header[len(MAGIC) :]:
            raise CheckpointError(
                f"{path}: its content does not match the digest stored with it (truncated or altered)"
            )
        raw = body
    try:
        return torch.load(io.BytesIO(raw), map_location=device, weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises RuntimeError, pickle and zip errors alike
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(err).__name__}: {err})") from None


def set_aside(path: str | Path) -> Path:
    """Rename a bad checkpoint out of the way (kept for inspection), so the next start is not blocked."""
    path = Path(path)
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(path, aside)
    return aside


def remove_partial(folder: str | Path) -> list[Path]:
    """Delete the temporary files of writes that a kill interrupted (``.<name>.*.part``)."""
    removed = []
    for part in Path(folder).glob(".*.part"):
        part.unlink(missing_ok=True)
        removed.append(part)
    return removed


def to_device(state, device):
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, dict):
        return {k: to_device(v, device) for k, v in state.items()}
    if isinstance(state, list):
        return [to_device(v, device) for v in state]
    return state
