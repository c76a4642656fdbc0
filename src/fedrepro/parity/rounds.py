"""Whole rounds of IMA's code and of fedrepro, compared round by round: client step, learning-rate decay, server
step and window average together.

fedrepro's side is its real trainer (the sequential path) at IMA Table 1's FMNIST setting of a method + IMA under
the code's protocol (params/ima.yaml with params/subsets/ima_official_protocol.yaml), shrunk: three clients of
unequal sizes, all of them every round (the code's sampler is not compared: participation 1), 8 rounds, IMA from
round 4 with a window of 3, two local epochs of batches of 16. FedAvg + IMA runs once per decay scheme the code has
a branch for (ours -> the code's ``decay_mode``: exponential -> EXD, constant -> CLR, none -> NAD, epoch -> ED,
cyclic -> CD); the other methods are ``rounds_ima_methods``'s. The harness records every client's start model,
rate, batches and end model, and the global model (and FedFA's anchors) after every round.

The code's side is the ``server_se1.Server`` loop of the method (``fedavg``, ``fedprox``, ``fedsam``,
``fedfa_anchorloss``: the loops its notebooks call, ``CODE_METHODS``), unchanged, run in a scratch folder (it saves
its results under ``results/Test/...``, created there first) with its own model (its ``model.Client_Model``; our
initial weights copied into it), its own client functions and optimisers (SGD, its weight decay, its rate
formula), ``dispatch``, ``aggregation`` with its window of global models, and its decay code. Pinned from outside,
by names in its modules' namespaces (never its files): the DataLoader its client functions build hands out the
batches fedrepro drew for that client, epoch by epoch; ``dispatch`` first loads fedrepro's global model (and
anchors) of the round into the code's server model (and anchor module), so each round starts from the same model on
both sides while each side keeps its own window of past global models; ``aggregation`` and torch's SGD are wrapped
to record what the code computed (client models before the average, the rate each client's optimiser was built
with, the global model and anchors after).

Compared, round by round: each client's rate (1e-12 relative: both are float64 products and powers), each
client's model after its local training (the same SGD in both programs, so the bound is that of
``parity.clients.bound``, in the case's eps) and the global model after the server step (a weighted mean of K
models and a mean over the window, each side rounding its sums in its own order: (4K + 2P + 4) eps of the largest
parameter). FedFA's global anchors: the client bound (the features come from models that far apart) plus a
rounding per sample of a batch's class mean (B) and four per client of the momentum and the server's weighted mean
(4K). A case runs in float32, as both programs train, or in float64 (torch's default dtype on both sides, and
fedrepro's data-size weights in it), where the same bounds in eps64 let a small term's error show."""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile

import numpy as np
import torch

from fedrepro.parity.clients import (
    EPS32,
    LR_RELATIVE,
    _EpochBatches,
    bound,
    float64_dataset,
    generated_clients,
    record_local_training,
)
from fedrepro.parity.ima_code_args import BARE_IMA, CODE_METHODS, DECAYS, case_name, code_args, code_cohort, code_method
from fedrepro.parity.shim import checkout_on_path

SIZES = (37, 52, 23)
SHRUNK = {"num_clients": len(SIZES), "participation": 1.0, "rounds": 8, "local_epochs": 2, "batch_size": 16,
          "device": "cpu"}  # fmt: skip
IMA_SHRUNK = {"start_round": 4, "window": 3, "cycle_rounds": 2}
UNTUNED = {"fedprox": {"mu": 0.01}, "fedfa": {"lam": 0.1}}  # params/ima.yaml's base values, the code's args.py
# the code's cyclic rate is constant over a cycle of 2 rounds (its two halves give lr_max alike): a cycle of 4 shows
# both programs' shapes in the 4 rounds from t_s
CYCLE = {"cyclic": {"cycle_rounds": 4}}
# imported, absent at HEAD: utils.global_test's two, server_se1's analysis module, and the package __init__ of the
# code's partial copy of FedLab (its four imports are missing; the partitioners below it are there), and pynvml
# (FedLab's GPU queries)
STUBS = ("utils.tSNE", "leaf.dataloader", "utils.bias_var_covar_analysis", "fedlab.utils", "pynvml")


