"""Every method, alone and with +ima, +aware and both, runs real rounds on the MLP (issue 3);
the combinations the papers rule out are refused before any work, naming the keys."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from conftest import make_partition
from fedrepro import cli, registry
from fedrepro.ops import gpucheck
from fedrepro.spec import schema, settings

BASE = {"dataset": "fmnist", "model": "mlp", "num_clients": 4, "participation": 0.5, "rounds": 3,
        "batch_size": 100, "device": "cpu", "client": {"lr": 0.05}, "partition": {"kind": "iid", "seed": 1},
        "ima": {"start_round": 2, "window": 2}, "fedlaw": {"proxy_size": 20, "server_epochs": 2},
        **{name: {"proxy_size": 20, "server_epochs": 2} for name in ("feddf", "fedbe", "serverft")},
        "evaluation": {"proxy_holdout": 20},
        # the permutation warm-up shows every client by round 2, so FedAWARE's and +aware's momenta are ready
        # and their AWARE step runs in rounds 2 and 3 (random cohorts of 2 out of 4 may never show them all)
        "cohort": {"warmup": "permutation"}}
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


def test_every_method_is_covered():
    assert len(list(combinations())) == 4 * len(registry.ALGORITHMS) >= 4 * 14


@pytest.mark.parametrize("method", list(combinations()))
def test_runs_end_to_end(method, tmp_path, partition_dir, tiny_data_root):
    name = method.split("+")[0]
    setting = {**BASE, "algorithm": method, "model": "cnn" if name in NEEDS_FEATURE_MODEL else "mlp"}
    reason = refused_because(method)
    if reason:
        with pytest.raises(schema.ConfigError, match=reason.replace("+", r"\+")):
            settings.resolve(setting)
        return
    out = tmp_path / "run"
    cli.main(["train", "--setting", json.dumps(setting), "--partition", str(partition_dir), "--data-root",
              str(tiny_data_root), "--out", str(out), "--no-progress", "--threads", "1"])
    summary = json.loads((out / "summary.json").read_text())
    metrics = pd.read_csv(out / "metrics.csv")
    assert summary["status"] == "finished" and list(metrics["round"]) == [1, 2, 3]
    assert math.isfinite(summary["final_acc"]) and metrics["train_loss"].map(math.isfinite).all()
    if "+ima" in method:
        assert list(metrics["ima_active"].fillna(-1)) == [-1, -1, 1], "IMA starts at round index 2 and logs nothing before"
    if "+aware" in method or name == "fedaware":
        gpucheck.check_aware_steps(method, metrics.to_dict("records"), method)
