"""Where a result came from: the commit of the code, the package versions, the machine.

One owner for what every run's summary, the benchmark and the planner record about their origin.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def git_commit() -> str:
    """The checkout's commit, with ``-dirty`` when tracked files differ from it; ``unknown`` outside git."""
    try:
        out = subprocess.run(
            ["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", str(CHECKOUT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict:
    import numpy as np
    import torch
    import torchvision

    from fedrepro import __version__

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "numpy": np.__version__,
        "fedrepro": __version__,
    }


def device_name(device) -> str:
    """A torch device as a person reads it: ``cuda:0 (NVIDIA H100 80GB HBM3)``, ``cpu``."""
    import torch

    device = torch.device(device)
    return str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")


def device_line(device, resumed_at: int | None) -> str:
    """The first line of every train log: where it runs, with what, and whether it resumed."""
    import torch

    cuda = torch.version.cuda or "none"
    start = f"resumed at round {resumed_at}" if resumed_at is not None else "fresh start"
    return f"fedrepro train: device {device_name(device)}; torch {torch.__version__}, CUDA {cuda}; {start}"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_kernels() -> str:
    """The instruction set torch picked its CPU kernels for (``AVX2``, ``AVX512``, ``DEFAULT``; the environment
    variable ATEN_CPU_CAPABILITY can lower it). Runs on CPUs whose kernels differ move in float32's last bits,
    so a rerun elsewhere is equal to a tolerance, not bit for bit: this says which case a comparison is."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


NVIDIA_PROC = Path("/proc/driver/nvidia/version")


def driver_version(proc: Path = NVIDIA_PROC) -> str | None:
    """The NVIDIA driver's release (``550.54.15``): what the kernel module says, else nvidia-smi; None without one."""
    try:
        text = proc.read_text()
        for word in text.split():
            if word.count(".") >= 1 and word.replace(".", "").isdigit():
                return word
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        first = out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else ""
        return first or None
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_record(device) -> dict | None:
    """The GPU a run used, as the driver reports it: name, compute capability, memory, driver release; None on
    the CPU. Read once per run, when its summary is written."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "driver": driver_version(),
    }


def determinism() -> dict:
    """The switches in force that decide whether a rerun repeats a run bit for bit (none of them is set by
    fedrepro: these are torch's defaults unless the environment changed them)."""
    import torch

    backends = torch.backends
    flags = {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_enabled": backends.cudnn.enabled,
        "cudnn_deterministic": backends.cudnn.deterministic,
        "cudnn_benchmark": backends.cudnn.benchmark,
        "matmul_allow_tf32": backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }
    conv = getattr(getattr(backends.cudnn, "conv", None), "fp32_precision", None)
    if conv is not None:  # torch >= 2.9 names the precision of cuDNN's float32 convolutions ("tf32" by default)
        flags["cudnn_conv_fp32_precision"] = conv
    return flags


def accelerator(device) -> dict:
    """torch and the CUDA stack a run used: torch's build, its CUDA and cuDNN, the GPU (``gpu_record``), and the
    determinism switches in force."""
    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "gpu": gpu_record(device),
        "determinism": determinism(),
    }


def run_provenance(device) -> dict:
    """What a run's summary records about where and with what it ran."""
    import torch

    return {
        "device": device_name(device),
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpu_kernels": cpu_kernels(),
        "cpu_threads": torch.get_num_threads(),
        "versions": versions(),
        "accelerator": accelerator(device),
        "git_commit": git_commit(),
    }


def machine() -> dict:
    """The machine a measurement ran on (benchmark, step costs, GPU check): its load average says how
    shared it was."""
    import torch

    info = {
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpu_kernels": cpu_kernels(),
        "cpu_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_average": list(os.getloadavg()),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info
