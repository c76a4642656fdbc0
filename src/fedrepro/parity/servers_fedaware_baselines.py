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

from fedrepro.parity.servers_fedaware import PLACEHOLDERS, PROTOCOL, REPLACE, STUBS, definitions, require_fedlab
from fedrepro.parity.shim import checkout_on_path

RELATIVE = 1e-12
SIZES = (40, 310, 95, 180, 60, 520, 75, 230, 150, 45, 390, 120)
K, ROUNDS = 4, 3
# our method -> (the script, its server handler, its arguments: {code name: (our section, our key) or a value},
# the setting's overrides: the code's scripts' values; FedAMS's eps floor made 1e-4 (the scripts' 1e-8 lies below
# every v_t here, so the floor would not act))
CASES = {
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
    return tuple(r.setting for r in runs if r.experiment == "fedaware_table2_cifar10" and not r.setting["plugins"])


def our_setting(method: str) -> dict:
    found = next(s for s in _table2_cifar10() if s["algorithm"] == method)
    setting = copy.deepcopy(found)
    for section, values in CASES[method][3].items():
        setting[section] = {**setting[section], **values}
    return setting


def _code_handler(checkout: Path, method: str, setting: dict, model: torch.nn.Module):
    script, name, arguments, _ = CASES[method]
    module = definitions(checkout / "baselines" / script, Path(script).stem)
    handler = getattr(module, name)(model=model, global_round=ROUNDS, sample_ratio=K / len(SIZES))
    handler.num_clients = len(SIZES)
    values = {k: (setting[v[0]][v[1]] if isinstance(v, tuple) else v) for k, v in arguments.items()}
    if method == "feddyn":
        handler.setup_optim(values["alpha_dyn"])
        return handler
    weights = np.asarray(SIZES, dtype=float) / sum(SIZES)
    args = SimpleNamespace(glr=setting["server"]["lr"], weights=weights, projection=0, k=K, method=method, **values)
    handler.setup_optim(SimpleNamespace(last_sampled=None, explored=False), args)
    return handler


def run(checkout, method: str, ours_changed=None) -> dict:
    """Three rounds of the method's server step on both sides; ``ours_changed`` (tests): {section: {key: value}}
    laid over our setting alone."""
    from fedrepro import algorithms
    from fedrepro.parts import RoundUpdates
    from fedrepro.run.cohorts import code_pairing, sample_cohort

    setting = our_setting(method)
    seed, warmup, n = setting["seed"], setting["cohort"]["warmup"], len(SIZES)
    code_paired = setting["cohort"]["assignment"] == "code"
    with checkout_on_path(Path(checkout), stubs=STUBS, placeholders=BASELINE_PLACEHOLDERS, replace=REPLACE):
        saved_path = list(sys.path)
        try:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
            random.seed(seed)
            handler = _code_handler(Path(checkout), method, setting, model)
            x = handler.model_parameters.clone()
            mine = copy.deepcopy(setting)
            for section, values in (ours_changed or {}).items():
                mine[section] = {**mine[section], **values}
            sizes = torch.tensor(SIZES, dtype=torch.float64)
            ours = algorithms.build(mine, num_clients=n, dim=len(x), device=torch.device("cpu"),
                                    client_sizes=sizes, module=None, proxy=None)  # fmt: skip
            gen = torch.Generator().manual_seed(1)
            common = torch.randn(len(x), generator=gen, dtype=torch.float64)
            rows = []
            for t in range(ROUNDS):
                uploaders = sample_cohort(seed, t, n, K, warmup)  # ascending ids: the order clients upload in
                drawn = code_pairing(seed, t, n, K, warmup)
                if hasattr(handler, "sampler"):
                    handler.sampler = SimpleNamespace(last_sampled=(drawn, None), explored=False)
                deltas = 0.1 * common + 0.05 * torch.randn(K, len(x), generator=gen, dtype=torch.float64)
                for delta in deltas:
                    handler.load([x - delta])
                code_x = handler.model_parameters.clone()
                credited = drawn if code_paired else uploaders
                updates = RoundUpdates(t, torch.as_tensor(credited), deltas.clone(),
                                       torch.tensor([float(SIZES[i]) for i in credited], dtype=torch.float64),
                                       torch.zeros(K), torch.zeros(K), 0.01)  # fmt: skip
                ours_x = ours.server_step(x, updates)
                rows.append({"round": t, "uploaders": [int(i) for i in uploaders], "code_draw": drawn.tolist(),
                             "model_gap": float((code_x - ours_x).abs().max()),
                             "model_scale": float(code_x.abs().max()),
                             "step": float((code_x - x).abs().max())})  # fmt: skip
                x = code_x.clone()
        finally:
            sys.path[:] = saved_path  # the scripts append "./" to sys.path
    return {"rows": rows, "setting": setting}


def compare_fedaware_baselines(checkout) -> list[dict]:
    torch.set_default_dtype(torch.float64)
    require_fedlab()
    try:
        out = []
        for method in CASES:
            result = run(checkout, method)
            rows, s = result["rows"], result["setting"]
            gap = max(r["model_gap"] / r["model_scale"] for r in rows)
            terms = {k: (s[v[0]][v[1]] if isinstance(v, tuple) else v) for k, v in CASES[method][2].items()}
            out.append({"method": method, "case": f"{method} (baselines/{CASES[method][0]}; server lr "
                        f"{s['server']['lr']:g}, {', '.join(f'{k} {v}' for k, v in terms.items()) or 'mean uniform'})",
                        "clients": list(SIZES), "rounds": ROUNDS, "relative_gap": gap, "by_round": rows,
                        "status": "equal" if gap <= RELATIVE and min(r["step"] for r in rows) > 0
                        else "differs"})  # fmt: skip
        return out
    finally:
        torch.set_default_dtype(torch.float32)
