"""Parity shim: lets the authors' unchanged code run on a CPU-only machine.

Loaded automatically by Python (site imports `sitecustomize`) when
PYTHONPATH contains /work/parity/shim.  It changes nothing in the authors'
files; it only
  1. turns every CUDA placement into a no-op (the code calls .cuda(),
     torch.cuda.set_device and torch.tensor(..., device='cuda')
     unconditionally and this machine has no GPU);
  2. (PARITY_REMAP_ROOT="old=new") rewrites a hard-coded dataset root given
     to torchvision's FashionMNIST (FedLAW hard-codes /home/Dataset/...);
  3. adds a placeholder `LinearReg` to FedAWARE's model.py module (HEAD deleted
     the class but utils.py still imports it);
  4. (PARITY_LOG_ORDER=N) logs, for the first N calls of FedAWARE's
     FeedbackSampler.sample, the sampler's unsorted draw (last_sampled, the
     order global_update pairs uploads with) and the sorted list it returns
     (the order the serial trainer trains and uploads in).  Read-only.
All numerics stay as in the code; only the device changes.
"""
import os
import sys

if os.environ.get("PARITY_SHIM", "1") == "1":
    import torch

    def _cpu_device(dev):
        if dev is None:
            return None
        s = str(dev)
        return "cpu" if s.startswith("cuda") else dev

    torch.nn.Module.cuda = lambda self, *a, **k: self
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.set_device = lambda *a, **k: None

    _orig_tensor = torch.tensor

    def _tensor(*a, **k):
        if "device" in k:
            k["device"] = _cpu_device(k["device"])
        return _orig_tensor(*a, **k)

    torch.tensor = _tensor

    if os.environ.get("PARITY_PATCH_FEDLAB", "1") == "1":
      try:  # FedLab picks "the best GPU" with pynvml when cuda=True
        import fedlab.core.model_maintainer as _mm
        import fedlab.utils.functional as _ff
        _mm.get_best_gpu = lambda: torch.device("cpu")
        _ff.get_best_gpu = lambda: torch.device("cpu")
      except ImportError:
        pass

    remap = os.environ.get("PARITY_REMAP_ROOT")
    if remap:
        old, new = remap.split("=", 1)
        import torchvision

        _orig_init = torchvision.datasets.FashionMNIST.__init__

        def _init(self, root, *a, **k):
            if str(root).rstrip("/") == old.rstrip("/"):
                root = new
            _orig_init(self, root, *a, **k)

        torchvision.datasets.FashionMNIST.__init__ = _init

    n_log = int(os.environ.get("PARITY_LOG_ORDER", "0"))

    import importlib.abc
    import importlib.machinery

    def _patch_model(module):
        # FedAWARE @30836e9: utils.py does `from model import ToyCifarNet, LinearReg`
        # but that commit deleted LinearReg from model.py (it exists in every earlier
        # commit), so `import utils` fails.  LinearReg is used nowhere else; a
        # placeholder name lets the import succeed without changing any computation.
        if not hasattr(module, "LinearReg"):
            class LinearReg:  # placeholder, never instantiated by the FMNIST paths
                def __init__(self, *a, **k):
                    raise RuntimeError("parity shim: LinearReg placeholder used")
            module.LinearReg = LinearReg

    def _patch_utils(module):
        cls = getattr(module, "FeedbackSampler", None)
        if cls is None or n_log <= 0:
            return
        orig_sample = cls.sample
        calls = [0]

        def sample(self, *a, **k):
            out = orig_sample(self, *a, **k)
            if calls[0] < n_log:
                drawn = [int(i) for i in self.last_sampled[0]]
                trained = [int(i) for i in out]
                mism = sum(1 for x, y in zip(drawn, trained) if x != y)
                print("PARITY_ORDER round={} last_sampled={} trained_order={} "
                      "positions_mismatched={}/{}".format(
                          calls[0], drawn, trained, mism, len(trained)), flush=True)
            calls[0] += 1
            return out

        cls.sample = sample

    _PATCHES = {"model": _patch_model, "utils": _patch_utils}

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in _PATCHES:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or not spec.origin or "/FedAWARE/" not in spec.origin:
                return spec
            orig_exec = spec.loader.exec_module

            def exec_module(module):
                orig_exec(module)
                _PATCHES[name](module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Hook())
