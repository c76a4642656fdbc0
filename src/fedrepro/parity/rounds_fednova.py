"""Whole rounds of FedNova's code and of fedrepro, compared round by round: the rate schedule, every client's
local training and the normalised average, on the code's own VGG-11.

fedrepro's side is its real trainer (the sequential path) at FedNova Table I's E_i = 2 settings of FedNova
(params/fednova.yaml: plain SGD, local momentum, proximal term), shrunk: three clients of unequal sizes (so
unequal step counts and partial last batches), all of them every round, 4 rounds (the rate drops /10 at round 2
and /100 at round 3, as at the paper's 100 rounds: milestones at whole rounds), two epochs of batches of 16, on
generated CIFAR-shaped inputs; and the script's other Table I settings, ``rounds_fednova_script``'s cases (FedAvg
and FedProx through its ``FedProx`` optimiser at E_i = 2, and every row the script has at E_i(t) ~ U(2,5), with its
own draws of epochs, on smaller clients). Every client's start model, rate, batches and end model, the aggregation's
tau_eff and scales, and the global model after every round are recorded.

The code's side is ``train_LocalSGD.py`` itself, unchanged: its module is imported with its command line in
``sys.argv`` (``rounds_fednova_script.script_argv``: ``--optimizer fednova --pattern constant --backend gloo``, the
case's rate, momentum and mu, or the other cases' options) and its
own ``init_processes(rank, size, run)`` runs in one spawned process per client on the CPU, so its ``run`` loop
does everything a real run does: the rate schedule (``update_learning_rate``), the local epochs, ``train`` with
the code's ``FedNova`` optimiser (weight decay 1e-4, fixed in the script), ``average()`` through gloo's
all-reduce, and ``evaluate``. Pinned from outside, by names in its modules (never its files): ``util_v4``'s
``partition_dataset`` returns a loader that hands out fedrepro's batches for the rank's client, epoch by epoch, a
one-batch test loader and the ratios n_i / n (the data pipeline and partition are compared apart);
``util_v4.select_model`` returns the code's own ``models.vgg11()`` holding fedrepro's initial weights (the same
parameter order; the model check compares the functions); ``update_learning_rate`` first loads fedrepro's global
model of the round into the parameters and the optimiser's ``old_init``, so each round starts from the same model
on both sides; the script's ``FedNova`` (or ``FedProx``) name is a subclass that records the client model, rate,
steps and a_i before ``average()`` and the global model after; ``update_local_epochs`` is wrapped to record the
epochs the script draws. Dropout (VGG-11's two layers): ``torch.nn.functional.dropout``
draws its masks in fedrepro's run and replays them, in the same order, in the code's ranks.

Compared per round: rates (1e-12 relative), steps (equal), a_i (float64 recursions, 1e-12), each client's model
(``clients_fednova.client_bound``) and the global model (``rounds_fednova_script.global_model_bound``)."""

from __future__ import annotations

import copy
import os
import sys
import tempfile
from pathlib import Path

import torch

from fedrepro.parity import clients_fednova
from fedrepro.parity.clients import LR_RELATIVE, generated_clients
from fedrepro.parity.clients_fednova import A_RELATIVE, client_bound, ours
from fedrepro.parity.rounds_fednova_script import SHRUNK as SCRIPT_SHRUNK
from fedrepro.parity.shim import checkout_on_path

SIZES = (30, 18, 45)
# Where the float32 bounds do not hold (their premise, lr L < 1, fails for VGG-11 at lr 0.05 on random labels: a
# rounding difference grows from step to step), the case is judged against the code's optimiser run in float64 on
# the same batches: fedrepro's float32 run must be no farther from it than ORACLE_FACTOR times the code's own.
ORACLE_FACTOR = 2.0
SHRUNK = {**SCRIPT_SHRUNK, "num_clients": len(SIZES)}


def fednova_settings() -> dict[str, dict]:
    from fedrepro.configure import expansion, paramsfile
    from fedrepro.configure.paramsfile import ROOT

    found = {}
    for run in expansion.expand(paramsfile.load_params_files([str(ROOT / "params" / "fednova.yaml")])):
        s = run.setting
        if run.experiment == "fednova_table1_e2" and s["algorithm"] == "fednova":
            c = s["client"]
            label = f"FedNova, lr {c['lr']:g}, momentum {c['momentum']:g}, mu {s['fednova']['mu']:g}"
            found.setdefault(label, {**copy.deepcopy(s), **SHRUNK})
    return found


