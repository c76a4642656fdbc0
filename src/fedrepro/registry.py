"""The algorithms and plug-ins: the setting sections each reads and what each refuses, as plain data.

This module imports nothing heavy, so the Snakefile can expand and check a grid of
thousands of runs in well under a second before any job starts. Training code does not import it.
"""
from __future__ import annotations

# The facts training code reads too live in catalog.py, so that editing an algorithm's entry or a
# check here changes no run's identity (identity.code_closure follows imports).
from fedrepro.catalog import DATASETS, FEATURE_CLASSIFIER_MODELS, MODELS, PARTITION_KEYS, ima_start_round  # noqa: F401

# Sections of a setting that only some algorithms or plug-ins read; the others are pruned
# from the resolved setting so that they do not enter its hash.
OPTIONAL_SECTIONS = {"fedprox", "scaffold", "feddyn", "fednova", "fedlaw", "fedaware", "ima", "aware",
                     "fedavgm", "fedcm", "fedadam", "fedyogi", "fedams", "random_epochs",
                     "fedasam", "fedfa", "fedgma", "feddf", "fedbe", "serverft"}


def _proximal_check(section: str):
    def check(setting: dict) -> list[str]:
        mu, lr = setting[section]["mu"], setting["client"]["lr"]
        return [f"{section}.mu * client.lr = {mu * lr:g} must be < 1 (a local proximal step would overshoot "
                f"x_global)"] if mu * lr >= 1 else []
    return check


def _fednova_vr_check(setting: dict) -> list[str]:
    # FedNova-VR corrects with every client's d_i of the previous round: it needs them all, every round
    problems = []
    if setting["fednova"].get("vr") and setting["participation"] < 1:
        problems.append(f"fednova.vr = true needs participation = 1 (every client's normalised gradient of the "
                        f"previous round); participation = {setting['participation']}")
    if setting["fednova"].get("vr") and setting["fednova"]["mu"] > 0 and setting["client"]["momentum"] > 0:
        # the code's ||a_i||_1 recursion is not the correction's weight when both act, so d_i would be wrong
        problems.append(f"fednova.vr = true with both fednova.mu = {setting['fednova']['mu']} and client.momentum = "
                        f"{setting['client']['momentum']}: d_i is exact with one of them only; set one to 0")
    return problems


def _random_epochs_check(setting: dict) -> list[str]:
    c = setting["random_epochs"]
    return [f"random_epochs.low = {c['low']} exceeds random_epochs.high = {c['high']}"] if c["low"] > c["high"] else []


# An algorithm is a preset of named parts (see fedrepro.algorithms); ``sections`` are the
# setting sections it reads. The code its runs depend on is read from their imports
# (identity.code_closure), not listed here.
ALGORITHMS: dict[str, dict] = {
    "fedavg": {"sections": []},
    "fedavgm": {"sections": ["fedavgm"]},
    "fedprox": {"sections": ["fedprox"], "checks": [_proximal_check("fedprox")]},
    "scaffold": {"sections": []},
    "feddyn": {"sections": ["feddyn"]},
    "fedcm": {"sections": ["fedcm"]},
    "fedadam": {"sections": ["fedadam"]},
    "fedyogi": {"sections": ["fedyogi"]},
    "fedams": {"sections": ["fedams"]},
    "fednova": {"sections": ["fednova"],
                "checks": [_proximal_check("fednova"), _fednova_vr_check]},
}


def _fedfa_checks(setting: dict) -> list[str]:
    if setting["model"] not in FEATURE_CLASSIFIER_MODELS:
        return [f"fedfa needs a feature layer followed by a Linear classifier; model '{setting['model']}' is not "
                f"one of {sorted(FEATURE_CLASSIFIER_MODELS)}"]
    return []


ALGORITHMS["fedasam"] = {"sections": ["fedasam"]}
ALGORITHMS["fedgma"] = {"sections": ["fedgma"]}
ALGORITHMS["fedfa"] = {"sections": ["fedfa"], "checks": [_fedfa_checks]}

PLUGINS: dict[str, dict] = {}
PLUGINS["random_epochs"] = {"sections": ["random_epochs"],
                            "checks": [_random_epochs_check]}


def _ima_checks(setting: dict) -> list[str]:
    start, window, rounds = ima_start_round(setting), setting["ima"]["window"], setting["rounds"]
    problems = []
    if start >= rounds:
        problems.append(f"ima.start_round = {start} must be < rounds = {rounds} (rounds are 0-indexed; IMA "
                        "would never start)")
    if window > start:
        problems.append(f"ima.window = {window} is larger than ima.start_round = {start}: the window would not "
                        "be full when IMA starts; use ima.window <= ima.start_round")
    return problems


def _proxy_check(section: str):
    def check(setting: dict) -> list[str]:
        size, spec = setting[section]["proxy_size"], DATASETS[setting["dataset"]]
        uses_proxy = setting[section].get("variant") != "fixed_gamma"
        if uses_proxy and (size % spec["num_classes"] or size >= spec["test_size"]):
            return [f"{section}.proxy_size = {size} must be a multiple of the {spec['num_classes']} classes of "
                    f"{setting['dataset']} (the proxy set is class-balanced) and smaller than its test set"]
        return []
    return check


_fedlaw_checks = _proxy_check("fedlaw")
ALGORITHMS["fedlaw"] = {"sections": ["fedlaw"],
                        "checks": [_fedlaw_checks]}
# FedLAW's server-side baselines, on the same proxy set (algorithms/proxy.py)
ALGORITHMS["feddf"] = {"sections": ["feddf"],
                       "checks": [_proxy_check("feddf")]}
ALGORITHMS["fedbe"] = {"sections": ["fedbe"], "checks": [_proxy_check("fedbe")]}
ALGORITHMS["serverft"] = {"sections": ["serverft"],
                          "checks": [_proxy_check("serverft")]}
ALGORITHMS["fedaware"] = {"sections": ["fedaware"]}
PLUGINS["ima"] = {"sections": ["ima"], "checks": [_ima_checks]}
PLUGINS["aware"] = {"sections": ["aware"],
                    "refuses": {"feddyn": "FedDyn does not follow the global gradient-descent rule x <- x - eta_g d "
                                          "that the projection acts on (FedAWARE, Table 2 leaves it out)"}}

def sections_used(algorithm: str, plugins: list[str]) -> set[str]:
    used = set(ALGORITHMS.get(algorithm, {}).get("sections", []))
    for plugin in plugins:
        used |= set(PLUGINS.get(plugin, {}).get("sections", []))
    return used


def extra_checks(algorithm: str, plugins: list[str]):
    yield from ALGORITHMS.get(algorithm, {}).get("checks", [])
    for plugin in plugins:
        yield from PLUGINS.get(plugin, {}).get("checks", [])
