"""The server steps of FedAWARE's baselines (``baselines/``), the code's and fedrepro's, over three rounds of the
same uploads: FedAvgM (server momentum), FedYogi (``fedopt.py -option yogi``), FedAMS (``fedams.py -option
fedams``), FedDyn (the server state h) and FedProx (FedLab's ``FedProxServerHandler``: an unweighted mean).

The code's side: each script's server handler, unchanged (its definitions executed from the file, as
``servers_fedaware.definitions``; the scripts train at import), built as the script builds it
(``model``, ``global_round``, ``sample_ratio``; ``num_clients``; ``setup_optim`` with the script's arguments, those
of ``exp_scripts/run_cifar10_dirichlet.sh`` and ``run_fedams.sh``: ``-fedm_beta 0.7``, ``-beta1 0.9 -beta2 0.99
-tau 0.0001``, ``-eps 1e-8``, ``-alpha_dyn``), fed through FedLab's ``load`` the uploads of the round's clients in
ascending id order, its sampler's unsorted draw (``last_sampled``, the pairing FedAvgM, FedYogi and FedAMS read
for their data-size weights) set to fedrepro's draw (``cohorts.code_pairing``). fedrepro's side: each method built by
its registry from the setting params/fedaware.yaml with params/subsets/fedaware_official_protocol.yaml resolves for
Table 2's CIFAR-10 (the code's pairing for the FeedbackSampler's methods, ``fedprox.mean: uniform``, FedDyn's paper
form), its server lr and terms the code's arguments. Twelve clients of unequal sizes, four a round, in float64
(torch's default dtype inside the check): the same arithmetic up to order, bound 1e-12 of the model's scale."""

from __future__ import annotations

import copy
import functools
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from fedrepro.parity.servers_fedaware import (
    PLACEHOLDERS,
    PROTOCOL,
    REPLACE,
    STUBS,
    _gap,
    _unit_gram,
    definitions,
    require_fedlab,
)
from fedrepro.parity.shim import checkout_on_path

RELATIVE = 1e-12
SIZES = (40, 310, 95, 180, 60, 520, 75, 230, 150, 45, 390, 120)
K, ROUNDS = 4, 3
AWARE_ROUNDS = 4  # the projection acts once every client has been seen: rounds 2 and 3
# the hosts whose scripts project onto AWARE's direction (-projection 1, run_projection_cifar10.sh; FedProx's has no
# projection, its xAWARE row no script); FedAvg is compared here with its projection only (its plain step is the
# server check's warm-up step)
AWARE_HOSTS = ("fedavg", "fedavgm", "fedyogi", "fedams")
# fedopt.py and fedams.py take their uploads as x_i - x (the others x - x_i) and give the projector those: its
# momenta are ours negated, so is its min-norm direction, and the projection, sign-blind, is the same
NEGATED = ("fedyogi", "fedams")
# our method -> (the script, its server handler, its arguments: {code name: (our section, our key) or a value},
# the setting's overrides: the code's scripts' values; FedAMS's eps floor made 1e-4 (the scripts' 1e-8 lies below
# every v_t here, so the floor would not act))
CASES = {
    "fedavg": ("fedavg.py", "FedAvgServerHandler", {}, {}),
    "fedavgm": ("fedavgm.py", "FedAvgMServerHandler", {"fedm_beta": ("fedavgm", "momentum")}, {}),
    "fedyogi": ("fedopt.py", "FedOptServerHandler_",
                {"beta1": ("fedyogi", "beta1"), "beta2": ("fedyogi", "beta2"), "tau": ("fedyogi", "tau"),
                 "option": "yogi"}, {"server": {"lr": 0.01}}),
    "fedams": ("fedams.py", "FedAMSServerHandler",
               {"beta1": ("fedams", "beta1"), "beta2": ("fedams", "beta2"), "eps": ("fedams", "eps"),
                "option": "fedams"}, {"server": {"lr": 0.01}, "fedams": {"eps": 1e-4}}),
    "feddyn": ("feddyn.py", "FedDynServerHandler", {"alpha_dyn": ("feddyn", "alpha")}, {}),
    "fedprox": ("fedprox.py", "FedProxServerHandler_", {}, {}),
}  # fmt: skip