def _problem(sizes: tuple = SIZES, seed: int = 3):
    from fedrepro.data import TensorDataset

    class InDefaultDtype(TensorDataset):
        """Batches in torch's default dtype: float64 in the float64 rerun (uint8 / 255 rounded to float32 first,
        the same inputs on both sides)."""

        def batch(self, index):
            x, y = super().batch(index)
            return x.to(torch.get_default_dtype()), y

        def to(self, device):
            return InDefaultDtype(self.images.to(device), self.labels.to(device), self.mean, self.std)

    return generated_clients(sizes, (3, 32, 32), 16, seed, InDefaultDtype)


def _masked_dropout(next_mask):
    """F.dropout as both programs run it here: input * mask / (1 - p), the mask from ``next_mask(input, p)``."""

    def dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return input
        return input * next_mask(input, p) * (1.0 / (1.0 - p))

    return dropout


def _ours(setting: dict, sizes: tuple = SIZES, epochs: dict | None = None):
    """fedrepro's run with every dropout mask a client drew kept: (initial vector, log, rounds, masks per client).
    ``epochs``: {(round, client): epochs} the run takes in place of its own draws (the code's, ``code_epochs``)."""
    from fedrepro import models

    torch.manual_seed(setting["seed"])
    module = models.build(setting["model"], setting["dataset"])
    initial = torch.nn.utils.parameters_to_vector(module.parameters()).detach().clone()
    masks = {c: [] for c in range(len(sizes))}
    current, gen = {"client": None}, torch.Generator().manual_seed(7)

    def draw(input, p):
        mask = (torch.rand(input.shape, generator=gen) >= p).to(input.dtype)
        masks[current["client"]].append(mask)
        return mask

    def wrap(trainer):
        train = trainer.local.train

        def tracked(run, *args, **kwargs):
            current["client"] = run.client
            try:
                return train(run, *args, **kwargs)
            finally:
                current["client"] = None

        trainer.local.train = tracked
        if epochs is not None:
            trainer.algorithm.client_plan.local_epochs = lambda t, client: epochs[(t, client)]

    original = torch.nn.functional.dropout
    torch.nn.functional.dropout = _masked_dropout(draw)
    try:
        log, rounds = ours(setting, _problem(sizes), module, wrap)
    finally:
        torch.nn.functional.dropout = original
    return initial, log, rounds, masks


class _Batches:
    """A rank's training loader: each pass hands out the next epoch of fedrepro's batches of the round; a pass the
    code asks for beyond fedrepro's epochs repeats the round's last (the steps then differ, and the check says so).
    ``next_round`` (called by the recorded ``average()``) moves on to the next round's epochs."""

    def __init__(self, rounds):
        self.rounds, self.round, self.taken, self.current = rounds, 0, 0, rounds[0][0]

    def __iter__(self):
        epochs = self.rounds[self.round]
        self.current = epochs[min(self.taken, len(epochs) - 1)]
        self.taken += 1
        return iter(self.current)

    def __len__(self):
        return len(self.current)

    def next_round(self):
        self.round, self.taken = min(self.round + 1, len(self.rounds) - 1), 0


