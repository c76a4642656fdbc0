"""One server step of each method FedLAW's code runs (``server_funct.py``: FedLAW's weight learning and its SWA
form, FedAvg, FedDF, FedBE, Server-FT, FedDyn), the code's and fedrepro's, from the same client models.

The code's functions run unchanged (``fedlaw_optimization`` and ``fedlaw_generate_global_model`` as
``main_fedlaw.py`` calls them, ``Server_update`` as ``main_baselines.py`` does) on its own MLP (``models_dict``,
FMNIST's 784-200-200-10), five clients of unequal sizes, two rounds (the server optimiser's momentum and FedDyn's
state carry over), and a generated proxy set of 200 images in the shape its loaders give (1x28x28, 20 per class,
the code's 2% of the test set). fedrepro's method is built by its registry from the setting that
``params/fedlaw.yaml`` with ``params/subsets/fedlaw_official_protocol.yaml`` resolves for Table 3's FMNIST MLP
(so the case compares the code with ours at the code's protocol: 200 proxy samples, 20 server epochs, the
central node's SGD for the distillation baselines, FedDyn's ``fedlaw_code`` form); a case run at another of our
settings says so in its name. Each round starts from the code's global model on both sides, so a difference
shows in the round where it arises.

Pinned from outside: the code's central node iterates its proxy ``DataLoader`` (shuffled by torch's global
stream) once per server epoch; here it iterates the batches fedrepro draws for that epoch
(``proxy.epoch_batches`` on the round's generator), so both programs take the same batches in the same order.
FedBE's SWAG sample draws ``torch.randn_like`` per parameter tensor; those draws are ours (the slices of the
round's ``swag`` stream). Everything runs in float64.

Bounds. FedAvg, FedDyn and FedAdam are the same arithmetic up to the order of sums: 1e-12 relative, as servers.py. The
other methods run an optimiser loop (Adam on FedLAW's gamma and lambda logits, SGD on the distilled or
fine-tuned model) of S <= 40 steps (20 epochs x 2 batches). Per step the two programs' updates differ only by the
order of their sums: at most n u of the step, n <= 784 terms (the first layer's dot products), u = 1.1e-16 in
float64, so about 1e-13 of a step no larger than the model's scale here. Over S steps these add to at most
S x 1e-13 = 4e-12 of the model's scale, before the loop carries earlier errors on through the loss's curvature
(and Adam's normalisation). The bound, 1e-9 of the model's largest entry, leaves a factor 250 for that growth and
lies far below any real difference (the SWA order moves the model by about 1e-2 of its scale). Each loop case also
records its rounding floor: fedrepro against itself with the cohort in reverse order, the same step with other
sums, which shows how far rounding alone moves it."""

from __future__ import annotations

import copy
import functools
import importlib
from types import SimpleNamespace

import numpy as np
import torch

from fedrepro.algorithms import BuildContext
from fedrepro.algorithms.proxy import epoch_batches, round_generator
from fedrepro.parity.shim import checkout_on_path

RELATIVE = 1e-12  # the same arithmetic up to the order of sums
LOOP = 1e-9  # an optimiser loop of S <= 40 steps (module docstring)
SIZES = (120, 340, 75, 500, 210)  # the five clients' sample counts
PROXY_PER_CLASS, CLASSES = 20, 10  # the code's 2% of FMNIST's test set, class-balanced
ROUNDS = 2
SPREAD = 0.02  # client models: the global model plus SPREAD * N(0, 1) per entry
PROTOCOL = ("params/fedlaw.yaml", "params/subsets/fedlaw_official_protocol.yaml")

# case -> (our algorithm, our variant or None, overrides of our setting, the code's server_method, its args)
CASES = {
    "FedLAW, gamma and lambda (code's protocol)": ("fedlaw", "fedlaw", {}, "fedlaw", {"whether_swa": "none"}),
    "FedLAW (SWA), lambda first (code's order)": ("fedlaw", "swa", {}, "fedlaw", {"whether_swa": "swa"}),
    "FedLAW (SWA), gamma first (paper's order)": (
        "fedlaw",
        "swa",
        {"fedlaw": {"swa_order": "gamma_first"}},
        "fedlaw",
        {"whether_swa": "swa"},
    ),
    "FedAvg": ("fedavg", None, {}, "fedavg", {}),
    "FedDF (code's protocol)": ("feddf", None, {}, "feddf", {}),
    "FedBE (code's protocol)": ("fedbe", None, {}, "fedbe", {}),
    "Server-FT (code's protocol)": ("serverft", None, {}, "finetune", {}),
    "FedDyn server state (code's form)": ("feddyn", None, {}, "feddyn", {"client_method": "feddyn"}),
    # in no table of the paper; its server lr as the code's comment suggests (its default, 1, steps by 1 per entry)
    "FedAdam, server lr 0.01 (no table runs it)": (
        "fedadam",
        None,
        {"server": {"lr": 0.01}},
        "fedadam",
        {"fedadam_server_lr": 0.01},
    ),
    "FedDyn server state (paper's form)": (
        "feddyn",
        None,
        {"feddyn": {"form": "paper"}},
        "feddyn",
        {"client_method": "feddyn"},
    ),
}
LOOPS = {"fedlaw", "feddf", "fedbe", "serverft"}


