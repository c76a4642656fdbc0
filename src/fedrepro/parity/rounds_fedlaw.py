"""Whole rounds of FedLAW's code and of fedrepro, compared round by round: the code's main script run unchanged.

The code's side is ``main_fedlaw.py`` (FedLAW) or ``main_baselines.py`` (FedAvg, FedDyn, FedProx, FedDF,
Server-FT), run as a script
(``runpy``, ``__name__ == "__main__"``) with its own arguments: its ``Data`` reads generated Fashion-MNIST idx
files and draws its own Dirichlet split, its ``Node``s hold out 30% of each client and a class-balanced proxy of the
test set (200 images: 0.5 of the generated 400, where FMNIST's 2% gives 200), and its loop calls, in its order,
``lr_scheduler``, ``Client_update`` (every client; ``select_ratio`` 1, Table 3's, so every client is aggregated),
``Client_validate``, the server step (``receive_client_models``, ``fedlaw_optimization``,
``fedlaw_generate_global_model``, or ``Server_update``) and ``validate``. fedrepro's side is its real trainer (the
sequential path) at the setting params/fedlaw.yaml with params/subsets/fedlaw_official_protocol.yaml resolves for
Table 3's FMNIST MLP (the code's protocol: persistent momentum, 30% held out, 200 proxy images, 20 server epochs,
FedDyn's ``fedlaw_code`` form) on the code's own three clients of unequal sizes, 4 rounds, two local epochs of
batches of 16; the rest are the code's hyperparameters (lr 0.08 decayed by 0.99 a round, momentum 0.9, weight
decay 5e-4, FedDyn's alpha 0.01, FedLAW's server lr 0.005).

Pinned from outside, by names in the code's modules (never its files): ``Node`` is a subclass that, after the
code's own ``__init__``, records its training and proxy sizes and hands each client the batches fedrepro drew
for it and the central node the proxy batches fedrepro's FedLAW (or FedDF, Server-FT) drew, epoch by epoch (its
evaluation loaders give the same samples in float64); ``Client_update`` first loads fedrepro's global model of
the round into the central node, so each round starts from the same model on both sides while each side carries
its own state (momentum buffers, FedDyn's client and server states); ``validate`` records the global model the
script scores.

Every case runs in float64 (torch's default dtype; fedrepro's weights and samples as the tests'
``float64_engine``): FedLAW's server step is 40 Adam steps whose float32 rounding has no useful bound, in float64
the bound of ``parity.servers_fedlaw`` (FedDF's and Server-FT's distillation and fine-tuning loops too); FedAvg,
FedDyn and FedProx run in float32 too, as the programs train. FedBE is not run over whole rounds: its Gaussian
draws of client models would need pinning inside the code's ``fedbe`` (its server step is compared with them
pinned, ``servers_fedlaw``). Each case
records how many bounds a 1% change of its method's term moves the global model (``one_percent``)."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import random
import runpy
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from fedrepro.parity import generated
from fedrepro.parity.clients import LR_RELATIVE, _EpochBatches, float64_dataset, record_local_training
from fedrepro.parity.servers_fedlaw import LOOP
from fedrepro.parity.shim import checkout_on_path

EPS = {torch.float64: float(torch.finfo(torch.float64).eps), torch.float32: float(torch.finfo(torch.float32).eps)}
TRAIN, TEST = 300, 400  # generated samples; the code's proxy is server_valid_ratio of the test set
VALID_RATIO = 0.5  # 200 of 400: the code's 200-image proxy (2% of FMNIST's 10,000) on the generated test set
DIRICHLET = {"alpha": 0.1, "seed": 10}  # Table 3's Dir(0.1) and its seed 10: the code splits 300 samples 209, 62, 29
SHRUNK = {"num_clients": 3, "participation": 1.0, "rounds": 4, "local_epochs": 2, "batch_size": 16, "device": "cpu"}
# our method -> (the code's script, its method arguments, the term a 1% change of which the case records)
CASES = {
    "fedavg": ("main_baselines.py", ["--server_method", "fedavg", "--client_method", "local_train"], ("server", "lr")),
    "fedlaw": ("main_fedlaw.py", [], ("fedlaw", "server_lr")),
    "feddyn": ("main_baselines.py", ["--server_method", "feddyn", "--client_method", "feddyn"], ("feddyn", "alpha")),
    "fedprox": ("main_baselines.py", ["--server_method", "fedavg", "--client_method", "fedprox"], ("fedprox", "mu")),
    "feddf": ("main_baselines.py", ["--server_method", "feddf", "--client_method", "local_train"], ("feddf", "lr")),
    "serverft": (
        "main_baselines.py", ["--server_method", "finetune", "--client_method", "local_train"], ("serverft", "lr")),
}  # fmt: skip

# the switches between the paper's protocol and the code's each case runs at the code's value
COMMON = [("client", "keep_momentum"), ("client", "holdout"), ("evaluation", "proxy_holdout")]
SWITCHES = {"fedavg": COMMON, "fedlaw": COMMON + [("fedlaw", "server_epochs")], "feddyn": COMMON + [("feddyn", "form")],
            "fedprox": COMMON, "feddf": COMMON + [("feddf", "server_epochs")],
            "serverft": COMMON + [("serverft", "server_epochs")]}  # fmt: skip
# as the programs train: in float32 the methods whose server step has a rounding bound (FedLAW's Adam loop has none)
FLOAT32 = ("fedavg", "feddyn", "fedprox")
# ours at the paper's value of a switch, against the code: what the switch does over whole rounds
PAPER_FORMS = {
    "fedavg, momentum reset every round (paper; client.keep_momentum: false)": (
        "fedavg", {"client": {"keep_momentum": False}}),
    "feddyn, paper's form (feddyn.form: paper)": ("feddyn", {"feddyn": {"form": "paper"}}),
}  # fmt: skip


def code_protocol_settings() -> dict[str, dict]:
    """Table 3's FMNIST MLP setting of each case under the code's protocol, shrunk (SHRUNK)."""
    from fedrepro.configure import expansion, paramsfile
    from fedrepro.configure.paramsfile import ROOT

    files = [str(ROOT / "params" / "fedlaw.yaml"), str(ROOT / "params" / "subsets" / "fedlaw_official_protocol.yaml")]
    found = {}
    for run in expansion.expand(paramsfile.load_params_files(files)):
        s = run.setting
        plain = s["algorithm"] != "fedlaw" or s["fedlaw"]["variant"] == "fedlaw"
        if run.experiment == "fedlaw_table3_fmnist" and s["model"] == "mlp" and s["algorithm"] in CASES and plain:
            found.setdefault(s["algorithm"], {**copy.deepcopy(s), **SHRUNK})
    return found


def write_fmnist(root: Path, seed: int = 0, train: int = TRAIN, test: int = TEST) -> None:
    """Fashion-MNIST idx files of ``train`` and ``test`` samples, every class equally often in the test set (the
    code's class-balanced proxy needs 20 of each)."""
    rng = np.random.default_rng(seed)
    raw = Path(root) / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", train), ("t10k", test)):
        labels = rng.permutation(np.arange(n) % 10).astype(np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            generated._idx(rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), 3)
        )
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(generated._idx(labels, 1))