def _rank(rank: int, world: int, checkout: str, folder: str, setting: dict) -> None:
    """One client of the code: train_LocalSGD's own init_processes and run, pinned as the module says."""
    from fedrepro.parity.clients_fednova import code_optimiser
    from fedrepro.parity.rounds_fednova_script import script_argv

    torch.set_num_threads(1)
    pinned = torch.load(Path(folder) / f"pinned{rank}.pt")
    torch.set_default_dtype(pinned["initial"].dtype)  # the code's model and tensors in the dtype fedrepro ran
    masks = pinned["masks"]  # past fedrepro's masks (the code training more steps than fedrepro): fresh ones
    torch.nn.functional.dropout = _masked_dropout(
        lambda input, p: masks.pop(0) if masks else (torch.rand(input.shape) >= p).to(input.dtype)
    )
    sys.argv = script_argv(setting, world, rank, folder)
    name, _ = code_optimiser(setting)
    with checkout_on_path(checkout, stubs=("mpi4py",), placeholders={"models": ["LogisticRegression"]}):
        import models as code_models
        import train_LocalSGD
        import util_v4

        record = {"rounds": [], "epochs": []}
        loader = _Batches(pinned["batches"])

        def partition_dataset(rank_, size, args):
            return loader, [pinned["test"]], pinned["ratios"]

        def select_model(num_class, args):
            model = code_models.vgg11()
            shapes = [p.shape for p in model.parameters()]
            if [tuple(s) for s in shapes] != pinned["shapes"]:
                raise RuntimeError("the code's vgg11 and fedrepro's vgg11 hold parameters of other shapes or order")
            torch.nn.utils.vector_to_parameters(pinned["initial"], model.parameters())
            return model

        update_learning_rate, update_local_epochs = (
            train_LocalSGD.update_learning_rate,
            train_LocalSGD.update_local_epochs,
        )

        def start_from_ours(optimizer, rnd, target_lr):
            params = [p for g in optimizer.param_groups for p in g["params"]]
            with torch.no_grad():
                torch.nn.utils.vector_to_parameters(pinned["starts"][rnd], params)
                for p in params:
                    if "old_init" in optimizer.state[p]:
                        optimizer.state[p]["old_init"].copy_(p)
            return update_learning_rate(optimizer, rnd, target_lr)

        # FedProx's average() all-reduces ratio_i x_i in comm_helpers.communicate, which then rebinds each
        # ``p.data`` to the sum: on torch >= 1.13 a shallow copy, so the parameters keep ratio_i x_i (docs/parity.md).
        # Its new model is the all-reduced sum, recorded here; ``parameters_hold_average`` says what the ranks hold.
        reduced, optimiser_module = [], sys.modules[f"distoptim.{name}"]
        communicate = optimiser_module.communicate

        def communicate_recorded(tensors, op):
            communicate(tensors, op)
            reduced.append(torch.cat([t.reshape(-1) for t in tensors]).clone())

        optimiser_module.communicate = communicate_recorded

        def epochs_recorded(*args, **kwargs):
            record["epochs"].append(int(update_local_epochs(*args, **kwargs)))
            return record["epochs"][-1]

        class Recorded(getattr(train_LocalSGD, name)):
            steps = 0

            def step(self, *args, **kwargs):
                self.steps += 1
                return super().step(*args, **kwargs)

            def average(self, *args, **kwargs):
                params = [p for g in self.param_groups for p in g["params"]]
                entry = {"client": torch.nn.utils.parameters_to_vector(params).detach().clone(),
                         "lr": self.param_groups[0]["lr"], "steps": self.steps,
                         "a": float(getattr(self, "local_normalizing_vec", "nan"))}  # fmt: skip
                out = super().average(*args, **kwargs)
                held = torch.nn.utils.parameters_to_vector(params).detach().clone()
                entry["global"] = reduced[-1] if name == "FedProx" else held
                entry["parameters_hold_average"] = torch.equal(held, entry["global"])
                record["rounds"].append(entry)
                self.steps = 0
                loader.next_round()
                return out

        util_v4.partition_dataset, util_v4.select_model = partition_dataset, select_model
        train_LocalSGD.update_learning_rate, train_LocalSGD.update_local_epochs = start_from_ours, epochs_recorded
        setattr(train_LocalSGD, name, Recorded)
        os.makedirs(f"{folder}/parity", exist_ok=True)
        train_LocalSGD.init_processes(rank, world, train_LocalSGD.run)
        torch.distributed.destroy_process_group()
    torch.save(record, Path(folder) / f"code{rank}.pt")


