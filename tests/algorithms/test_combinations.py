"""Every method, alone and with +ima, +aware and both, runs real rounds on the MLP (issue 3), and each
case is held to one thing it computes: a plain method's server steps written out here from the kept
snapshots (every round's global model and both clients' models), or its reduction to FedAvg where its own
step is server-side training; a plug-in leaves its host's rounds unchanged until it acts and changes them
from then on. The combinations the papers rule out are refused before any work, naming the keys."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import make_partition
from fedrepro import cli
from fedrepro.configure import registry, schema, settings
from fedrepro.ops import gpucheck

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

BASE = {
    "dataset": "fmnist",
    "model": "mlp",
    "num_clients": 4,
    "participation": 0.5,
    "rounds": 3,
    "batch_size": 100,
    "device": "cpu",
    "client": {"lr": 0.05},
    "partition": {"kind": "iid", "seed": 1},
    "ima": {"start_round": 2, "window": 2},
    "fedlaw": {"proxy_size": 20, "server_epochs": 2},
    **{name: {"proxy_size": 20, "server_epochs": 2} for name in ("feddf", "fedbe", "serverft")},
    "evaluation": {"proxy_holdout": 20},
    # the permutation warm-up shows every client by round 2, so FedAWARE's and +aware's momenta are ready
    # and their AWARE step runs in rounds 2 and 3 (random cohorts of 2 out of 4 may never show them all)
    "cohort": {"warmup": "permutation"},
    # every round's model before and after the server step, and both clients of its cohort of 2
    "snapshots": {"rounds": [1, 2, 3], "clients": 2},
    # the code's 1e-4 makes FedGMA's masked correction ~1e-5 of the step, under float32's blur of it
    "fedgma": {"lr": 0.5},
    # v0 = tau^2 (Reddi et al.'s v0 >= tau^2): from 0, sign(v - d^2) would hang on the float32 blur of
    # every coordinate that did not move
    "fedyogi": {"v0": 1.0e-8},
}
PLUGIN_SETS = ["", "+ima", "+aware", "+ima+aware"]
NEEDS_FEATURE_MODEL = {"fedfa"}  # FedFA's anchors live on the penultimate layer of IMA's CNNs


def combinations():
    for name in sorted(registry.ALGORITHMS):
        for plugins in PLUGIN_SETS:
            yield name + plugins


def refused_because(method: str) -> str | None:
    name, *plugins = method.split("+")
    for plugin in plugins:
        if name in registry.PLUGINS[plugin].get("refuses", {}):
            return f"'+{plugin}' cannot be combined with algorithm '{name}'"
    return None


@pytest.fixture(scope="module")
def partition_dir(tiny_data_root, tmp_path_factory):
    return make_partition(tiny_data_root, tmp_path_factory.mktemp("part"), num_clients=4)


@pytest.fixture(scope="module")
def train(partition_dir, tiny_data_root, tmp_path_factory):
    """train(method, **sections) -> the run's folder; each setting is trained once per module."""
    folders = {}

    def run(method: str, **sections) -> Path:
        name = method.split("+")[0]
        setting = {**BASE, "algorithm": method, "model": "cnn" if name in NEEDS_FEATURE_MODEL else "mlp"}
        for key, values in sections.items():
            setting[key] = {**setting.get(key, {}), **values}
        key = json.dumps(setting, sort_keys=True)
        if key not in folders:
            out = tmp_path_factory.mktemp("run") / "run"
            cli.main(
                [
                    "train",
                    "--setting",
                    key,
                    "--partition",
                    str(partition_dir),
                    "--data-root",
                    str(tiny_data_root),
                    "--out",
                    str(out),
                    "--no-progress",
                    "--threads",
                    "1",
                ]
            )
            folders[key] = out
        return folders[key]

    return run


def test_every_method_is_covered():
    assert len(list(combinations())) == 4 * len(registry.ALGORITHMS) >= 4 * 14
    assert set(registry.ALGORITHMS) == set(SERVER_STEP) | set(REDUCES_TO_FEDAVG) | {"fedaware"}, (
        "every method is held to what it computes"
    )


