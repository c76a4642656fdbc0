"""compute: the device-hours a table's runs took, from their own records, and the plan's estimate beside it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from fedrepro.ops import pricing
from fedrepro.report import compute

SETTING = {
    "dataset": "fmnist",
    "model": "mlp",
    "num_clients": 20,
    "participation": 0.5,
    "rounds": 4,
    "local_epochs": 1,
    "batch_size": 50,
    "plugins": [],
}


def kept_run(folder, name, seconds, device="cpu", forked_from=None):
    out = folder / name
    out.mkdir(parents=True)
    pd.DataFrame({"round": range(1, len(seconds) + 1), "seconds": seconds}).to_csv(out / "metrics.csv", index=False)
    (out / "summary.json").write_text(
        json.dumps({"setting": SETTING, "runtime_s": float(sum(seconds)), "device": device, "forked_from": forked_from})
    )
    return out


def test_device_hours_per_device_without_a_forked_runs_parent_rounds(tmp_path):
    parent = kept_run(tmp_path, "parent", [900.0] * 4)
    # a child that started from its parent's round-3 state: its first 3 rows are the parent's (2700 s)
    child = kept_run(tmp_path, "child", [900.0, 900.0, 900.0, 1800.0], forked_from={"run": "parent", "round": 3})
    gpu = kept_run(tmp_path, "gpu", [360.0] * 4, device="cuda:0 (NVIDIA H200)")
    cost = compute.of_runs([parent, child, gpu, tmp_path / "not-finished"])
    assert cost["runs"] == 3
    assert cost["hours"] == pytest.approx({"CPU": 1.0 + 0.5, "NVIDIA H200": 0.4})
    assert cost["total_hours"] == pytest.approx(1.9)
    seconds, _ = pricing.step_costs(pricing.run_device(SETTING)).price(SETTING)
    per_round = pricing.local_steps(SETTING, 0, 1) * seconds / 3600
    assert cost["estimate_hours"] == pytest.approx(per_round * (4 + 1 + 4))  # the child: its own round only
    assert compute.text(cost).startswith(
        "1.9 device-hours over 3 runs (CPU 1.5 h, NVIDIA H200 0.4 h); the plan's estimate: "
    )


def test_a_run_the_plan_cannot_price_is_said(tmp_path):
    run = kept_run(tmp_path, "odd", [3600.0])
    summary = json.loads((run / "summary.json").read_text())
    summary["setting"] = {**SETTING, "model": "no_such_model"}
    (run / "summary.json").write_text(json.dumps(summary))
    cost = compute.of_runs([run, kept_run(tmp_path, "ok", [3600.0])])
    assert cost["unpriced"] == 1
    assert compute.text(cost).endswith("for the 1 runs it can price")
