"""One client's local training, the code's and fedrepro's, on the same batches (FedLAW's clients).

fedrepro's side is its real trainer (``run.trainer.Trainer``, the sequential path) on a small generated
Fashion-MNIST-shaped problem: three clients of unequal sizes (so last batches are partial), the run's setting
that of FedLAW Table 3's FMNIST MLP cell under the code's protocol (params/fedlaw.yaml with
params/subsets/fedlaw_official_protocol.yaml: persistent client momentum, 30% held out, FedProx with the code's
optimiser, FedDyn in the code's form), shrunk to a few rounds, two local epochs and batches of 16. The harness
records, for every client in every round, the model it started from, the learning rate, each batch it drew (in
order) and the model it ended with.

The code's side is FedLAW's ``client_funct.Client_update``, unchanged, driving its own optimisers
(``utils.init_optimizer``: SGD with momentum and weight decay, or FedProx's ``PerturbedGradientDescent``), created
once per client as ``Node`` does, and its ``utils.lr_scheduler`` before every round, as ``main_baselines.py``
calls them. Each client node's ``local_data`` hands out, epoch by epoch, the batches fedrepro drew (the data
order pinned from outside; the tensors are the same, the data pipeline is compared apart). Before each round
the code's server model is set to fedrepro's global model of that round, so every round compares one client step
from the same start, while each side carries its own state across rounds (momentum buffers, FedDyn's gradient
state). The model is fedrepro's ``mlp`` module on both sides (the same function as the code's, compared apart).

Compared per round: the learning rate (the code's schedule against fedrepro's, exactly) and every client's
parameters after its local training, in float32 as both programs train, within the bound ``bound`` derives.
The code's protocol has small terms (FedProx's mu 0.001, FedDyn's alpha 0.01), so each of those two methods runs
again with its term at 0.5, where a wrong term shows far above the bound."""

from __future__ import annotations

import copy
import functools
import tempfile
from types import SimpleNamespace

import numpy as np
import torch

from fedrepro.parity.shim import checkout_on_path

SIZES = (45, 70, 29)  # each client's samples before the 30% hold-out
SHRUNK = {"num_clients": len(SIZES), "rounds": 3, "local_epochs": 2, "batch_size": 16, "device": "cpu"}
CASES = {  # fedrepro's method -> the code's client_method and the setting that gives its mu
    "fedavg": ("local_train", None),
    "fedprox": ("fedprox", ("fedprox", "mu")),
    "feddyn": ("feddyn", ("feddyn", "alpha")),
}
# The code's protocol has FedProx's mu = 0.001 and FedDyn's alpha = 0.01: terms a few rounding steps could hide.
# The same code and settings with the term made large, so a wrong term shows far above the bound.
STRONG = {"fedprox": {"fedprox": {"mu": 0.5}}, "feddyn": {"feddyn": {"alpha": 0.5}}}
EPS32 = float(torch.finfo(torch.float32).eps)
LR_RELATIVE = 1e-12  # the code multiplies its rate by the decay each round, fedrepro may take a power: float64


def fedlaw_code_settings() -> dict[str, dict]:
    """The Table 3 FMNIST MLP setting of each case under the code's protocol, shrunk (SHRUNK)."""
    from fedrepro.configure import expansion, paramsfile
    from fedrepro.configure.paramsfile import ROOT

    files = [str(ROOT / "params" / "fedlaw.yaml"), str(ROOT / "params" / "subsets" / "fedlaw_official_protocol.yaml")]
    found = {}
    for run in expansion.expand(paramsfile.load_params_files(files)):
        s = run.setting
        if run.experiment == "fedlaw_table3_fmnist" and s["model"] == "mlp" and s["algorithm"] in CASES:
            found.setdefault(s["algorithm"], {**copy.deepcopy(s), **SHRUNK})
    return found


