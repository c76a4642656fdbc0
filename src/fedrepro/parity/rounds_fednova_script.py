"""FedNova's training script at Table I's other settings, for the round check (``rounds_fednova``): the command
line that runs a fedrepro setting in ``train_LocalSGD.py``, the script's draws of random epochs, and the bounds of
the two server steps the FedNova cases do not have.

The cases (params/fednova.yaml's Table I rows, shrunk as the FedNova cases, on smaller clients so that a case
costs a minute or two of one core): FedAvg with local momentum (E_i = 2, lr 0.02, momentum 0.9: the FedAvg line of
the code's ``launch_exp.sh``) and FedProx (E_i = 2, lr 0.05, mu 0.005), both through the script's ``FedProx``
optimiser (its ``--optimizer fedavg`` is that class with mu 0; its ``average()`` is the ratio-weighted sum of the
client models and never reads ``--gmf``); FedNova with server momentum 0.9 (``--gmf``) at E_i(t) ~ U(2,5)
(``--pattern uniform_random --localE 6``: the script draws ``randint(2, localE)``, so 6 for {2, ..., 5}).

The epochs are the code's: ``code_epochs`` calls the script's own ``update_local_epochs`` (unchanged; numpy's
global stream seeded with 2020 + rank + round + seed) for every rank and round, and fedrepro's run takes those
draws in place of its +random_epochs draws; the ranks draw them again themselves and the check compares them.
``draw_law`` measures how the two generators' draws differ over a whole Table I run (16 clients, 100 rounds).

FedAvg's and FedProx's new model is what the code's ``average()`` all-reduces (the sum of ratio_i x_i over the
ranks), recorded as ``comm_helpers.communicate`` returns it: that function then rebinds each ``p.data`` to the sum,
which on the torch of the code's README (1.0.0) moved the parameters and since torch 1.13 rebinds a shallow copy
only (1.1 to 1.12 refuse it), so here the ranks' parameters keep ratio_i x_i; the record says which
(``parameters_hold_average``). FedNova's ``average()`` copies its new model in, on any torch."""

from __future__ import annotations

import copy
import logging
import sys

import numpy as np

from fedrepro.parity.clients import EPS32
from fedrepro.parity.clients_fednova import global_bound, mean_bound
from fedrepro.parity.shim import checkout_on_path

SIZES = (12, 9, 20)  # 1, 1 and 2 batches of 16 an epoch, each epoch's last batch partial
# every round case, the FedNova ones too (``rounds_fednova``): all clients every round, 4 rounds (the rate /10 at
# round 2 and /100 at round 3, milestones at whole rounds), two epochs (or the case's draws) of batches of 16
SHRUNK = {"participation": 1.0, "rounds": 4, "local_epochs": 2, "batch_size": 16, "device": "cpu"}
SCRIPT_WEIGHT_DECAY = 1e-4  # train_LocalSGD.py builds every optimiser with weight_decay=1e-4
# Table I's rows (experiment, algorithm, client momentum, server momentum, FedNova's mu) the cases run: at E_i = 2
# the two the FedNova cases do not (FedAvg with momentum, FedProx), at U(2,5) every row the script has (SCAFFOLD and
# FedNova-VR are not in it)
E2, U25 = "fednova_table1_e2", "fednova_table1_u25"
CASES = ((E2, "fedavg", 0.9, 0.0, 0.0), (E2, "fedprox", 0.0, 0.0, 0.0),
         (U25, "fedavg", 0.0, 0.0, 0.0), (U25, "fedavg", 0.9, 0.0, 0.0), (U25, "fedprox", 0.0, 0.0, 0.0),
         (U25, "fednova", 0.0, 0.0, 0.0), (U25, "fednova", 0.9, 0.0, 0.0), (U25, "fednova", 0.0, 0.0, 0.001),
         (U25, "fednova", 0.0, 0.9, 0.0), (U25, "fednova", 0.9, 0.9, 0.0))  # fmt: skip


def row_of(experiment: str, s: dict) -> tuple:
    """A setting's Table I row, as CASES names them."""
    nova = s.get("fednova", {})
    return (experiment, s["algorithm"], s["client"]["momentum"], nova.get("server_momentum", 0.0), nova.get("mu", 0.0))


