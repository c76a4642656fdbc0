"""Importing an authors' checkout unchanged: its folder first on sys.path while its modules load, its top-level
module names (``model``, ``utils``, ``models``...) cleared before and after so two checkouts never share one,
and the few things its HEAD needs that this machine lacks (CUDA, mpi4py) shimmed without touching its files."""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
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


@contextlib.contextmanager
def numpy_compat():
    """``numpy.compat`` where NumPy 2 removed it, holding the one name an authors' code reads from it (IMA's
    ``DigitsDataset`` casts its labels with ``np.compat.long``, which NumPy 1 defined as Python's ``int``)."""
    import numpy

    added = not hasattr(numpy, "compat")
    if added:
        numpy.compat = types.SimpleNamespace(long=int)
    try:
        yield
    finally:
        if added:
            del numpy.compat


@contextlib.contextmanager
def pandas_positional_getitem():
    """``series[i]`` with an integer on a non-integer index read by position, as pandas before 3.0 did (with a
    FutureWarning; 3.0 raises KeyError): IMA's ``utils.sampling.testset_sampling`` reads a client's class counts
    as ``df.iloc[i][k]`` from a row labelled ``class0``, ``class1``, ... The rule is pandas 2's own: an integer
    key, and an index that falls back to positions (``Index._should_fallback_to_positional``)."""
    import pandas

    original = pandas.Series.__getitem__

    def getitem(self, key):
        if pandas.api.types.is_integer(key) and self.index._should_fallback_to_positional:
            return self._values[key]
        return original(self, key)

    pandas.Series.__getitem__ = getitem
    try:
        yield
    finally:
        pandas.Series.__getitem__ = original


class _SummaryWriter:
    """torch.utils.tensorboard's writer where tensorboard is absent: makes its folder (the scripts write their
    config there), records nothing."""

    def __init__(self, log_dir=None, *args, **kwargs):
        os.makedirs(log_dir, exist_ok=True)

    def add_scalar(self, *args, **kwargs):
        pass

    def close(self):
        pass


@contextlib.contextmanager
def script_surroundings(folder: Path, folders: tuple[str, ...] = ()):
    """What an authors' script run as ``__main__`` needs around it: ``folder`` (a scratch folder) as the working
    directory with ``folders`` made below it (the data-set folders FedAWARE's code writes into but never makes),
    a SummaryWriter where tensorboard is absent, torch.load with ``weights_only`` off (FedLab pickles its
    partitions; TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD); all restored."""
    cwd, env = os.getcwd(), os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    saved = {name: sys.modules.get(name) for name in ("torch.utils.tensorboard",)}
    for sub in folders:
        (folder / sub).mkdir(parents=True, exist_ok=True)
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("torch.utils.tensorboard")
        stand_in.SummaryWriter = _SummaryWriter
        sys.modules["torch.utils.tensorboard"] = stand_in
    os.chdir(folder)
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
        if env is not None:
            os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = env
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
