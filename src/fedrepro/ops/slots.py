"""Several training runs on one machine's GPUs: each concurrent job holds one slot; its slot names its GPU.

Snakemake caps the concurrent ``train`` jobs with the ``gpu_slot`` resource (the profile declares
GPUs x runs per GPU). A job takes the lowest free slot, a lock file held for the life of the process,
and trains on GPU ``slot % GPUs``: with at most GPUs x R jobs at once, no GPU gets more than R and
each gets its share, where without slots every job would land on ``cuda:0``. The locks live in a
node-local folder (one per Slurm allocation), so jobs on other nodes never compete for them.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

_held: list = []  # the open lock files of this process: a slot is held until the process exits


def slot_dir(environ=None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get("FEDREPRO_SLOT_DIR"):
        return Path(environ["FEDREPRO_SLOT_DIR"])
    job = environ.get("SLURM_JOB_ID")
    return Path(tempfile.gettempdir()) / (f"fedrepro-slots-{os.getuid()}" + (f"-{job}" if job else ""))


def acquire(directory: str | Path | None = None, limit: int = 4096) -> int:
    """Take the lowest free slot and hold it until this process exits; return its number."""
    directory = Path(directory) if directory else slot_dir()
    directory.mkdir(parents=True, exist_ok=True)
    for slot in range(limit):
        handle = open(directory / f"slot-{slot}.lock", "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        _held.append(handle)
        return slot
    raise RuntimeError(f"no free slot among {limit} in {directory}")


def gpu_for_slot(slot: int, gpus: int) -> int:
    """Slots fill from 0 and Snakemake admits at most GPUs x R jobs, so slot % GPUs puts at most R on each."""
    if gpus < 1:
        raise ValueError(f"gpu_for_slot: {gpus} GPUs; a slot names a GPU only where there is one")
    return slot % gpus


def bind_gpu() -> str | None:
    """On a machine with several visible GPUs, hold a slot and make its GPU the current one.
    Returns a line for the log, or None where there is nothing to choose (no CUDA, or one GPU)."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return None
    slot = acquire()
    gpu = gpu_for_slot(slot, torch.cuda.device_count())
    torch.cuda.set_device(gpu)
    return f"fedrepro train: slot {slot} of {slot_dir()} -> cuda:{gpu} of {torch.cuda.device_count()}"