def _table1_fmnist() -> dict[str, dict]:
    """IMA Table 1's FMNIST settings of each method + IMA under the code's protocol (params/ima.yaml with
    params/subsets/ima_official_protocol.yaml: FedFA's anchor momentum 0.5, the cyclic decay's maximum the rate
    at t_s), shrunk (SHRUNK, IMA_SHRUNK). FedProx's mu and FedFA's lambda are tuned per cell (Table 5), so their
    +IMA runs exist only once tuning has run: their settings are FedAvg + IMA's with the method's section of its
    bare run and the value the tuning starts from (UNTUNED, the code's defaults)."""
    from fedrepro.configure import expansion, paramsfile
    from fedrepro.configure.paramsfile import ROOT

    files = [str(ROOT / "params" / "ima.yaml"), str(ROOT / "params" / "subsets" / "ima_official_protocol.yaml")]
    with_ima, sections = {}, {}
    for run in expansion.expand(paramsfile.load_params_files(files)):
        s = run.setting
        if run.experiment != "ima_table1_fmnist" or s["algorithm"] not in CODE_METHODS:
            continue
        if s["plugins"] == ["ima"]:
            with_ima.setdefault(s["algorithm"], s)
        sections.setdefault(s["algorithm"], copy.deepcopy(s.get(s["algorithm"])))
    if "fedavg" not in with_ima:
        raise ValueError("params/ima.yaml: no FedAvg + IMA run of ima_table1_fmnist")
    found = {}
    for method, section in sections.items():
        s = copy.deepcopy(with_ima.get(method) or {**with_ima["fedavg"], "algorithm": method})
        if method not in with_ima:
            s[method] = {**section, **UNTUNED[method]}
        found[method] = {**s, **SHRUNK, "ima": {**s["ima"], **IMA_SHRUNK}}
        # the subset's cyclic maximum is the rate at t_s (null), resolved at the full run's t_s: again at the shrunk one
        found[method]["ima"]["cyclic_lr_max"] = s["client"]["lr"] * s["client"]["lr_decay"] ** IMA_SHRUNK["start_round"]
    return found


def ima_settings() -> dict[str, dict]:
    """FedAvg + IMA under each decay scheme the code has a branch for (DECAYS)."""
    base = _table1_fmnist()["fedavg"]
    return {d: {**base, "ima": {**base["ima"], "decay": d, **CYCLE.get(d, {})}} for d in DECAYS}


def _problem(seed: int = 1, dtype=torch.float32):
    return generated_clients(
        SIZES, (1, 28, 28), 40, seed, dataset=None if dtype == torch.float32 else float64_dataset()
    )


@contextlib.contextmanager
def _in_dtype(dtype):
    """torch's default dtype set to ``dtype`` (models built and anchors drawn in it), and fedrepro's data-size
    weights in it too (the code divides Python ints in float64; float32 weights would round them)."""
    from fedrepro.run import trainer as trainer_module

    build, default = trainer_module.run_inputs.build, torch.get_default_dtype()

    def build_in_dtype(*args, **kwargs):
        inputs = build(*args, **kwargs)
        inputs.client_sizes = inputs.client_sizes.to(dtype)
        return inputs

    torch.set_default_dtype(dtype)
    if dtype != torch.float32:
        trainer_module.run_inputs.build = build_in_dtype
    try:
        yield
    finally:
        trainer_module.run_inputs.build = build
        torch.set_default_dtype(default)


def ours(setting: dict, dtype=torch.float32):
    """fedrepro's run: (initial module, every client's local training, the global model after every round, and for
    a method with anchors (FedFA) the global anchors at the start and the end of every round)."""
    from fedrepro import models
    from fedrepro.run import trainer as trainer_module
    from fedrepro.run.trainer import Trainer

    log, globals_, anchors = [], [], {"start": [], "end": []}
    with (
        _in_dtype(dtype),
        _code_cohorts(setting, trainer_module),
        tempfile.TemporaryDirectory(prefix="fedrepro-parity-rounds-") as tmp,
    ):
        train, test, parts = _problem(dtype=dtype)
        torch.manual_seed(setting["seed"])
        module = models.build(setting["model"], setting["dataset"])
        initial = copy.deepcopy(module)
        trainer = Trainer(setting, tmp, None, None, datasets=(train, test), parts=parts, module=module)
        trainer.cohort_mode = "off"
        round_, objective = trainer.round, trainer.algorithm.objective
        record_local_training(trainer, log)

        def round_and_global(t):
            if hasattr(objective, "anchors"):
                anchors["start"].append(objective.anchors.clone())
            row = round_(t)
            globals_.append(trainer.model.flat.clone())
            if hasattr(objective, "anchors"):
                anchors["end"].append(objective.anchors.clone())
            return row

        trainer.round = round_and_global
        trainer.run(progress=False)
    return initial, log, globals_, anchors