# utils.py at HEAD no longer defines ``projection`` (a method of its FedAWARE_Projector now), which fedams.py
# imports; no server step calls it (``-projection`` is 0 in every FedAMS script line but run_projection_cifar10.sh)
BASELINE_PLACEHOLDERS = {**PLACEHOLDERS, "utils": ["projection"]}


@functools.lru_cache(maxsize=1)
def _table2_cifar10() -> tuple:
    from fedrepro.configure import expansion, paramsfile

    runs = expansion.expand(paramsfile.load_params_files([str(paramsfile.ROOT / p) for p in PROTOCOL]))
    return tuple(r.setting for r in runs if r.experiment == "fedaware_table2_cifar10")


def our_setting(method: str, aware: bool = False) -> dict:
    """Table 2's CIFAR-10 setting of ``method`` under the code's protocol (with ``aware``: its xAWARE row)."""
    found = next(s for s in _table2_cifar10() if s["algorithm"] == method and ("aware" in s["plugins"]) == aware)
    setting = copy.deepcopy(found)
    for section, values in CASES[method][3].items():
        setting[section] = {**setting[section], **values}
    return setting


def _code_handler(checkout: Path, method: str, setting: dict, model: torch.nn.Module, aware: bool = False):
    script, name, arguments, _ = CASES[method]
    module = definitions(checkout / "baselines" / script, Path(script).stem)
    handler = getattr(module, name)(model=model, global_round=AWARE_ROUNDS, sample_ratio=K / len(SIZES))
    handler.num_clients = len(SIZES)
    values = {k: (setting[v[0]][v[1]] if isinstance(v, tuple) else v) for k, v in arguments.items()}
    if method == "feddyn":
        handler.setup_optim(values["alpha_dyn"])
        return handler
    weights = np.asarray(SIZES, dtype=float) / sum(SIZES)
    args = SimpleNamespace(glr=setting["server"]["lr"], weights=weights, projection=int(aware), k=K, method=method,
                           alpha=setting.get("aware", {}).get("alpha", 0.5), **values)  # fmt: skip
    handler.setup_optim(SimpleNamespace(last_sampled=None, explored=False), args)
    return handler