def _label(s: dict) -> str:
    lr, momentum = s["client"]["lr"], s["client"]["momentum"]
    if "random_epochs" in s["plugins"]:
        c = s["random_epochs"]
        code = f"--pattern uniform_random --localE {c['high'] + 1}"
        epochs = f"E_i(t) ~ U({c['low']},{c['high']}) (code: {code}, the code's draws)"
    else:
        epochs = f"E_i = {s['local_epochs']}"
    if s["algorithm"] in ("fedavg", "fedprox"):
        mu = f", mu {s['fedprox']['mu']:g}" if s["algorithm"] == "fedprox" else ""
        head = f"{'FedAvg' if s['algorithm'] == 'fedavg' else 'FedProx'} (code: --optimizer {s['algorithm']})"
        return f"{head}, lr {lr:g}, momentum {momentum:g}{mu}, {epochs}"
    nova = s["fednova"]
    gmf, mu = nova["server_momentum"], nova.get("mu", 0.0)
    server = f"server momentum {gmf:g} (code: --gmf {gmf:g})"
    return f"FedNova, lr {lr:g}, momentum {momentum:g}, mu {mu:g}, {server}, {epochs}"


def script_cases() -> dict[tuple, tuple[str, dict]]:
    """{Table I row (as CASES): (label, fedrepro setting)}: params/fednova.yaml's rows, shrunk (``SHRUNK``, on
    ``SIZES``)."""
    from fedrepro.configure import expansion, paramsfile
    from fedrepro.configure.paramsfile import ROOT

    found = {}
    for run in expansion.expand(paramsfile.load_params_files([str(ROOT / "params" / "fednova.yaml")])):
        s, row = run.setting, row_of(run.experiment, run.setting)
        if row in CASES and not s.get("fednova", {}).get("vr") and row not in found:
            found[row] = (_label(s), {**copy.deepcopy(s), **SHRUNK, "num_clients": len(SIZES)})
    return found


def script_settings() -> dict[str, dict]:
    """The cases' fedrepro settings by label."""
    return dict(script_cases().values())


def script_argv(setting: dict, world: int, rank: int, folder: str) -> list[str]:
    """``train_LocalSGD.py``'s command line for a fedrepro setting; a setting the script cannot run is refused in
    one line naming the setting."""
    from fedrepro.parity.clients_fednova import code_optimiser

    cl = setting["client"]
    _, method = code_optimiser(setting)
    refused = [
        (cl["weight_decay"] != SCRIPT_WEIGHT_DECAY, f"client.weight_decay {cl['weight_decay']:g}: the script's 1e-4"),
        (setting["server"]["lr"] != 1.0, f"server.lr {setting['server']['lr']:g}: the script has none (1)"),
        (cl["lr_milestones"] != [0.5, 0.75] or cl["lr_milestone_factor"] != 0.1 or cl["lr_decay"] != 1.0,
         "client.lr_milestones, lr_milestone_factor, lr_decay: the script drops the rate /10 at 50% and 75% only"),
        (setting.get("server", {}).get("momentum", 0.0) != 0.0, "server.momentum: the script's FedProx has none"),
    ]  # fmt: skip
    if "random_epochs" in setting["plugins"]:
        low, high = setting["random_epochs"]["low"], setting["random_epochs"]["high"]
        refused.append((low != 2, f"random_epochs.low {low}: the script draws from {{2, ..., localE - 1}}"))
        pattern = ["--pattern", "uniform_random", "--localE", str(high + 1)]
    else:
        pattern = ["--pattern", "constant", "--localE", str(setting["local_epochs"])]
    for bad, why in refused:
        if bad:
            raise ValueError(f"FedNova's train_LocalSGD.py cannot run this setting: {why}")
    return ["train_LocalSGD.py", "--backend", "gloo", "--initmethod", f"file://{folder}/init", "--size", str(world),
            "--rank", str(rank), "--optimizer", setting["algorithm"], "--model", "VGG", "--lr", repr(cl["lr"]),
            "--momentum", repr(cl["momentum"]), "--mu", repr(method["mu"]), "--gmf", repr(method["gmf"]),
            "--bs", str(setting["batch_size"]), *pattern, "--rounds", str(setting["rounds"]), "--savepath",
            f"{folder}/", "--name", "parity", "--NIID", "-p", "--seed", str(setting["seed"])]  # fmt: skip


def code_epochs(checkout, setting: dict, world: int, rounds: int, seed: int | None = None) -> dict:
    """{(round, rank): epochs} as the script's own ``update_local_epochs`` draws them for ``setting`` (its seed,
    or ``seed``); numpy's global stream and the logging set-up the module's import changes are restored."""
    if seed is not None:
        setting = {**setting, "seed": seed}
    argv, state = sys.argv, np.random.get_state()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    sys.argv = script_argv(setting, world, 0, "/nonexistent")
    try:
        with checkout_on_path(checkout, stubs=("mpi4py",), placeholders={"models": ["LogisticRegression"]}):
            import train_LocalSGD

            draw, pattern = train_LocalSGD.update_local_epochs, train_LocalSGD.args.pattern
            return {(t, r): int(draw(pattern, r, t)) for t in range(rounds) for r in range(world)}
    finally:
        sys.argv = argv
        np.random.set_state(state)
        root.handlers[:], root.level = handlers, level