@contextlib.contextmanager
def _code_cohorts(setting: dict, trainer_module):
    """Below full participation, fedrepro's cohort of each round pinned to the code's draw (``code_cohort``)."""
    drawn = trainer_module.sample_cohort
    if setting["participation"] < 1:
        trainer_module.sample_cohort = lambda seed, t, n, k, warmup="none": np.sort(code_cohort(seed, t, n, k))
    try:
        yield
    finally:
        trainer_module.sample_cohort = drawn


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


def code(checkout, setting: dict, initial: torch.nn.Module, log: list[dict], anchors=None, dtype=torch.float32):
    """IMA's Server loop of the setting's method on fedrepro's batches, round-start models (and anchors); what it
    computed, round by round."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # the code builds its model and anchors in torch's default dtype
    try:
        return _code(checkout, setting, initial, log, anchors)
    finally:
        torch.set_default_dtype(default)


def _code(checkout, setting, initial, log, anchors) -> dict:
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

    train, _, parts = _problem(dtype=torch.get_default_dtype())
    train.targets = train.labels.numpy()  # FedFA's client reads each client's label set from dataset.targets
    starts = {e["round"]: e["start"] for e in log}
    pinned = {(e["round"], e["client"]): e for e in log}
    record = {"clients": [], "globals": [], "anchors": [], "rates": {}, "epochs": {}, "training": None}
    args = code_args(setting, len(SIZES))
    method, agg_mode = code_method(setting)
    with tempfile.TemporaryDirectory(prefix="fedrepro-parity-ima-") as tmp, checkout_on_path(checkout, stubs=STUBS):
        import client
        import server_se1

        dispatch, aggregation, fednova_step = server_se1.dispatch, server_se1.aggregation, client.op.fednova_optimizer

        def fednova_recorded(*args, **kwargs):  # FedNova's client models are dropped before the aggregation
            out = fednova_step(*args, **kwargs)
            record.setdefault("trained", {})[record["training"]] = vector(out[0])
            return out

        def dispatch_from_ours(index, global_model, client_models):
            if hasattr(global_model, "anchor"):  # FedFA's anchors, sent beside the model
                global_model.anchor.data.copy_(anchors["start"][len(record["globals"])])
            else:
                load(global_model, starts[len(record["globals"])])
            return dispatch(index, global_model, client_models)

        def aggregation_recorded(index, global_model, client_models, *args, **kwargs):
            if hasattr(global_model, "anchor"):  # FedFA's anchor average, after the model's
                out = aggregation(index, global_model, client_models, *args, **kwargs)
                record["anchors"].append(global_model.anchor.detach().clone())
                return out
            t = len(record["globals"])
            for k, loader in record.pop("loaders", {}).items():  # the epochs the code's client took
                record["epochs"][(t, k)] = loader.total - len(loader.epochs)
            trained = record.pop("trained", None)  # FedNova's: its aggregation gets normalised updates
            record["clients"].append(trained or {int(k): vector(client_models[k]) for k in index})
            out = aggregation(index, global_model, client_models, *args, **kwargs)
            record["globals"].append(vector(global_model))
            return out

        def pinned_loader(split, batch_size, shuffle):
            k = next(k for k, part in enumerate(parts) if list(split.idxs) == part.tolist())
            record["training"] = k
            batches = _EpochBatches()
            # a client fedrepro did not sample this round (the cohorts differ, and the check says so) trains on its
            # batches of another round
            entry = pinned.get((len(record["globals"]), k)) or next(e for e in log if e["client"] == k)
            batches.epochs = [list(b) for b in entry["batches"]]
            batches.dataset, batches.total = split, len(batches.epochs)
            record.setdefault("loaders", {})[k] = batches
            return batches

        server_se1.dispatch, server_se1.aggregation, client.DataLoader = (
            dispatch_from_ours, aggregation_recorded, pinned_loader
        )  # fmt: skip
        client.op.fednova_optimizer = fednova_recorded
        for folder in ("fedavg", "fedprox", "fedsam", "fedfa", "fednova"):  # where each method saves its results
            os.makedirs(os.path.join(tmp, f"results/Test/label skew/fmnist/{folder}/seed{args.seed}"))
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            server = server_se1.Server(args, code_model, train, {k: p.tolist() for k, p in enumerate(parts)})
            with _recording_sgd(record):
                getattr(server, method)([], None, agg_mode=agg_mode)
        finally:
            os.chdir(cwd)
    return record


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def compare_case(checkout, setting: dict, dtype=torch.float32, ours_setting=None, extra=None) -> dict:
    """One case: the code's loop and fedrepro's trainer at ``setting`` in ``dtype``; ``ours_setting``: another
    setting on fedrepro's side alone (a deliberately wrong term), judged against the code's run at ``setting``;
    ``extra(setting, log, got)``: more facts for the row, from fedrepro's log and what the code computed."""
    # with ours_setting, the code's run is pinned to the wrong run's round starts, so each round shows its own gap
    initial, log, ours_globals, anchors = ours(ours_setting or setting, dtype)
    got = code(checkout, setting, initial, log, anchors, dtype)
    eps = float(torch.finfo(dtype).eps)
    k, window = len(SIZES), setting.get("ima", BARE_IMA)["window"]
    server_bound = (4 * k + 2 * window + 4) * eps
    client_ratio, rates_differ, epochs_differ = 0.0, set(), set()
    cohorts = [sorted(int(c) for c in got["clients"][t]) for t in range(setting["rounds"])]
    cohorts_differ = {t for t, c in enumerate(cohorts) if c != sorted(e["client"] for e in log if e["round"] == t)}
    for e in log:
        t, c = e["round"], e["client"]
        if t in cohorts_differ:
            continue
        steps = sum(len(b) for b in e["batches"])
        client_bound = bound(steps) * eps / EPS32  # the client check's bound, in the case's precision
        client_ratio = max(client_ratio, _relative(got["clients"][t][c], e["end"]) / client_bound)
        if abs(got["rates"][(t, c)] - e["lr"]) > LR_RELATIVE * e["lr"]:
            rates_differ.add(t)
        if got["epochs"][(t, c)] != len(e["batches"]):
            epochs_differ.add(t)
    by_round = [_relative(got["globals"][t], x) / server_bound for t, x in enumerate(ours_globals)]
    equal = client_ratio <= 1 and max(by_round) <= 1 and not rates_differ and not epochs_differ and not cohorts_differ
    row = {
        "case": case_name(setting),
        "dtype": str(dtype).removeprefix("torch."),
        "rounds": setting["rounds"],
        "clients": k,
        "client_gap_over_bound": client_ratio,
        "global_gap_over_bound": max(by_round),
        "global_gap_over_bound_by_round": by_round,
        "rounds_rates_differ": sorted(rates_differ),
        "rounds_epochs_differ": sorted(epochs_differ),
        **(
            {"cohorts": cohorts, "rounds_cohorts_differ": sorted(cohorts_differ)}
            if setting["participation"] < 1
            else {}
        ),
        "rates": {  # the round's first client's, on each side
            f"{t}": [got["rates"].get((t, e["client"])), e["lr"]]
            for t in range(setting["rounds"])
            for e in [next(e for e in log if e["round"] == t)]
        },  # fmt: skip
    }
    if anchors["end"]:  # FedFA's global anchors after each round: a data-size weighted mean of the clients'
        gaps = [_relative(a, b) for a, b in zip(got["anchors"], anchors["end"])]
        row["anchor_gap_by_round"] = gaps
        steps = max(sum(len(b) for b in e["batches"]) for e in log)
        anchor_bound = bound(steps) * eps / EPS32 + (setting["batch_size"] + 4 * k) * eps
        row["anchor_gap_over_bound"] = max(gaps) / anchor_bound
        equal = equal and row["anchor_gap_over_bound"] <= 1
    row["status"] = "equal" if equal else "differs"
    return {**row, **(extra(setting, log, got) if extra else {})}


def compare_ima(checkout) -> list[dict]:
    return [compare_case(checkout, setting) for setting in ima_settings().values()]
