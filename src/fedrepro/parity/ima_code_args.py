"""How IMA's code is told to run a fedrepro setting: its Server method and aggregation mode, its arguments, its draw
of each round's clients, and the name of a round-check case."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

DECAYS = {"exponential": "EXD", "constant": "CLR", "none": "NAD", "epoch": "ED", "cyclic": "CD"}
# fedrepro's method -> the code's Server method and aggregation mode with IMA, as the IMA notebook calls them
CODE_METHODS = {
    "fedavg": ("fedavg", "ima"),
    "fedprox": ("fedprox", "ima"),
    "fedasam": ("fedsam", "ima"),
    "fedgma": ("fedavg", "gma+ima"),
    "fedfa": ("fedfa_anchorloss", "ima"),
    "fedadam": ("fedavg", "fedadam+ima"),
    "fedyogi": ("fedavg", "fedyogi+ima"),
    "fednova": ("fednova", "fednova+ima"),
}
# IMA's arguments on a run without it (the code reads them only in its IMA branches)
BARE_IMA = {"start_round": 0, "window": 0, "constant_lr": 0.0, "lr_decay": 1.0, "cycle_rounds": 1, "decay": "none"}


def code_method(setting: dict) -> tuple[str, str]:
    """The code's Server method and aggregation mode for a setting: its notebooks' ``agg_mode`` without IMA is the
    IMA mode's prefix (``wa`` for the plain weighted mean)."""
    method, agg_mode = CODE_METHODS[setting["algorithm"]]
    if "ima" in setting["plugins"]:
        return method, agg_mode
    return method, agg_mode.removesuffix("+ima") if "+" in agg_mode else "wa"


# the code picks ASAM's rho and eta by ``'CNN' in args.split`` (0.7 and 0.2, else 0.2 and 0.05); the notebook's
# default split names the CNN
CODE_SPLIT = "2CNN_2"


def code_cohort(seed: int, t: int, num_clients: int, k: int) -> np.ndarray:
    """The clients IMA's server loops sample in round t: numpy's legacy global stream seeded with seed + t, then
    ``choice`` of k of the K clients without replacement (fedrepro draws its own: ``run.cohorts``)."""
    return np.random.RandomState(seed + t).choice(range(num_clients), k, replace=False)


def code_args(setting: dict, num_clients: int) -> SimpleNamespace:
    ima, cl = setting.get("ima", BARE_IMA), setting["client"]
    if setting["algorithm"] == "fedasam" and (setting["fedasam"]["rho"], setting["fedasam"]["eta"]) != (0.7, 0.2):
        raise ValueError(f"fedasam {setting['fedasam']}: the code's split {CODE_SPLIT} gives rho 0.7, eta 0.2")
    return SimpleNamespace(
        K=num_clients, C=setting["participation"], r=setting["rounds"], E=setting["local_epochs"],
        B=setting["batch_size"],
        lr=cl["lr"], weight_decay=cl["lr_decay"], momentum=cl["momentum"], optimizer="sgd", device="cpu",
        r_ima=ima["start_round"], window_size=ima["window"], lr_ima=ima["constant_lr"],
        lr_ima_decay=ima["lr_decay"], ima_stage=ima["cycle_rounds"], decay_mode=DECAYS[ima["decay"]],
        seed=setting["seed"], dataset="fmnist", skewness="label", verbose=False, saveModels=False,
        num_classes=10, dims_feature=128, setup="parity", split=CODE_SPLIT,
        mu=setting.get("fedprox", {}).get("mu", 0.0), lambda_anchor=setting.get("fedfa", {}).get("lam", 0.0),
        momentum_anchor=setting.get("fedfa", {}).get("momentum", 0.0),
    )  # fmt: skip


def case_name(setting: dict) -> str:
    method = {"fedavg": "FedAvg", "fedprox": "FedProx", "fedasam": "FedASAM", "fedgma": "FedGMA", "fedfa": "FedFA",
              "fedadam": "FedAdam", "fedyogi": "FedYogi", "fednova": "FedNova"}[setting["algorithm"]]  # fmt: skip
    loop, agg_mode = code_method(setting)
    if "ima" in setting["plugins"]:
        ima = setting["ima"]
        method += (
            f" + IMA, decay {ima['decay']} (code: {DECAYS[ima['decay']]}), window {ima['window']} from round "
            f"{ima['start_round']}"
        )
    else:
        method += f" without IMA, {setting['rounds']} rounds"
    if setting["participation"] < 1:
        method += f", participation {setting['participation']:g} (the code's draws)"
    plain = setting["algorithm"] == "fedavg" and agg_mode in ("ima", "wa")
    return method + ("" if plain else f" (code: Server.{loop}, agg_mode {agg_mode})")
