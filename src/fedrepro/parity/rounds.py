"""Whole rounds of IMA's code and of fedrepro, compared round by round: client step, learning-rate decay, server
step and window average together.

fedrepro's side is its real trainer (the sequential path) at IMA Table 1's FMNIST setting of FedAvg + IMA
(params/ima.yaml), shrunk: three clients of unequal sizes, all of them every round (the code's sampler is not
compared: participation 1), 8 rounds, IMA from round 4 with a window of 3, two local epochs of batches of 16.
Each IMA decay scheme the code has a branch for is a case (ours -> the code's ``decay_mode``: exponential ->
EXD, constant -> CLR, none -> NAD, epoch -> ED). The harness records every client's start model, rate, batches
and end model, and the global model after every round.

The code's side is IMA's ``server_se1.Server.fedavg`` (the loop its notebooks call), unchanged, run in a
scratch folder (it saves its results under ``results/Test/...``, created there first) with its own model (its
``model.Client_Model``; our initial weights copied into it), its own ``client_update`` and ``fedavg_optimizer``
(SGD, its weight decay, its rate formula), ``dispatch``, ``aggregation`` with its window of global models, and
its decay code. Pinned from outside, by names in its modules' namespaces (never its files): the DataLoader its
``client_update`` builds hands out the batches fedrepro drew for that client, epoch by epoch; ``dispatch``
first loads fedrepro's global model of the round into the code's server model, so each round starts from the
same model on both sides while each side keeps its own window of past global models; ``aggregation`` and
torch's SGD are wrapped to record what the code computed (client models before the average, the rate each
client's optimiser was built with, the global model after).

Compared, round by round: each client's rate (1e-12 relative: both are float64 products and powers), each
client's model after its local training (float32; the same SGD in both programs, so the bound is that of
``parity.clients.bound``) and the global model after the server step (float32: a weighted mean of K models and a
mean over the window, each side rounding its sums in its own order: (4K + 2P + 4) eps32 of the largest
parameter)."""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
from types import SimpleNamespace

import torch

from fedrepro.parity.clients import (
    EPS32,
    LR_RELATIVE,
    _EpochBatches,
    bound,
    generated_clients,
    record_local_training,
)
from fedrepro.parity.shim import checkout_on_path

SIZES = (37, 52, 23)
SHRUNK = {"num_clients": len(SIZES), "participation": 1.0, "rounds": 8, "local_epochs": 2, "batch_size": 16,
          "device": "cpu"}  # fmt: skip
IMA_SHRUNK = {"start_round": 4, "window": 3, "cycle_rounds": 2}
DECAYS = {"exponential": "EXD", "constant": "CLR", "none": "NAD", "epoch": "ED"}
# imported, absent at HEAD: utils.global_test's two, server_se1's analysis module, and the package __init__ of the
# code's partial copy of FedLab (its four imports are missing; the partitioners below it are there), and pynvml
# (FedLab's GPU queries)
STUBS = ("utils.tSNE", "leaf.dataloader", "utils.bias_var_covar_analysis", "fedlab.utils", "pynvml")


def ima_settings() -> dict[str, dict]:
    from fedrepro.configure import expansion, paramsfile
    from fedrepro.configure.paramsfile import ROOT

    for run in expansion.expand(paramsfile.load_params_files([str(ROOT / "params" / "ima.yaml")])):
        s = run.setting
        if run.experiment == "ima_table1_fmnist" and s["algorithm"] == "fedavg" and s["plugins"] == ["ima"]:
            base = {**copy.deepcopy(s), **SHRUNK}
            return {d: {**base, "ima": {**base["ima"], **IMA_SHRUNK, "decay": d}} for d in DECAYS}
    raise ValueError("params/ima.yaml: no FedAvg + IMA run of ima_table1_fmnist")


def _problem(seed: int = 1):
    return generated_clients(SIZES, (1, 28, 28), 40, seed)


def ours(setting: dict):
    """fedrepro's run: (initial module, every client's local training, the global model after every round)."""
    from fedrepro import models
    from fedrepro.run.trainer import Trainer

    train, test, parts = _problem()
    log, globals_ = [], []
    torch.manual_seed(setting["seed"])
    module = models.build(setting["model"], setting["dataset"])
    initial = copy.deepcopy(module)
    with tempfile.TemporaryDirectory(prefix="fedrepro-parity-rounds-") as tmp:
        trainer = Trainer(setting, tmp, None, None, datasets=(train, test), parts=parts, module=module)
        trainer.cohort_mode = "off"
        round_ = trainer.round
        record_local_training(trainer, log)

        def round_and_global(t):
            row = round_(t)
            globals_.append(trainer.model.flat.clone())
            return row

        trainer.round = round_and_global
        trainer.run(progress=False)
    return initial, log, globals_


@contextlib.contextmanager
def _recording_sgd(record: dict):
    """torch's SGD, keeping the rate each client's optimiser is built with (round, client) -> lr."""
    original = torch.optim.SGD

    class Recorded(original):
        def __init__(self, params, lr, *args, **kwargs):
            record["rates"][(len(record["globals"]), record["training"])] = lr
            super().__init__(params, lr, *args, **kwargs)

    torch.optim.SGD = Recorded
    try:
        yield
    finally:
        torch.optim.SGD = original