def _read(root: Path, prefix: str, dtype):
    from fedrepro.data import TensorDataset

    raw = Path(root) / "FashionMNIST" / "raw"
    images = np.frombuffer((raw / f"{prefix}-images-idx3-ubyte").read_bytes()[16:], np.uint8).reshape(-1, 1, 28, 28)
    labels = np.frombuffer((raw / f"{prefix}-labels-idx1-ubyte").read_bytes()[8:], np.uint8).astype(np.int64)
    made = float64_dataset() if dtype == torch.float64 else TensorDataset
    return made(torch.from_numpy(images.copy()), torch.from_numpy(labels), 0.0, 1.0)


def code_partition(checkout, root: Path) -> list[np.ndarray]:
    """The code's own Dirichlet split of the generated training set (``datasets.Data``, its seed)."""
    from types import SimpleNamespace

    args = SimpleNamespace(dataset="fmnist", node_num=SHRUNK["num_clients"], iid=0, random_seed=DIRICHLET["seed"],
                           dirichlet_alpha=DIRICHLET["alpha"], dirichlet_alpha2=False,
                           longtail_clients="none")  # fmt: skip
    with checkout_on_path(checkout), generated.on_generated(root, _NO_CIFAR):
        import datasets

        groups = datasets.Data(args).groups
    return [np.asarray(groups[k], dtype=np.int64) for k in range(len(groups))]


_NO_CIFAR = {"cifar10": {}, "cifar100": {}}  # on_generated's CIFAR checksums: none written here


