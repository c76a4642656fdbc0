"""Where a result came from: the commit of the code, the package versions, the machine.

One owner for what every run's summary, the benchmark and the planner record about their origin.
"""
from __future__ import annotations

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