def code(checkout, setting: dict, initial, log, masks, test, sizes: tuple = SIZES) -> list[dict]:
    """The code's run, one spawned process per client; per client, its recorded rounds and the epochs it drew."""
    import torch.multiprocessing as mp

    from fedrepro import models

    shapes = [tuple(p.shape) for p in models.build(setting["model"], setting["dataset"]).parameters()]
    world = len(sizes)
    with tempfile.TemporaryDirectory(prefix="fedrepro-parity-fednova-rounds-") as tmp:
        starts = [e["start"] for e in sorted(log, key=lambda e: e["round"]) if e["client"] == 0]
        for c in range(world):
            mine = sorted((e for e in log if e["client"] == c), key=lambda e: e["round"])
            torch.save({"batches": [[list(b) for b in e["batches"]] for e in mine], "test": test,
                        "masks": masks[c], "ratios": [n / sum(sizes) for n in sizes], "initial": initial,
                        "shapes": shapes, "starts": starts}, Path(tmp) / f"pinned{c}.pt")  # fmt: skip
        mp.start_processes(_rank, args=(world, str(checkout), tmp, setting), nprocs=world, join=True,
                           start_method="spawn")  # fmt: skip
        return [torch.load(Path(tmp) / f"code{c}.pt") for c in range(world)]


def _oracle(checkout, setting: dict, log: list[dict], rounds: list[dict], masks: dict, sizes: tuple) -> list[dict]:
    """The code's optimiser in float64 (``clients_fednova.code``: in-process, fedrepro's VGG-11, the same function
    as the code's) on the same batches, round starts, rates and dropout masks."""
    queues, current = {c: list(m) for c, m in masks.items()}, {"client": None}
    original, dtype = torch.nn.functional.dropout, torch.get_default_dtype()
    torch.nn.functional.dropout = _masked_dropout(lambda input, p: queues[current["client"]].pop(0).to(input.dtype))
    torch.set_default_dtype(torch.float64)
    try:
        return clients_fednova.code(
            checkout, setting, log, rounds, on_client=lambda c: current.update(client=c), sizes=sizes
        )
    finally:
        torch.nn.functional.dropout = original
        torch.set_default_dtype(dtype)


