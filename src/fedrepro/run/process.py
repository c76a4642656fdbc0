"""The process a run trains in: the device it picks, and its tie to the parent that started it."""

from __future__ import annotations

import os
import signal
import sys
import threading

import torch

from fedrepro.errors import SetupError

# Variables through which a scheduler hands a job its GPUs (Slurm's, then the CUDA runtime's).
GPU_GRANT_VARIABLES = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES")


def granted_gpus(environ=None) -> str | None:
    """The GPUs this job was given (``NAME=value``), or None. An empty or ``-1`` CUDA_VISIBLE_DEVICES
    hides every GPU on purpose, so it grants none."""
    environ = os.environ if environ is None else environ
    for name in GPU_GRANT_VARIABLES:
        value = environ.get(name, "").strip()
        if value and value not in ("-1", "NoDevFiles"):
            return f"{name}={value}"
    return None


def pick_device(name: str, environ=None) -> torch.device:
    """``auto`` is CUDA when torch sees it; a job that was given a GPU but sees no CUDA fails
    instead of training silently on the CPU (a driver older than torch's CUDA, a broken module)."""
    if name == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    grant = granted_gpus(environ)
    if name == "cuda" or grant:
        why = f"this job was given a GPU ({grant})" if grant else "device: cuda was asked for"
        built = torch.version.cuda or "none: a CPU-only build"
        raise SetupError(
            f"{why}, but torch {torch.__version__} (built for CUDA {built}) sees no CUDA device. Check "
            "`nvidia-smi` and that the driver supports this CUDA version; set device: cpu to train on the CPU "
            "on purpose"
        )
    return torch.device("cpu")


def set_precision(precision: str) -> None:
    """The process-wide arithmetic of CUDA matrix products and convolutions (the setting's ``precision``):
    torch leaves cuDNN convolutions on TF32 by default, so float32 must switch them off, not just keep the
    matmul default."""
    tf32 = {"float32": False, "tf32": True}[precision]
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` when the parent (Snakemake) dies, even by SIGKILL; SIGTERM makes a run
    save a checkpoint and stop (the trainer's SIGTERM handler), so no orphan trains on beside the next rerun."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


def main_thread() -> bool:
    """Only the main thread may install a signal handler."""
    return threading.current_thread() is threading.main_thread()