@functools.lru_cache(maxsize=1)
def _protocol_settings() -> dict:
    """Our resolved settings of Table 3's FMNIST MLP cell under the code's protocol, by (algorithm, variant)."""
    from fedrepro.configure import expansion, paramsfile

    runs = expansion.expand(paramsfile.load_params_files([str(paramsfile.ROOT / p) for p in PROTOCOL]))
    out = {}
    for r in runs:
        s = r.setting
        if r.experiment == "fedlaw_table3_fmnist" and s["model"] == "mlp" and s["dataset"] == "fmnist":
            key = (s["algorithm"], s["fedlaw"]["variant"] if s["algorithm"] == "fedlaw" else None)
            out.setdefault(key, s)
    return out


def our_setting(algorithm: str, variant, overrides: dict) -> dict:
    """The protocol's setting of the method; a method no table of the paper runs (FedAdam) takes FedAvg's,
    resolved again under its own name."""
    from fedrepro.configure import settings

    known = (algorithm, variant) in _protocol_settings()
    setting = copy.deepcopy(_protocol_settings()[(algorithm, variant) if known else ("fedavg", None)])
    setting["algorithm"] = algorithm
    for section, values in overrides.items():
        setting[section].update(values)
    return setting if known else settings.resolve(setting)


def code_args(method: str, extra: dict, setting: dict) -> SimpleNamespace:
    """The code's args (args.py's defaults, which Table 3's commands keep) for FMNIST's MLP."""
    server_epochs = setting[setting["algorithm"]]["server_epochs"] if setting["algorithm"] in LOOPS else 20
    args = {
        "dataset": "fmnist",
        "local_model": "MLP",
        "server_method": method,
        "client_method": "local_train",
        "server_epochs": server_epochs,
        "server_optimizer": "adam",
        "server_funct": "exp",
        "whether_swa": "none",
        "optimizer": "sgd",
        "lr": 0.08,
        "momentum": 0.9,
        "local_wd_rate": 5e-4,
        "mu": 0.01,  # Table 3's FedDyn command: --mu 0.01 (FedDyn's alpha)
        "fedadam_server_lr": 1.0,
        "node_num": len(SIZES),
    }
    return SimpleNamespace(**{**args, **extra})


class PinnedBatches:
    """The proxy set as the code's central node iterates it (``validate_set``): each pass yields the batches
    fedrepro draws for that server epoch from the round's generator, in place of the code's shuffling loader."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, generator: torch.Generator):
        self.x, self.y, self.batch_size, self.generator = x, y, batch_size, generator

    def __iter__(self):
        for index in epoch_batches(len(self.y), self.batch_size, self.generator, "cpu"):
            yield self.x[index], self.y[index]


def _inputs(seed: int = 0):
    """The proxy set (images, labels), and per round the client models' noise."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(CLASSES).repeat(PROXY_PER_CLASS)[torch.randperm(CLASSES * PROXY_PER_CLASS, generator=g)]
    images = torch.randn(len(labels), 1, 28, 28, generator=g, dtype=torch.float64)
    return images, labels, g


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def _set(model: torch.nn.Module, w: torch.Tensor) -> torch.nn.Module:
    torch.nn.utils.vector_to_parameters(w.clone(), model.parameters())
    return model


def _code_round(code, args, central, x, clients, images, labels, generator, seed_round):
    """One server step of the code from global model x and the client models; returns its new global model."""
    method, sizes = args.server_method, [n / sum(SIZES) for n in SIZES]
    nodes = {i: SimpleNamespace(model=_set(code.init_model("MLP", args), w)) for i, w in enumerate(clients)}
    select = list(range(len(clients)))
    central.validate_set = PinnedBatches(images, labels, 128, generator)  # args.py's validate_batchsize
    if method == "fedbe":
        return _with_our_swag_draws(code, args, central, nodes, select, sizes, x, seed_round)
    if method == "fedlaw":
        agg_weights, params = code.receive_client_models(args, nodes, select, sizes)
        gamma, weights = code.fedlaw_optimization(args, agg_weights, params, central)
        central = code.fedlaw_generate_global_model(gamma, weights, params, central)
        learned = (float(torch.as_tensor(gamma).detach()), np.asarray(weights, float))
        return central, central.model.get_param(clone=True).detach(), learned
    central = code.Server_update(args, central, nodes, select, sizes)
    return central, _flat(central.model), None