def run(checkout, method: str, ours_changed=None, aware: bool = False) -> dict:
    """Three rounds of the method's server step on both sides (four with ``aware``, the host's step projected onto
    AWARE's direction); ``ours_changed`` (tests): {section: {key: value}} laid over our setting alone."""
    from fedrepro import algorithms
    from fedrepro.parts import RoundUpdates
    from fedrepro.run.cohorts import code_pairing, sample_cohort

    setting = our_setting(method, aware)
    seed, warmup, n = setting["seed"], setting["cohort"]["warmup"], len(SIZES)
    explored_from = -(-n // K) - 1  # the sampler's exploration walks every client once, K a round
    sign = -1.0 if method in NEGATED else 1.0
    code_paired = setting["cohort"]["assignment"] == "code"
    with checkout_on_path(Path(checkout), stubs=STUBS, placeholders=BASELINE_PLACEHOLDERS, replace=REPLACE):
        saved_path = list(sys.path)
        try:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
            random.seed(seed)
            handler = _code_handler(Path(checkout), method, setting, model, aware)
            x = handler.model_parameters.clone()
            mine = copy.deepcopy(setting)
            for section, values in (ours_changed or {}).items():
                mine[section] = {**mine[section], **values}
            sizes = torch.tensor(SIZES, dtype=torch.float64)
            ours = algorithms.build(mine, num_clients=n, dim=len(x), device=torch.device("cpu"),
                                    client_sizes=sizes, module=None, proxy=None)  # fmt: skip
            if aware:  # the momenta in float64 for the comparison, as servers_fedaware holds FedAWARE's
                held = ours.optimizer.momenta
                held.momenta, held.sizes = held.momenta.double(), held.sizes.double()
            gen = torch.Generator().manual_seed(1)
            common = torch.randn(len(x), generator=gen, dtype=torch.float64)
            rows = []
            for t in range(AWARE_ROUNDS if aware else ROUNDS):
                uploaders = sample_cohort(seed, t, n, K, warmup)  # ascending ids: the order clients upload in
                drawn = code_pairing(seed, t, n, K, warmup)
                if hasattr(handler, "sampler"):
                    handler.sampler = SimpleNamespace(last_sampled=(drawn, None), explored=t >= explored_from)
                deltas = 0.1 * common + 0.05 * torch.randn(K, len(x), generator=gen, dtype=torch.float64)
                for delta in deltas:
                    handler.load([x - delta])
                code_x = handler.model_parameters.clone()
                credited = drawn if code_paired else uploaders
                updates = RoundUpdates(t, torch.as_tensor(credited), deltas.clone(),
                                       torch.tensor([float(SIZES[i]) for i in credited], dtype=torch.float64),
                                       torch.zeros(K), torch.zeros(K), 0.01)  # fmt: skip
                ours_x = ours.server_step(x, updates)
                row = {"round": t, "uploaders": [int(i) for i in uploaders], "code_draw": drawn.tolist(),
                       "model_gap": float((code_x - ours_x).abs().max()), "model_scale": float(code_x.abs().max()),
                       "step": float((code_x - x).abs().max()),
                       "bound": RELATIVE * float(code_x.abs().max())}  # fmt: skip
                if aware and updates.info.get("aware_projected"):
                    row.update(_projection_bound(handler.projector, ours.optimizer.momenta, updates.info, sign))
                    row["bound"] += row["projection_bound"]
                rows.append(row)
                x = code_x.clone()
        finally:
            sys.path[:] = saved_path  # the scripts append "./" to sys.path
    return {"rows": rows, "setting": setting}


def _projection_bound(projector, momenta, info: dict, sign: float) -> dict:
    """The projected step's bound. With s the host's step and a, b the two solvers' directions (in the
    normalised momenta's units), |(s.a^)a^ - (s.b^)b^| <= 2 |s| |a^ - b^| <= 4 |s| |a - b| / |b|, and
    |a - b| <= sqrt(g_code) + sqrt(g_ours), each solver's Frank-Wolfe duality gap on the same Gram matrix (the
    min-norm step's argument, ``servers_fedaware``). |s| from our projection's scale and cosine."""
    code_m = sign * torch.stack(projector.momentum)
    lam_c = torch.as_tensor(projector.feedback, dtype=torch.float64)
    lam_o = info["aware_lambda"]
    gram = _unit_gram(momenta.momenta)
    direction = lam_o / momenta.momenta.norm(dim=1) @ momenta.momenta
    step_norm = abs(info["aware_scale"]) * float(direction.norm()) / max(abs(info["aware_cosine"]), 1e-300)
    fw_code, fw_ours = _gap(_unit_gram(code_m), lam_c / lam_c.sum()), _gap(gram, lam_o)
    return {"momenta_gap": float((code_m - momenta.momenta).abs().max() / code_m.abs().max()),
            "fw_gap_code": fw_code, "fw_gap_ours": fw_ours,
            "projection_bound": 4 * step_norm * (fw_code**0.5 + fw_ours**0.5) / float(direction.norm())}  # fmt: skip


def compare_fedaware_baselines(checkout) -> list[dict]:
    torch.set_default_dtype(torch.float64)
    require_fedlab()
    try:
        out = []
        for method, aware in [(m, False) for m in CASES if m != "fedavg"] + [(m, True) for m in AWARE_HOSTS]:
            result = run(checkout, method, aware=aware)
            rows, s = result["rows"], result["setting"]
            gap = max(r["model_gap"] / r["model_scale"] for r in rows)
            within = all(r["model_gap"] <= r["bound"] for r in rows)
            momenta_equal = all(r.get("momenta_gap", 0.0) <= RELATIVE for r in rows)
            terms = {k: (s[v[0]][v[1]] if isinstance(v, tuple) else v) for k, v in CASES[method][2].items()}
            out.append({"method": method, "case": f"{method}{' + AWARE projection' if aware else ''} "
                        f"(baselines/{CASES[method][0]}; server lr "
                        f"{s['server']['lr']:g}, {', '.join(f'{k} {v}' for k, v in terms.items()) or 'mean uniform'})",
                        "clients": list(SIZES), "rounds": ROUNDS, "relative_gap": gap, "by_round": rows,
                        "status": "equal" if within and momenta_equal and min(r["step"] for r in rows) > 0
                        else "differs"})  # fmt: skip
        return out
    finally:
        torch.set_default_dtype(torch.float32)
