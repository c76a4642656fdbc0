"""Importing an authors' checkout unchanged: its folder first on sys.path while its modules load, its top-level
module names (``model``, ``utils``, ``models``...) cleared before and after so two checkouts never share one,
and the few things its HEAD needs that this machine lacks (CUDA, mpi4py) shimmed without touching its files."""

from __future__ import annotations

import contextlib
import functools
import importlib
import subprocess
import sys
import types
from pathlib import Path

import torch


def commit(checkout: str | Path) -> str:
    """The checkout's HEAD commit (the record names the code it compared)."""
    return subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _top_level_names(checkout: Path) -> set[str]:
    return {p.stem for p in checkout.glob("*.py")} | {
        p.name for p in checkout.iterdir() if p.is_dir() and (p / "__init__.py").is_file()
    }


def _stub(name: str, checkout: Path) -> types.ModuleType:
    """A placeholder for a module the code imports at the top but the compared path never calls (FedNova's
    util_v4 imports mpi4py's MPI; IMA's utils.global_test imports utils.tSNE and leaf.dataloader, which its HEAD
    does not ship): every name imported from it is a placeholder that refuses to be called. A stub of a package
    whose folder the checkout has (IMA's partial copy of FedLab, whose ``fedlab/utils/__init__.py`` imports four
    modules HEAD lacks) stands in for its ``__init__`` only: its submodules load from the checkout's files."""
    module = types.ModuleType(name)
    folder = checkout / name.replace(".", "/")
    module.__path__ = [str(folder)] if folder.is_dir() else []  # a package: submodules resolve below it
    module.__all__ = []  # ``from stub import *`` (IMA's server_se1) imports nothing
    module.__getattr__ = lambda attr: _placeholder(f"{name}.{attr}") if not attr.startswith("__") else None
    return module


def _placeholder(name: str) -> type:
    def refuse(*a, **k):
        raise RuntimeError(f"parity shim: {name} is a placeholder for a name the checkout imports but lacks")

    return type(name.rsplit(".", 1)[-1], (), {"__init__": refuse})


@contextlib.contextmanager
def checkout_on_path(
    checkout: str | Path, stubs: tuple[str, ...] = (), placeholders: dict | None = None, replace: tuple[str, ...] = ()
):
    """Import from ``checkout`` inside the block: modules are loaded from it (cleared of any same-named module
    first), ``.cuda()``, ``torch.cuda.set_device`` and ``torch.tensor(..., device='cuda')`` stay on the CPU, the
    named ``stubs`` are placeholders where the module is not installed, ``replace`` names modules of the checkout
    itself that become placeholders (FedAWARE's ``settings`` and ``agnews_dataset``, which load data sets and
    tokenizers the server step never calls), and ``placeholders`` ({module: [names]}) adds names a checkout's
    module lacks but another of its modules imports (FedNova's util_v4 imports ``LogisticRegression`` from its
    ``models``, which HEAD does not define). Everything is restored on leaving."""
    checkout = Path(checkout).resolve()
    if not checkout.is_dir():
        raise FileNotFoundError(f"checkout {checkout}: no such folder (give the path of the authors' repository)")
    names = _top_level_names(checkout)

    def clear():
        for name in [m for m in sys.modules if m.split(".")[0] in names]:
            del sys.modules[name]

    saved = {
        "module_cuda": torch.nn.Module.cuda,
        "tensor_cuda": torch.Tensor.cuda,
        "set_device": torch.cuda.set_device,
        "tensor": torch.tensor,
    }
    clear()
    added = []
    for name in replace:
        sys.modules[name] = _stub(name, checkout)
        added.append(name)
    for name in stubs:  # after clearing: a stub may sit below one of the checkout's own packages (utils.tSNE)
        parts = name.split(".")
        if parts[0] in names:  # the checkout's package lacks this module at HEAD
            chain = [name] if not (checkout / (name.replace(".", "/") + ".py")).is_file() else []
        else:
            try:
                importlib.import_module(name)
                chain = []
            except ImportError:
                chain = [
                    ".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) not in sys.modules
                ]
        for part in chain:
            sys.modules[part] = _stub(part, checkout)
            added.append(part)
    sys.path.insert(0, str(checkout))
    torch.nn.Module.cuda = lambda self, *a, **k: self
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.set_device = lambda *a, **k: None
    torch.tensor = functools.partial(_on_cpu, saved["tensor"])
    try:
        for module, attrs in (placeholders or {}).items():
            loaded = importlib.import_module(module)
            for attr in attrs:
                if not hasattr(loaded, attr):
                    setattr(loaded, attr, _placeholder(f"{module}.{attr}"))
        yield checkout
    finally:
        sys.path.remove(str(checkout))
        clear()
        for name in [m for m in sys.modules if any(m == a or m.startswith(a + ".") for a in added)]:
            del sys.modules[name]  # a stub and what loaded below it (the checkout's files under a stubbed package)
        torch.nn.Module.cuda, torch.Tensor.cuda = saved["module_cuda"], saved["tensor_cuda"]
        torch.cuda.set_device, torch.tensor = saved["set_device"], saved["tensor"]


def _on_cpu(tensor, *args, **kwargs):
    """torch.tensor with a CUDA device argument placed on the CPU (FedLAW's fedlaw_optimization builds its
    weights with ``device='cuda'``)."""
    if str(kwargs.get("device", "")).startswith("cuda"):
        kwargs["device"] = "cpu"
    return tensor(*args, **kwargs)