@pytest.mark.parametrize("method", list(combinations()))
def test_runs_end_to_end(method, train):
    name = method.split("+")[0]
    reason = refused_because(method)
    if reason:
        with pytest.raises(schema.ConfigError, match=reason.replace("+", r"\+")):
            settings.resolve({**BASE, "algorithm": method})
        return
    out = train(method)
    summary = json.loads((out / "summary.json").read_text())
    metrics = pd.read_csv(out / "metrics.csv")
    assert summary["status"] == "finished" and list(metrics["round"]) == [1, 2, 3]
    assert math.isfinite(summary["final_acc"]) and metrics["train_loss"].map(math.isfinite).all()
    if "+ima" in method:
        assert list(metrics["ima_active"].fillna(-1)) == [-1, -1, 1], (
            "IMA starts at round index 2 and logs nothing before"
        )
    if "+aware" in method or name == "fedaware":
        gpucheck.check_aware_steps(method, metrics.to_dict("records"), method)
    if "+" in method:
        check_plugin(method, train)
    else:
        check_method(method, train)


# --------------------------------------------------------------------------- what each case computes

EPS32 = float(np.finfo(np.float32).eps)


def snapshots(out: Path) -> dict[str, np.ndarray]:
    with np.load(out / "snapshots.npz") as kept:
        return {key: kept[key].astype(np.float64) for key in kept.files}


def rounds(out: Path):
    """(x, client deltas, their data shares, the model after the server step) of rounds 1-3, in float64."""
    kept = snapshots(out)
    for t in (1, 2, 3):
        x, sizes = kept[f"round_{t}_global"], kept[f"round_{t}_sizes"]
        deltas = np.stack([x - kept[f"round_{t}_client_{j}"] for j in range(len(sizes))])
        yield x, deltas, sizes / sizes.sum(), kept[f"round_{t}_next"]


def rounding(x: np.ndarray) -> float:
    """What float32 can blur in a model like x: the snapshots keep x - Delta_i rounded to float32, so a
    recovered Delta_i is off by up to an ulp of the model's largest entry, and the engine's own sums round
    as much again; 8 ulps leave room for both (a dropped client, a weight that is not n_i/n_S, or a
    missing server-state term moves the model by a part of Delta, orders of magnitude more)."""
    return 8 * EPS32 * float(np.abs(x).max())


def plain_sgd(c, setting):
    """FedAvg's server: x <- x - eta_g v, v <- beta v + d (beta = 0 but for FedAvgM), d = sum p_i Delta_i."""
    beta = setting["fedavgm"]["momentum"] if setting["algorithm"] == "fedavgm" else 0.0
    v = 0.0

    def step(x, deltas, p):
        nonlocal v
        v = beta * v + p @ deltas
        return x - setting["server"]["lr"] * v, 0.0

    return step


def plain_gma(c, setting):
    """FedGMA: the weighted mean, less eta_gma times the mean of the Delta_i on the coordinates where
    more than threshold * m clients' signs agree (fedgma.py's docstring)."""

    def step(x, deltas, p):
        m = len(deltas)
        signs = np.sign(deltas)
        total = signs.sum(0)
        agree = (signs != 0) & (signs == np.sign(total))
        keep = np.abs(total) > c["threshold"] * m
        correction = (deltas * (agree & keep)).sum(0) / m
        return x - setting["server"]["lr"] * (p @ deltas - c["lr"] * correction), 0.0

    return step


def plain_adaptive(c, setting):
    """Reddi et al.'s FedAdam, FedYogi, FedAdagrad and FedAMS (no bias correction, m_0 = 0, v_0 = v0),
    written out. The second value is, per coordinate, how much the step moves per unit of error in d
    (the float32 blur of the recovered Delta_i): through m, (1 - beta1) / D; through v, at most
    |m| sqrt(1 - beta2) / D^2 for Adam's and AMS's v (>= (1 - beta2) d^2; Adagrad's and Yogi's: |m| / D^2),
    D the denominator. Yogi's sign(v - d^2) is not determined where the blur could flip it: from then on
    that coordinate is not checked (there are few: the test asserts it)."""
    name, lr = setting["algorithm"], setting["server"]["lr"]
    beta1, beta2 = c["beta1"], c.get("beta2", 1.0)
    state = {"m": 0.0, "v": c.get("v0", 0.0), "v_hat": 0.0, "open": False}

    def step(x, deltas, p):
        d = p @ deltas
        blur = rounding(x)
        state["m"] = beta1 * state["m"] + (1 - beta1) * d
        d2 = d * d
        if name in ("fedadam", "fedams"):
            state["v"] = beta2 * state["v"] + (1 - beta2) * d2
        elif name == "fedyogi":
            state["open"] = state["open"] | (np.abs(state["v"] - d2) <= 2 * np.abs(d) * blur + blur**2)
            state["v"] = state["v"] - (1 - beta2) * d2 * np.sign(state["v"] - d2)
        else:
            state["v"] = state["v"] + d2
        if name == "fedams":
            state["v_hat"] = np.maximum(state["v_hat"], np.maximum(state["v"], c["eps"]))
            denominator = np.sqrt(state["v_hat"])
        else:
            denominator = np.sqrt(state["v"]) + c["tau"]
        through_v = np.sqrt(1 - beta2) if name in ("fedadam", "fedams") else 1.0
        sensitivity = lr * ((1 - beta1) / denominator + np.abs(state["m"]) * through_v / denominator**2)
        assert np.mean(state["open"]) < 1e-2, "Yogi's sign is blurred on many coordinates"
        return x - lr * state["m"] / denominator, np.where(state["open"], np.inf, sensitivity)

    return step