def ours(setting: dict, root: Path, parts: list[np.ndarray], dtype=torch.float64) -> dict:
    """fedrepro's run in ``dtype``: every client's local training, the global model after every round and the
    proxy batches FedLAW drew, epoch by epoch."""
    from fedrepro import models
    from fedrepro.algorithms import fedlaw as fedlaw_module
    from fedrepro.run import trainer as trainer_module

    log, globals_, proxy_draws = [], [], {}
    from fedrepro.algorithms import proxy as proxy_module

    build, draw = trainer_module.run_inputs.build, fedlaw_module.epoch_batches
    current = {"round": 0}

    def build_float64(*args, **kwargs):
        inputs = build(*args, **kwargs)
        inputs.client_sizes = inputs.client_sizes.to(dtype)
        return inputs

    def recorded_draw(*args, **kwargs):
        batches = draw(*args, **kwargs)
        proxy_draws.setdefault(current["round"], []).append(batches)
        return batches

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    trainer_module.run_inputs.build, fedlaw_module.epoch_batches = build_float64, recorded_draw
    proxy_module.epoch_batches = recorded_draw  # FedDF's and Server-FT's proxy loops
    try:
        with tempfile.TemporaryDirectory(prefix="fedrepro-parity-fedlaw-rounds-") as tmp:
            torch.manual_seed(setting["seed"])
            module = models.build(setting["model"], setting["dataset"])
            datasets = (_read(root, "train", dtype), _read(root, "t10k", dtype))
            trainer = trainer_module.Trainer(setting, tmp, None, None, datasets=datasets, parts=parts, module=module)
            trainer.cohort_mode = "off"  # the sequential path: the reference the batched path is tested against
            record_local_training(trainer, log)
            round_ = trainer.round

            def round_and_global(t):
                current["round"] = t
                row = round_(t)
                globals_.append(trainer.model.flat.clone())
                return row

            trainer.round = round_and_global
            trainer.run(progress=False)
            aggregator = trainer.algorithm.aggregator
            proxy = (getattr(aggregator, "proxy_x", None), getattr(aggregator, "proxy_y", None))
            held = trainer.inputs.proxy  # the comparison's proxy hold-out, whether or not the method trains on it
    finally:
        trainer_module.run_inputs.build, fedlaw_module.epoch_batches = build, draw
        proxy_module.epoch_batches = draw
        torch.set_default_dtype(default)
    proxy_epochs = {
        t: [[(proxy[0][i], proxy[1][i]) for i in epoch] for epoch in epochs] for t, epochs in proxy_draws.items()
    }
    trained = {e["client"]: sum(len(b[1]) for b in e["batches"][0]) for e in log if e["round"] == 0}
    return {"log": log, "globals": globals_, "proxy_epochs": proxy_epochs, "trained": trained,
            "proxy_size": 0 if held is None else len(held.labels)}  # fmt: skip


class _InDefaultDtype:
    """One of the code's evaluation loaders, its inputs in torch's default dtype."""

    def __init__(self, loader):
        self.loader, self.dataset = loader, loader.dataset

    def __iter__(self):
        return ((x.to(torch.get_default_dtype()), y) for x, y in self.loader)


def code_argv(script: str, method_args: list[str], setting: dict) -> list[str]:
    """The script's command line: the code's protocol (its defaults, as Table 3's commands keep them) on three
    clients, our shrunk rounds, epochs and batch size, and the setting's hyperparameters."""
    cl = setting["client"]
    args = [script, "--dataset", "fmnist", "--local_model", "MLP", "--node_num", str(setting["num_clients"]),
            "--T", str(setting["rounds"]), "--E", str(setting["local_epochs"]),
            "--batchsize", str(setting["batch_size"]),
            "--random_seed", str(DIRICHLET["seed"]), "--dirichlet_alpha", str(DIRICHLET["alpha"]),
            "--lr", repr(cl["lr"]), "--momentum", repr(cl["momentum"]), "--local_wd_rate", repr(cl["weight_decay"]),
            "--server_valid_ratio", repr(VALID_RATIO), "--device", "0"]  # fmt: skip
    if setting["algorithm"] in ("feddyn", "fedprox"):  # the code's one --mu: FedDyn's alpha, FedProx's mu
        mu = setting["feddyn"]["alpha"] if setting["algorithm"] == "feddyn" else setting["fedprox"]["mu"]
        args += ["--mu", repr(mu)]
    if setting["algorithm"] in ("fedlaw", "feddf", "serverft"):
        args += ["--server_epochs", str(setting[setting["algorithm"]]["server_epochs"])]
    return args + method_args