def _with_our_swag_draws(code, args, central, nodes, select, sizes, x, seed_round):
    """FedBE's round with the SWAG sample's ``torch.randn_like`` draws (one per parameter tensor, in the
    state_dict's order) taken from our ``swag`` stream of the round, as fedbe.py draws its eps."""
    eps = torch.randn(x.shape, generator=round_generator(*seed_round, "swag"), dtype=x.dtype)
    slices = iter(eps.split([p.numel() for p in central.model.parameters()]))
    original = torch.randn_like
    torch.randn_like = lambda like, *a, **k: next(slices).view_as(like).clone()
    try:
        central = code.Server_update(args, central, nodes, select, sizes)
    finally:
        torch.randn_like = original
    return central, _flat(central.model), None


def _ours_round(algorithm, t, x, clients, order):
    from fedrepro.parts import RoundUpdates

    k = len(clients)
    updates = RoundUpdates(
        t,
        torch.tensor(order),
        x - clients[order],
        torch.tensor([float(SIZES[i]) for i in order], dtype=torch.float64),
        torch.zeros(k),
        torch.zeros(k),
        0.08,
    )
    x_new = algorithm.server_step(x, updates)
    info = updates.info
    gamma = info.get("gamma")
    weights = info.get("weights")
    if weights is not None and order != sorted(order):
        weights = weights[np.argsort(order)]
    return x_new, gamma, weights


def _build_ours(setting, module, images, labels):
    ctx = BuildContext(
        len(SIZES),
        sum(p.numel() for p in module.parameters()),
        torch.device("cpu"),
        torch.tensor(SIZES, dtype=torch.float64),
        module,
        (images, labels),
    )
    return importlib.import_module(f"fedrepro.algorithms.{setting['algorithm']}").build(setting, ctx)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / a.abs().max())


def run_case(checkout, name: str, perturb=None) -> dict:
    """The case's two rounds on both sides. ``perturb`` (tests): a function applied to our new global model."""
    from fedrepro import models

    algorithm, variant, overrides, method, extra = CASES[name]
    setting = our_setting(algorithm, variant, overrides)
    args = code_args(method, extra, setting)
    images, labels, noise = _inputs()
    with checkout_on_path(checkout):
        code = SimpleNamespace(
            **{**vars(importlib.import_module("utils")), **vars(importlib.import_module("server_funct"))}
        )
        torch.manual_seed(0)
        central_model = code.init_model("MLP", args)
        central = SimpleNamespace(model=central_model, optimizer=code.init_optimizer(-1, central_model, args))
        for state in {"feddyn": ["server_state"], "fedadam": ["m", "v"]}.get(method, []):
            zeros = copy.deepcopy(central_model)  # as the code's Node builds them: the model's copy, zeroed
            for p in zeros.parameters():
                p.data = torch.zeros_like(p.data)
            setattr(central, state, zeros)
        ours = _build_ours(setting, models.build("mlp", "fmnist").double(), images, labels)
        floor = _build_ours(setting, models.build("mlp", "fmnist").double(), images, labels)
        x = _flat(central.model)
        gaps, floors, gamma_gaps, weight_gaps, steps = [], [], [], [], []
        for t in range(ROUNDS):
            clients = x + SPREAD * torch.randn(len(SIZES), len(x), generator=noise, dtype=torch.float64)
            seed = setting["seed"]
            central, code_x, learned = _code_round(
                code, args, central, x, clients, images, labels, round_generator(seed, t), (seed, t)
            )
            ours_x, gamma, weights = _ours_round(ours, t, x, clients, list(range(len(SIZES))))
            if perturb is not None:
                ours_x = perturb(ours_x)
            gaps.append(_relative(code_x, ours_x))
            # how far the code's step moved the model: a case that moves nothing proves nothing
            steps.append(_relative(code_x, x))
            if learned is not None:
                gamma_gaps.append(abs(learned[0] - gamma) / abs(learned[0]))
                weight_gaps.append(float(np.abs(learned[1] - weights.numpy()).max()))
            if algorithm in LOOPS:
                floor_x, _, _ = _ours_round(floor, t, x, clients, list(reversed(range(len(SIZES)))))
                floors.append(_relative(ours_x, floor_x))
            x = code_x.clone()  # both sides start the next round from the code's global model
    bound = LOOP if algorithm in LOOPS else RELATIVE
    row = {
        "method": algorithm if variant in (None, "fedlaw") else f"{algorithm} ({variant})",
        "case": name,
        "code": f"server_funct {'fedlaw_optimization' if method == 'fedlaw' else 'Server_update'} ({method})",
        "rounds": ROUNDS,
        "clients": list(SIZES),
        "relative_gap": max(gaps),
        "gap_by_round": gaps,
        "bound": bound,
        "smallest_step": min(steps),
        "status": "equal" if max(gaps) <= bound and min(steps) > 0 else "differs",
    }
    if floors:
        row["rounding_floor"] = max(floors)
    if gamma_gaps:
        row["gamma_relative_gap"], row["lambda_gap"] = max(gamma_gaps), max(weight_gaps)
    return row


def compare_fedlaw(checkout) -> list[dict]:
    torch.set_default_dtype(torch.float64)
    try:
        return [run_case(checkout, name) for name in CASES]
    finally:
        torch.set_default_dtype(torch.float32)