def plain_feddyn(c, setting):
    """FedDyn (paper form): h <- h + alpha/N sum_{i in S} Delta_i, d = mean Delta_i + h / alpha."""
    h = 0.0

    def step(x, deltas, p):
        nonlocal h
        h = h + c["alpha"] / setting["num_clients"] * deltas.sum(0)
        return x - setting["server"]["lr"] * (deltas.mean(0) + h / c["alpha"]), 0.0

    return step


# The server step of each method whose server is not trained, written out. FedProx, FedNova (equal local
# steps here: equal sizes, one epoch), SCAFFOLD (eta_g = 1), FedASAM, FedFA and FedCM differ from FedAvg on
# the clients (their local rounds: tests/run/test_local_objectives_sgd.py, test_baselines.py, test_ima_baselines.py)
# and aggregate as it does.
SERVER_STEP = {
    **{
        name: plain_sgd for name in ("fedavg", "fedavgm", "fedprox", "fednova", "scaffold", "fedasam", "fedfa", "fedcm")
    },
    "fedgma": plain_gma,
    "feddyn": plain_feddyn,
    **{name: plain_adaptive for name in ("fedadam", "fedyogi", "fedams", "fedadagrad")},
}

# Methods whose server trains on a proxy set: with no server epochs they are FedAvg (their weights, the
# proxy's and the ensemble's, enter only through that training), and with BASE's two they are not.
REDUCES_TO_FEDAVG = {"fedlaw", "feddf", "fedbe", "serverft"}


def check_method(name: str, train) -> None:
    out = train(name)
    if name in SERVER_STEP:
        setting = json.loads((out / "summary.json").read_text())["setting"]
        step = SERVER_STEP[name](setting.get(name, {}), setting)
        for t, (x, deltas, p, after) in enumerate(rounds(out), start=1):
            expected, sensitivity = step(x, deltas, p)
            # the blur of d, carried by m and v through three rounds at most, and the step's own rounding
            assert (np.abs(after - expected) <= rounding(x) * (1 + 3 * sensitivity)).all(), (name, t)
    elif name in REDUCES_TO_FEDAVG:
        fedavg = snapshots(train("fedavg"))["round_3_next"]
        untrained = snapshots(train(name, **{name: {"server_epochs": 0}}))["round_3_next"]
        trained = snapshots(out)["round_3_next"]
        # FedLAW's softmax(log p) is p up to rounding, once a round: three roundings at most
        assert np.abs(untrained - fedavg).max() <= 3 * rounding(fedavg) < np.abs(trained - fedavg).max(), name
    else:  # FedAWARE: the warm-up round (momenta not ready) is FedAvg's step; then the min-norm step is another
        steps = [(after, x - p @ deltas) for x, deltas, p, after in rounds(out)]
        assert [bool(np.abs(a - b).max() <= rounding(b)) for a, b in steps] == [True, False, False], name


def check_plugin(method: str, train) -> None:
    """A plug-in is its host's run, bit for bit, until it acts (IMA at round index 2, so in round 3 on top of
    everything else; AWARE's projection once the momenta are ready, round 2), and changes the model then."""
    if "+ima" in method:
        host, acts_in = method.replace("+ima", ""), 3
    else:
        host, acts_in = method.split("+")[0], 2
    ours, theirs = snapshots(train(method)), snapshots(train(host))
    same = [np.array_equal(ours[f"round_{t}_next"], theirs[f"round_{t}_next"]) for t in (1, 2, 3)]
    assert same == [t < acts_in for t in (1, 2, 3)], (method, host, same)