def compare_case(checkout, setting: dict, code_setting: dict | None = None, sizes: tuple = SIZES,
                 pin_epochs: bool = True, oracle: bool = True) -> dict:  # fmt: skip
    """One case: fedrepro at ``setting``, the code at ``code_setting`` (default the same; a test breaks one term
    on one side only), clients of ``sizes`` samples. With +random_epochs fedrepro takes the code's draws
    (``pin_epochs`` False: its own, as a test of the check). ``oracle``: past the float32 bounds, judge against
    the code's float64 run (ORACLE_FACTOR); off, a case past its bounds differs."""
    from fedrepro.algorithms.fednova import a_norm
    from fedrepro.parity import rounds_fednova_script as script

    code_setting = code_setting or setting
    random_epochs = "random_epochs" in code_setting["plugins"]
    drawn = script.code_epochs(checkout, code_setting, len(sizes), setting["rounds"]) if random_epochs else None
    initial, log, rounds, masks = _ours(setting, sizes, drawn if pin_epochs else None)
    _, test, _ = _problem(sizes)
    got = code(checkout, code_setting, initial, log, masks, test.batch(torch.arange(len(test))), sizes)
    nova, momentum = setting["algorithm"] == "fednova", setting["client"]["momentum"]
    mu, gmf = (setting["fednova"]["mu"], setting["fednova"]["server_momentum"]) if nova else (0.0, 0.0)
    carried = script.CarriedMomentum(gmf) if gmf else None
    worst = {"client": 0.0, "global": 0.0, "a": 0.0}
    rates_differ, steps_differ, epochs_differ, ranks_agree = set(), set(), set(), True
    for t, mine in enumerate(rounds):
        ends = []
        for j, c in enumerate(mine["clients"]):
            e = next(e for e in log if e["round"] == t and e["client"] == c)
            theirs, n = got[c]["rounds"][t], int(mine["steps"][j])
            if abs(theirs["lr"] - e["lr"]) > LR_RELATIVE * e["lr"]:
                rates_differ.add(t)
            if theirs["steps"] != n:
                steps_differ.add(t)
            if random_epochs and got[c]["epochs"][t] != len(e["batches"]):
                epochs_differ.add(t)
            if nova:
                a = a_norm(n, e["lr"], momentum, mu)
                worst["a"] = max(worst["a"], abs(theirs["a"] - a) / a / A_RELATIVE)
            ends.append(float(e["end"].abs().max()))
            gap = float((theirs["client"] - e["end"]).abs().max()) / ends[-1]
            worst["client"] = max(worst["client"], gap / client_bound(n, momentum))
        code_global = got[0]["rounds"][t]["global"]
        ranks_agree &= all(torch.equal(got[c]["rounds"][t]["global"], code_global) for c in range(len(sizes)))
        bound = script.global_model_bound(setting, mine, e["lr"], ends, carried)
        worst["global"] = max(worst["global"], float((code_global - mine["x_new"]).abs().max()) / bound)
    agree = not rates_differ and not steps_differ and not epochs_differ and ranks_agree
    equal = agree and all(v <= 1 for v in worst.values())
    distances = {}  # past the bounds: each float32 run's distance from the code's float64 run
    if oracle and agree and not equal:
        exact = _oracle(checkout, code_setting, log, rounds, masks, sizes)
        distances = {"ours_client": 0.0, "code_client": 0.0, "ours_global": 0.0, "code_global": 0.0}
        for t, mine in enumerate(rounds):
            for c in mine["clients"]:
                e = next(e for e in log if e["round"] == t and e["client"] == c)
                x64 = exact[t]["clients"][c]["end"]
                scale = float(x64.abs().max())
                for side, x in (("ours", e["end"]), ("code", got[c]["rounds"][t]["client"])):
                    gap = float((x.double() - x64).abs().max()) / scale
                    distances[f"{side}_client"] = max(distances[f"{side}_client"], gap)
            x64 = exact[t]["x_new"]
            for side, x in (("ours", mine["x_new"]), ("code", got[0]["rounds"][t]["global"])):
                gap = float((x.double() - x64).abs().max()) / float(x64.abs().max())
                distances[f"{side}_global"] = max(distances[f"{side}_global"], gap)
        # fedrepro no farther from the exact computation than twice the code's own float32 run
        equal = all(distances[f"ours_{k}"] <= ORACLE_FACTOR * distances[f"code_{k}"] for k in ("client", "global"))
    return {
        "rounds": setting["rounds"], "clients": len(sizes), "sizes": list(sizes), "model": setting["model"],
        "client_gap_over_bound": worst["client"], "global_gap_over_bound": worst["global"],
        **({"a_gap_over_bound": worst["a"]} if nova else {}), "rounds_rates_differ": sorted(rates_differ),
        "rounds_steps_differ": sorted(steps_differ), "ranks_agree": ranks_agree,
        **({"rounds_epochs_differ": sorted(epochs_differ), "code_epochs": [g["epochs"] for g in got]}
           if random_epochs else {}),
        "parameters_hold_average": all(r["parameters_hold_average"] for g in got for r in g["rounds"]),
        "rates": [[got[0]["rounds"][t]["lr"], next(e["lr"] for e in log if e["round"] == t)]
                  for t in range(setting["rounds"])],
        **({"float64_oracle": distances} if distances else {}), "status": "equal" if equal else "differs",
    }  # fmt: skip


def compare_script_case(checkout, setting: dict, code_setting: dict | None = None, pin_epochs: bool = True) -> dict:
    """One of ``rounds_fednova_script``'s cases, on its smaller clients, where the float32 bounds hold (each case
    well inside them), so without the float64 fallback: that judgement cannot see FedProx's term at Table I's mu
    (float32 rounding grows past what the whole term moves; docs/parity.md)."""
    from fedrepro.parity import rounds_fednova_script as script

    return compare_case(checkout, setting, code_setting, script.SIZES, pin_epochs, oracle=False)


def compare_fednova(checkout) -> list[dict]:
    """The FedNova cases (E_i = 2: SGD, momentum, proximal) on SIZES, then the script's other settings
    (``rounds_fednova_script``: FedAvg with momentum and FedProx at E_i = 2, every row the script has at U(2,5)) on
    its smaller clients; the first random-epochs case keeps how the two generators' draws differ over a Table I
    run."""
    from fedrepro.parity import rounds_fednova_script as script

    rows = [{"case": label, **compare_case(checkout, setting)} for label, setting in fednova_settings().items()]
    law_kept = False  # every U(2,5) case draws from the same generator: its law is kept once
    for label, setting in script.script_settings().items():
        row = {"case": label, **compare_script_case(checkout, setting)}
        if "random_epochs" in setting["plugins"] and not law_kept:
            row["draw_law"], law_kept = script.draw_law(checkout, setting), True
        rows.append(row)
    return rows