def _problem(seed: int = 0):
    from fedrepro.data import TensorDataset

    rng = np.random.default_rng(seed)
    n = sum(SIZES)
    train = TensorDataset(
        torch.from_numpy(rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8)),
        torch.from_numpy(rng.integers(0, 10, n)),
        0.0,
        1.0,
    )
    test = TensorDataset(
        torch.from_numpy(rng.integers(0, 256, (260, 1, 28, 28), dtype=np.uint8)),
        torch.from_numpy(np.arange(260) % 10),
        0.0,
        1.0,
    )
    bounds = np.cumsum((0,) + SIZES)
    return train, test, [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


@functools.cache
def float64_dataset():
    """The TensorDataset class whose batches come in float64 (uint8 pixels / 255 are exact in float64): the data of
    the float64 oracles, here and in the tests' ``float64_engine``. Made on first use, so that importing this
    module does not import fedrepro.data."""
    from fedrepro.data import TensorDataset

    class Float64Dataset(TensorDataset):
        def batch(self, index):
            x, y = super().batch(index)
            return x.double(), y

        def subset(self, index):
            return Float64Dataset(self.images[index], self.labels[index], self.mean, self.std)

        def to(self, device):
            return Float64Dataset(self.images.to(device), self.labels.to(device), self.mean, self.std)

    return Float64Dataset


def generated_clients(sizes: tuple, shape: tuple, test_size: int, seed: int, dataset=None):
    """Random uint8 images and labels: clients of ``sizes`` samples (contiguous index ranges), then a test split of
    ``test_size`` drawn with them; ``dataset``: the TensorDataset class that holds them (one that hands out
    another dtype, say). Returns (train, test, each client's indices)."""
    from fedrepro.data import TensorDataset

    dataset = dataset or TensorDataset
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    images = torch.from_numpy(rng.integers(0, 256, (n + test_size, *shape), dtype=np.uint8))
    labels = torch.from_numpy(rng.integers(0, 10, n + test_size))
    train, test = dataset(images[:n], labels[:n], 0.0, 1.0), dataset(images[n:], labels[n:], 0.0, 1.0)
    bounds = np.cumsum((0, *sizes))
    return train, test, [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def record_local_training(trainer, log: list) -> None:
    """Wrap the trainer's local training so every client's run is appended to ``log``: its round and client, the
    model it started from, its rate, the batches it drew (epoch by epoch, as tensors) and the model it ended with."""
    local_train = trainer.local.train

    def recorded(run, data, index, epochs, batch_size, *args, **kwargs):
        drawn, batch = [], data.batch
        data.batch = lambda idx: (drawn.append(idx.clone()), batch(idx))[1]
        start, lr = run.x_global.clone(), run.lr
        try:
            result = local_train(run, data, index, epochs, batch_size, *args, **kwargs)
        finally:
            del data.batch
        per_epoch = -(-len(index) // batch_size)
        batches = [[batch(i) for i in drawn[e * per_epoch : (e + 1) * per_epoch]] for e in range(epochs)]
        log.append({"round": run.round, "client": run.client, "start": start, "lr": lr, "batches": batches,
                    "end": run.model.flat.clone()})  # fmt: skip
        return result

    trainer.local.train = recorded


def ours(setting: dict, problem=None, seed: int | None = None) -> list[dict]:
    """fedrepro's trainer on ``problem`` ((train, test, parts); default ``_problem()``); every client's local training
    as recorded. ``seed``: torch's global seed before the model is built, where the check wants its first draw."""
    from fedrepro import models
    from fedrepro.run.trainer import Trainer

    train, test, parts = problem or _problem()
    log = []
    with tempfile.TemporaryDirectory(prefix="fedrepro-parity-clients-") as tmp:
        if seed is not None:
            torch.manual_seed(seed)
        module = models.build(setting["model"], setting["dataset"])
        trainer = Trainer(setting, tmp, None, None, datasets=(train, test), parts=parts, module=module)
        trainer.cohort_mode = "off"  # the sequential path: the reference the batched path is tested against
        record_local_training(trainer, log)
        trainer.run(progress=False)
    return log


def _in_default_dtype(batch):
    """The inputs in torch's default dtype (float64 here; uint8 pixels / 255 convert exactly)."""

    def cast(index):
        x, y = batch(index)
        return x.to(torch.get_default_dtype()), y

    return cast


class _EpochBatches:
    """A client's ``local_data``: each iteration is the next epoch's pinned batches."""

    def __init__(self):
        self.epochs, self.current = [], []

    def __iter__(self):
        self.current = self.epochs.pop(0)
        return iter(self.current)

    def __len__(self):  # the code divides its summed loss by it after the epoch
        return len(self.current)


def code(checkout, setting: dict, log: list[dict]) -> list[dict]:
    """The code's clients on fedrepro's batches, round by round from fedrepro's global models."""
    from fedrepro import models

    method = setting["algorithm"]
    client_method, mu_key = CASES[method]
    cl = setting["client"]
    args = SimpleNamespace(
        client_method=client_method, server_method="fedavg", E=setting["local_epochs"], lr=cl["lr"],
        momentum=cl["momentum"], local_wd_rate=cl["weight_decay"], optimizer="sgd",
        mu=setting[mu_key[0]][mu_key[1]] if mu_key else 0.0,
    )  # fmt: skip
    with checkout_on_path(checkout):
        import client_funct
        import utils

        def vector(module):
            return torch.nn.utils.parameters_to_vector(module.parameters()).detach().clone()

        template = models.build(setting["model"], setting["dataset"])
        nodes = {}
        for c in range(setting["num_clients"]):
            model = copy.deepcopy(template)
            node = SimpleNamespace(model=model, args=copy.copy(args), local_data=_EpochBatches())
            node.optimizer = utils.init_optimizer(c, model, args)
            node.old_grad = torch.zeros_like(vector(model))
            nodes[c] = node
        central = SimpleNamespace(model=copy.deepcopy(template))
        rows = []
        for t in sorted({e["round"] for e in log}):
            entries = [e for e in log if e["round"] == t]
            utils.lr_scheduler(t, nodes, args)
            torch.nn.utils.vector_to_parameters(entries[0]["start"], central.model.parameters())
            for e in entries:
                nodes[e["client"]].local_data.epochs = [list(b) for b in e["batches"]]
            client_funct.Client_update(args, nodes, central)
            for e in entries:
                got = vector(nodes[e["client"]].model)
                scale = float(e["end"].abs().max())
                rows.append(
                    {
                        "round": t,
                        "client": e["client"],
                        "lr_code": float(nodes[e["client"]].optimizer.param_groups[0]["lr"]),
                        "lr_ours": float(e["lr"]),
                        "relative_gap": float((got - e["end"]).abs().max()) / scale,
                        "steps": sum(len(b) for b in e["batches"]),
                    }
                )
    return rows


def bound(steps: int) -> float:
    """The float32 gap two orders of the same client step can reach, relative to the largest parameter.

    Both sides compute the same gradient from the same parameters (the same module, inputs and kernels: FedAvg's
    case is bit for bit). They differ only in how a method's term is rounded into the step: FedLAW's code
    writes ``g + mu * (x - x_g)`` (FedProx) or builds the term into the loss (FedDyn), fedrepro adds it to the
    gradient with one fused ``add_(alpha=...)``; about four roundings a step, each within eps32 / 2 of a
    quantity no larger than the largest parameter here (a step moves a parameter by less than its size), so
    2 eps32 of the scale a step. A parameter gap then changes the later gradients a little (lr L < 1 over a
    few steps): twice that, over the ``steps`` steps of the client."""
    return 4 * steps * EPS32


def compare_fedlaw(checkout) -> list[dict]:
    results = []
    cases = [(m, s, "code protocol") for m, s in fedlaw_code_settings().items()]
    cases += [(m, merged(dict(cases_s), STRONG[m]), "term made large") for m, cases_s, _ in list(cases) if m in STRONG]
    for method, setting, label in cases:
        log = ours(setting)
        rows = code(checkout, setting, log)
        for row in rows:
            row["bound"] = bound(row["steps"])
        worst = max(r["relative_gap"] / r["bound"] for r in rows)
        lr_equal = all(abs(r["lr_code"] - r["lr_ours"]) <= LR_RELATIVE * r["lr_ours"] for r in rows)
        mu = CASES[method][1]
        detail = f", {mu[1]} {setting[mu[0]][mu[1]]:g}" if mu else ""
        results.append(
            {
                "case": f"{method} ({CASES[method][0]}{detail}), {label}",
                "rounds": setting["rounds"],
                "clients": setting["num_clients"],
                "relative_gap": max(r["relative_gap"] for r in rows),
                "gap_over_bound": worst,
                "lr_equal": lr_equal,
                "rows": rows,
                "status": "equal" if worst <= 1 and lr_equal else "differs",
            }
        )
    return results


def merged(setting: dict, overrides: dict) -> dict:
    """``setting`` with ``overrides`` laid over it, one level into nested sections."""
    out = copy.deepcopy(setting)
    for key, value in overrides.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) else value
    return out