def code(checkout, setting: dict, initial: torch.nn.Module, log: list[dict]) -> dict:
    """IMA's Server.fedavg on fedrepro's batches and round-start models; what it computed, round by round."""
    from fedrepro.parity import models as parity_models

    row = next(r for r in parity_models.PAIRS["ima"] if r[:2] == ("fmnist", "cnn"))
    build = parity_models.code_builder(checkout, "fmnist", *row[2:])
    code_model = build()
    probe = torch.zeros(2, 1, 28, 28)
    to_code, to_ours = parity_models.match(initial, code_model, probe), parity_models.match(code_model, initial, probe)
    parity_models.copy(initial, code_model, to_code)
    ours_shape = copy.deepcopy(initial)

    def vector(code_module) -> torch.Tensor:
        parity_models.copy(code_module, ours_shape, to_ours)
        return torch.nn.utils.parameters_to_vector(ours_shape.parameters()).detach().clone()

    def load(code_module, flat) -> None:
        torch.nn.utils.vector_to_parameters(flat, ours_shape.parameters())
        parity_models.copy(ours_shape, code_module, to_code)

    train, _, parts = _problem()
    starts = {e["round"]: e["start"] for e in log}
    pinned = {k: [e for e in log if e["client"] == k] for k in range(len(SIZES))}
    record = {"clients": [], "globals": [], "rates": {}, "epochs": {}, "training": None}
    ima, cl = setting["ima"], setting["client"]
    args = SimpleNamespace(
        K=len(SIZES), C=1.0, r=setting["rounds"], E=setting["local_epochs"], B=setting["batch_size"],
        lr=cl["lr"], weight_decay=cl["lr_decay"], momentum=cl["momentum"], optimizer="sgd", device="cpu",
        r_ima=ima["start_round"], window_size=ima["window"], lr_ima=ima["constant_lr"],
        lr_ima_decay=ima["lr_decay"], ima_stage=ima["cycle_rounds"], decay_mode=DECAYS[ima["decay"]],
        seed=setting["seed"], dataset="fmnist", skewness="label", verbose=False, saveModels=False,
        num_classes=10, dims_feature=128, setup="parity", split="parity",
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="fedrepro-parity-ima-") as tmp, checkout_on_path(checkout, stubs=STUBS):
        import client
        import server_se1

        dispatch, aggregation = server_se1.dispatch, server_se1.aggregation

        def dispatch_from_ours(index, global_model, client_models):
            load(global_model, starts[len(record["globals"])])
            return dispatch(index, global_model, client_models)

        def aggregation_recorded(index, global_model, client_models, *args, **kwargs):
            t = len(record["globals"])
            for k, loader in record.pop("loaders", {}).items():  # the epochs the code's client took
                record["epochs"][(t, k)] = loader.total - len(loader.epochs)
            record["clients"].append({int(k): vector(client_models[k]) for k in index})
            out = aggregation(index, global_model, client_models, *args, **kwargs)
            record["globals"].append(vector(global_model))
            return out

        def pinned_loader(split, batch_size, shuffle):
            k = next(k for k, part in enumerate(parts) if list(split.idxs) == part.tolist())
            record["training"] = k
            batches = _EpochBatches()
            batches.epochs = [list(b) for b in pinned[k].pop(0)["batches"]]
            batches.dataset, batches.total = split, len(batches.epochs)
            record.setdefault("loaders", {})[k] = batches
            return batches

        server_se1.dispatch, server_se1.aggregation, client.DataLoader = (
            dispatch_from_ours, aggregation_recorded, pinned_loader
        )  # fmt: skip
        os.makedirs(os.path.join(tmp, "results/Test/label skew/fmnist/fedavg/seed%d" % args.seed))
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            server = server_se1.Server(args, code_model, train, {k: p.tolist() for k, p in enumerate(parts)})
            with _recording_sgd(record):
                server.fedavg([], None, agg_mode="ima")
        finally:
            os.chdir(cwd)
    return record


def compare_ima(checkout) -> list[dict]:
    rows = []
    for decay, setting in ima_settings().items():
        initial, log, ours_globals = ours(setting)
        got = code(checkout, setting, initial, log)
        k, window = len(SIZES), setting["ima"]["window"]
        server_bound = (4 * k + 2 * window + 4) * EPS32
        client_ratio, global_ratio, rates_differ, epochs_differ = 0.0, 0.0, set(), set()
        for e in log:
            t, c = e["round"], e["client"]
            steps = sum(len(b) for b in e["batches"])
            gap = float((got["clients"][t][c] - e["end"]).abs().max()) / float(e["end"].abs().max())
            client_ratio = max(client_ratio, gap / bound(steps))
            if abs(got["rates"][(t, c)] - e["lr"]) > LR_RELATIVE * e["lr"]:
                rates_differ.add(t)
            if got["epochs"][(t, c)] != len(e["batches"]):
                epochs_differ.add(t)
        for t, x in enumerate(ours_globals):
            global_ratio = max(global_ratio, float((got["globals"][t] - x).abs().max() / x.abs().max()) / server_bound)
        equal = client_ratio <= 1 and global_ratio <= 1 and not rates_differ and not epochs_differ
        rows.append(
            {
                "case": f"FedAvg + IMA, decay {decay} (code: {DECAYS[decay]}), window {window} from round "
                f"{setting['ima']['start_round']}",
                "rounds": setting["rounds"],
                "clients": k,
                "client_gap_over_bound": client_ratio,
                "global_gap_over_bound": global_ratio,
                "rounds_rates_differ": sorted(rates_differ),
                "rounds_epochs_differ": sorted(epochs_differ),
                "rates": {
                    f"{t}": [got["rates"][(t, 0)], next(e["lr"] for e in log if e["round"] == t)]
                    for t in range(setting["rounds"])
                },  # fmt: skip
                "status": "equal" if equal else "differs",
            }
        )
    return rows
