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
        out = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "-C", str(CHECKOUT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict:
    import numpy as np
    import torch
    import torchvision

    from fedrepro import __version__
    return {"python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__,
            "numpy": np.__version__, "fedrepro": __version__}


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


def run_provenance(device) -> dict:
    """What a run's summary records about where and with what it ran."""
    import torch
    return {"device": device_name(device), "host": platform.node(), "cpu": cpu_model(), "cpu_kernels": cpu_kernels(),
            "cpu_threads": torch.get_num_threads(), "versions": versions(), "git_commit": git_commit()}


def machine() -> dict:
    """The machine a measurement ran on (benchmark, step costs, GPU check): its load average says how
    shared it was."""
    import torch
    info = {"host": platform.node(), "cpu": cpu_model(), "cpu_kernels": cpu_kernels(), "cpu_cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "load_average": list(os.getloadavg())}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info