def draw_law(checkout, setting: dict, clients: int = 16, rounds: int = 100) -> dict:
    """The two generators' epochs over a Table I run (16 clients, 100 rounds, the setting's seed): the values each
    draws and how often, and the share of (client, round) whose draw repeats the next client's of the round before:
    the script seeds with 2020 + rank + round + seed, so E(r, t) = E(r + 1, t - 1) always; fedrepro's draws are
    independent across clients and rounds (a quarter of the pairs agree by chance)."""
    from fedrepro.algorithms.random_epochs import RandomEpochs

    c = setting["random_epochs"]
    code = code_epochs(checkout, {**setting, "rounds": rounds}, clients, rounds)
    ours_draw = RandomEpochs(setting["seed"], c["low"], c["high"])
    ours = {(t, r): ours_draw(t, r) for t in range(rounds) for r in range(clients)}

    def summary(draws):
        values = np.array(list(draws.values()))
        shifted = [draws[(t, r)] == draws[(t - 1, r + 1)] for t in range(1, rounds) for r in range(clients - 1)]
        return {"values": {int(v): int((values == v).sum()) for v in np.unique(values)},
                "repeats_next_client_round_before": float(np.mean(shifted))}  # fmt: skip

    return {"clients": clients, "rounds": rounds, "seed": setting["seed"], "code": summary(code),
            "ours": summary(ours), "status": "equal" if code == ours else "differs"}  # fmt: skip


class CarriedMomentum:
    """The bound of FedNova's new global model with the code's server momentum (``--gmf``; fedrepro's
    ``LrScaledMomentum``): each side keeps its own buffer v (in d / lr units) across rounds while the round's start
    x is pinned, so a gap left in the buffer carries on. In parameter units, V_t bounds lr_t |v_t^code - v_t^ours|:

        V_t = gmf (lr_t / lr_{t-1}) V_{t-1} + D_t + 7 eps M_t,     gap(x_new_t) <= V_t + 5 eps M_t,

    with D_t the gap of the all-reduced d (``clients_fednova.global_bound`` times xmax, which over-counts by the
    subtraction it includes), M_t the largest of max|d|, max|x - x_new| (= lr_t |v_t|), its part from the old buffer
    (gmf lr_t |v_{t-1}|) and max|x_new|, and the roundings: both sides round d / lr, gmf v and the sum (six), the
    code's d / lr term is a product and a sum (one more); lr v and x - lr v (four), fedrepro's lr as a float32
    scalar (one)."""

    def __init__(self, gmf: float):
        self.gmf, self.carried, self.lr = gmf, 0.0, None

    def __call__(self, lr: float, d_gap: float, d_max: float, step_max: float, old_max: float, x_new_max: float):
        m = max(d_max, step_max, old_max, x_new_max)
        shrink = self.gmf * (lr / self.lr) if self.lr is not None else 0.0
        self.carried, self.lr = shrink * self.carried + d_gap + 7 * EPS32 * m, lr
        return self.carried + 5 * EPS32 * m


def global_model_bound(setting: dict, mine: dict, lr: float, ends: list[float], carried) -> float:
    """The bound of the new global model's gap, in parameter units: FedNova's (``clients_fednova.global_bound``;
    with server momentum, ``CarriedMomentum``), or FedAvg's and FedProx's weighted mean
    (``clients_fednova.mean_bound``)."""
    xmax = float(mine["x"].abs().max())
    steps, momentum = [int(s) for s in mine["steps"]], setting["client"]["momentum"]
    spread = sum(float(sh.abs().max()) for sh in mine["shares"])
    if setting["algorithm"] != "fednova":
        return mean_bound(mine["scale"], steps, momentum, ends, xmax, spread) * xmax
    d_gap = global_bound(list(mine["scale"]) + [spread / xmax], steps, momentum) * xmax
    if carried is None:
        return d_gap
    d, step = mine["shares"].sum(0), mine["x"] - mine["x_new"]
    return carried(lr, d_gap, float(d.abs().max()), float(step.abs().max()), float((step - d).abs().max()),
                   float(mine["x_new"].abs().max()))  # fmt: skip