@contextlib.contextmanager
def _global_state():
    """What the script changes in the process (its seeds, cudnn's flag, CUDA_VISIBLE_DEVICES, argv), restored."""
    saved = (torch.get_rng_state(), np.random.get_state(), random.getstate(), torch.backends.cudnn.deterministic,
             os.environ.get("CUDA_VISIBLE_DEVICES"), list(sys.argv), torch.get_default_dtype())  # fmt: skip
    try:
        yield
    finally:
        torch.set_rng_state(saved[0]), np.random.set_state(saved[1]), random.setstate(saved[2])
        torch.backends.cudnn.deterministic, sys.argv[:] = saved[3], saved[5]
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        os.environ.update({} if saved[4] is None else {"CUDA_VISIBLE_DEVICES": saved[4]})
        torch.set_default_dtype(saved[6])


def code(checkout, setting: dict, root: Path, run: dict, dtype=torch.float64) -> dict:
    """The code's main script on fedrepro's batches and round-start models; what it computed, round by round."""
    script, method_args, _ = CASES[setting["algorithm"]]
    record = {"globals": [], "clients": [], "rates": {}, "trained": {}, "proxy_size": None}
    starts = {e["round"]: e["start"] for e in run["log"]}
    clients = {k: _EpochBatches() for k in range(setting["num_clients"])}
    proxy = _EpochBatches()
    with _global_state(), checkout_on_path(checkout), generated.on_generated(root, _NO_CIFAR):
        import client_funct
        import nodes
        import utils

        flat_model = setting["algorithm"] == "fedlaw"  # the script builds its *_fedlaw models, one flat vector

        def vector(model) -> torch.Tensor:
            if flat_model:
                return model.get_param(clone=True).detach()
            return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()

        class PinnedNode(nodes.Node):
            def __init__(self, num_id, local_data, train_set, args):
                super().__init__(num_id, local_data, train_set, args)
                if num_id == -1:
                    record["proxy_size"] = len(self.validate_set.dataset)
                    self.validate_set, self.local_data = proxy, _InDefaultDtype(self.local_data)
                else:
                    record["trained"][num_id] = len(self.local_data.dataset)
                    self.validate_set, self.local_data = _InDefaultDtype(self.validate_set), clients[num_id]

        update, validate = client_funct.Client_update, utils.validate

        def update_from_ours(args, client_nodes, central_node):
            t = len(record["globals"])
            if flat_model:
                central_node.model.load_param(starts[t].clone())
            else:
                torch.nn.utils.vector_to_parameters(starts[t].clone(), central_node.model.parameters())
            for e in run["log"]:
                if e["round"] == t:
                    clients[e["client"]].epochs = [list(b) for b in e["batches"]]
            proxy.epochs = [list(b) for b in run["proxy_epochs"].get(t, [])]
            record["rates"][t] = {k: float(n.optimizer.param_groups[0]["lr"]) for k, n in client_nodes.items()}
            out = update(args, client_nodes, central_node)
            record["clients"].append({k: vector(n.model) for k, n in client_nodes.items()})
            return out

        def validate_recorded(args, node, which_dataset="validate"):
            if which_dataset == "local":  # the script scores the central node after its server step
                record["globals"].append(vector(node.model))
            return validate(args, node, which_dataset)

        # the script imports these names from nodes, utils and client_funct (which re-exports Node and validate)
        nodes.Node = client_funct.Node = PinnedNode
        client_funct.Client_update = update_from_ours
        utils.validate = client_funct.validate = validate_recorded
        torch.set_default_dtype(dtype)
        sys.argv[:] = code_argv(script, method_args, setting)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            runpy.run_path(str(Path(checkout) / script), run_name="__main__")
    record["printed_last"] = printed.getvalue().strip().splitlines()[-1]
    record["argv"] = code_argv(script, method_args, setting)[1:]
    return record


def bounds(setting: dict, log: list[dict], eps: float) -> list[float]:
    """Per round, the gap the two programs' global models can reach, relative to the largest entry.

    Clients: the same SGD on the same batches from the same start, each side rounding a method's term in its own
    order (``parity.clients.bound``'s argument, 4 u a step), over every step the client has taken so far (its
    momentum buffer, FedDyn's gradient state carry rounding from earlier rounds). Server: FedAvg and FedDyn a
    weighted mean of K models (K products and K sums, 2 roundings each, the weights' sum and division: 4K + 4 u),
    FedDyn's state besides (the cohort's weighted delta and the state's update, 3K + 2 roundings a round, carried
    over every round so far and scaled back by 1/alpha); FedLAW its 40-step Adam loop, ``servers_fedlaw.LOOP``."""
    k, rows, steps = setting["num_clients"], [], {}
    for t in range(setting["rounds"]):
        for e in log:
            if e["round"] == t:
                steps[e["client"]] = steps.get(e["client"], 0) + sum(len(b) for b in e["batches"])
        client = 4 * max(steps.values()) * eps
        if setting["algorithm"] in ("fedlaw", "feddf", "serverft"):  # an optimiser loop on the proxy
            server = LOOP
        else:
            server = (4 * k + 4 + ((t + 1) * (3 * k + 2) if setting["algorithm"] == "feddyn" else 0)) * eps
        rows.append(client + server)
    return rows


def _gaps(code_globals, our_globals) -> list[float]:
    return [float((c - o).abs().max() / o.abs().max()) for c, o in zip(code_globals, our_globals)]


def compare_case(checkout, method: str, overrides=None, name=None, nudge=True, dtype=torch.float64) -> dict:
    """One method's rounds on both sides in ``dtype``. ``overrides`` ({section: {key: value}}) changes our setting
    alone (the case then records no 1% change, nor with ``nudge`` false)."""
    one_percent, setting = nudge and not overrides, code_protocol_settings()[method]
    with tempfile.TemporaryDirectory(prefix="fedrepro-parity-fedlaw-data-") as tmp:
        root = Path(tmp)
        write_fmnist(root)
        parts = code_partition(checkout, root)
        mine = ours(setting, root, parts, dtype)
        got = code(checkout, setting, root, mine, dtype)
        ours_setting = copy.deepcopy(setting)
        for section, values in (overrides or {}).items():
            ours_setting[section].update(values)
        run = mine if not overrides else ours(ours_setting, root, parts, dtype)
        limit = bounds(setting, mine["log"], EPS[dtype])
        gaps = _gaps(got["globals"], run["globals"])
        section, key = CASES[method][2]
        moved = None
        if one_percent:
            nudged = copy.deepcopy(ours_setting)
            nudged[section][key] *= 1.01
            moved = [g / b for g, b in zip(_gaps(got["globals"], ours(nudged, root, parts, dtype)["globals"]), limit)]
    client_ratio, steps = 0.0, {}
    for e in sorted(run["log"], key=lambda e: e["round"]):
        steps[e["client"]] = steps.get(e["client"], 0) + sum(len(b) for b in e["batches"])
        if e["round"] < len(got["clients"]):
            gap = float((got["clients"][e["round"]][e["client"]] - e["end"]).abs().max() / e["end"].abs().max())
            client_ratio = max(client_ratio, gap / (4 * steps[e["client"]] * EPS[dtype]))
    rates_differ = sorted(
        t for e in run["log"] for t in [e["round"]]
        if abs(got["rates"][t][e["client"]] - e["lr"]) > LR_RELATIVE * e["lr"]
    )  # fmt: skip
    sizes_equal = got["trained"] == run["trained"] and got["proxy_size"] == run["proxy_size"]
    ratio = max(g / b for g, b in zip(gaps, limit)) if len(gaps) == setting["rounds"] else float("inf")
    equal = ratio <= 1 and client_ratio <= 1 and not rates_differ and sizes_equal
    return {
        "case": name or f"{method} ({CASES[method][0]}), code protocol, " + str(dtype).removeprefix("torch."),
        "dtype": str(dtype).removeprefix("torch."),
        "code_argv": got["argv"],
        "switches": {f"{s}.{k}": ours_setting[s][k] for s, k in SWITCHES[method]},
        "rounds": setting["rounds"],
        "clients": setting["num_clients"],
        "client_sizes": [len(p) for p in parts],
        "trained": [run["trained"][k] for k in sorted(run["trained"])],
        "trained_code": [got["trained"][k] for k in sorted(got["trained"])],
        "proxy_size": [got["proxy_size"], run["proxy_size"]],
        "relative_gap_by_round": gaps,
        "bound_by_round": limit,
        "global_gap_over_bound": ratio,
        "client_gap_over_bound": client_ratio,
        "rounds_rates_differ": rates_differ,
        "one_percent": None if moved is None else {"term": f"{section}.{key}", "gap_over_bound_by_round": moved},
        "code_printed_last": got["printed_last"],
        "status": "equal" if equal else "differs",
    }


def compare_fedlaw(checkout) -> list[dict]:
    rows = [compare_case(checkout, method) for method in CASES]
    rows += [compare_case(checkout, method, dtype=torch.float32) for method in FLOAT32]
    return rows + [compare_case(checkout, method, overrides, name) for name, (method, overrides) in PAPER_FORMS.items()]
