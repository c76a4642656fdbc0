"""Collapses, computed from the kept metrics (never by the trainer): a fall of more than 20 points below the
run's best so far, or to chance, on synthetic curves and on the real evidence."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from fedrepro.configure.paramsfile import ROOT
from fedrepro.report import collapses, evidence


def _detect(points, classes=10):
    return collapses.detect(range(1, len(points) + 1), [p / 100 for p in points], classes)


def test_a_fall_of_more_than_20_points_is_a_collapse_and_20_is_not():
    assert not _detect([50, 80, 60, 80])["collapsed"]  # exactly 20 below the best
    record = _detect([50, 80, 59.99, 58, 79, 81])
    assert record["collapsed"]
    (episode,) = record["episodes"]  # rounds 3 and 4 are one episode, told by its lowest round
    assert episode == {
        "first_round": 3,
        "last_round": 4,
        "low_round": 4,
        "low_acc": 58.0,
        "best_before": 80.0,
        "best_round": 2,
        "to_chance": False,
    }
    assert record["largest_fall"] == {"drop": 22.0, "round": 4, "acc": 58.0, "best": 80.0}


def test_a_fall_to_chance_counts_once_the_run_had_learned():
    # 10 classes: chance 10%, +1 point margin; the best must have reached 20% (10 above chance)
    fell = _detect([25, 10.5, 30])
    assert fell["collapsed"] and fell["episodes"][0]["to_chance"]  # only 14.5 points, but to chance
    assert not _detect([19, 10.5, 30])["collapsed"]  # it had not learned yet
    assert not _detect([25, 11.5, 30])["collapsed"]  # above chance + 1
    # 100 classes: chance 1%; a fall from 15% to 1.5% is a collapse though only 13.5 points
    assert _detect([15, 1.5], classes=100)["collapsed"] and not _detect([15, 1.5], classes=10)["collapsed"]


def test_the_first_round_and_nan_rounds_are_never_collapses():
    assert not _detect([10, 20, 30])["collapsed"]
    record = collapses.detect([1, 2, 3, 4], [0.8, float("nan"), 0.79, 0.5])
    assert record["episodes"][0]["low_round"] == 4 and record["largest_fall"]["round"] == 4
    assert collapses.detect([], [])["largest_fall"] is None


def test_describe_says_each_episode():
    record = _detect([50, 80, 40, 80, 85, 10])
    assert collapses.describe(record, limit=None) == (
        "to 40.00% at round 3 (best before 80.00%); to 10.00% at round 6 (best before 85.00%)"
    )
    assert collapses.describe(record, limit=1) == "to 10.00% at round 6 (best before 85.00%); 1 more"
    assert collapses.describe(_detect([50, 60])) == ""


# FedLAW Table 3's FMNIST MLP runs on the shared draw (partition seed 1), kept beside the paper's per-seed draws
FOLDER = ROOT / "evidence" / "fedlaw_table3_fmnist_mlp_partition_draw"


def _shared_draw_runs() -> list:
    return [
        r
        for r in (FOLDER / "runs").iterdir()
        if json.loads((r / "summary.json").read_text())["setting"]["partition"]["seed"] == 1
    ]


def _flagged(runs) -> dict:
    """The runs the rule flags, by name without the hash: each one's episodes as (low round, low accuracy)."""
    flagged = {}
    for run in runs:
        record = collapses.of_run(json.loads((run / "summary.json").read_text()), pd.read_csv(run / "metrics.csv"))
        if record and record["collapsed"]:
            flagged[run.name.rsplit("-", 1)[0]] = {(e["low_round"], e["low_acc"]) for e in record["episodes"]}
    return flagged


def _kept(run_prefix: str) -> dict:
    (run,) = [r for r in _shared_draw_runs() if r.name.startswith(run_prefix)]
    summary = json.loads((run / "summary.json").read_text())
    return collapses.of_run(summary, pd.read_csv(run / "metrics.csv"))


def test_the_known_collapses_of_fedlaw_table3_on_the_shared_draw_are_found_in_the_kept_runs():
    """FedDF α=0.1 seed 10 to 10.01% (chance) at round 23; Server-FT α=0.1 seed 10 to 16.86% at round 147 and
    seed 9 to 40.85% at round 173; FedDF α=100 seed 8 to 47.22% at round 29."""

    def lows(prefix):
        return {(e["low_round"], e["low_acc"]) for e in _kept(prefix)["episodes"]}

    assert (23, 10.01) in lows("feddf-fmnist-dir0.1-mlp-s10-")
    assert (147, 16.86) in lows("serverft-fmnist-dir0.1-mlp-s10-")
    assert (173, 40.85) in lows("serverft-fmnist-dir0.1-mlp-s9-")
    assert (29, 47.22) in lows("feddf-fmnist-dir100-mlp-s8-")
    # FedBE α=0.1 dips to about 59% near rounds 154-158, 19.66 points below its best at seed 8: short of the
    # 20-point rule, so not flagged there; its record still says how far it fell
    seed8 = _kept("fedbe-fmnist-dir0.1-mlp-s8-")
    assert not seed8["collapsed"] and seed8["largest_fall"] == {
        "drop": 19.66,
        "round": 154,
        "acc": 59.32,
        "best": 78.98,
    }


def test_every_flagged_run_of_fedlaw_table3_mlp_on_the_shared_draw():
    """The whole list the rule finds in the folder: the known collapses above, FedDyn's falls to chance before it
    diverges, Server-FT's seed 8 (to 29.42% at round 66), FedBE α=100 seed 10 (55.68%) and FedBE α=0.1 seed 9
    (54.07% at round 10)."""
    assert set(_flagged(_shared_draw_runs())) == {
        "feddf-fmnist-dir0.1-mlp-s10",
        "feddf-fmnist-dir100-mlp-s8",
        "fedbe-fmnist-dir100-mlp-s10",
        "fedbe-fmnist-dir0.1-mlp-s9",
        "serverft-fmnist-dir0.1-mlp-s8",
        "serverft-fmnist-dir0.1-mlp-s9",
        "serverft-fmnist-dir0.1-mlp-s10",
        "feddyn-fmnist-dir0.1-mlp-s8",
        "feddyn-fmnist-dir0.1-mlp-s9",
        "feddyn-fmnist-dir0.1-mlp-s10",
    }


def test_every_kept_summary_holds_the_record_the_rule_computes_today():
    """`fedrepro evidence collapses --write` (and every keep) writes the record; a changed rule or a stale
    folder fails here."""
    checked = 0
    for summary_path in sorted((ROOT / "evidence").glob("*/runs/*/summary.json")):
        metrics = summary_path.with_name("metrics.csv")
        summary = json.loads(summary_path.read_text())
        expected = collapses.of_run(summary, pd.read_csv(metrics) if metrics.is_file() else None)
        assert summary.get("collapse") == expected, f"{summary_path}: run fedrepro evidence collapses --write"
        checked += 1
    assert checked > 100


def test_keep_writes_the_record_into_the_kept_summary(tmp_path):
    run = tmp_path / "evidence" / "x" / "runs" / "r1"
    run.mkdir(parents=True)
    (tmp_path / "evidence" / "x" / "manifest.json").write_text("{}")
    pd.DataFrame({"round": [1, 2, 3], "test_acc": [0.5, 0.8, 0.1]}).to_csv(run / "metrics.csv", index=False)
    (run / "summary.json").write_text(json.dumps({"run": "r1", "status": "finished", "setting": {"dataset": "fmnist"}}))
    (row,) = evidence.record_collapses(tmp_path / "evidence" / "x")
    kept = json.loads((run / "summary.json").read_text())
    assert kept["collapse"] == row["record"] and kept["collapse"]["episodes"][0]["low_acc"] == 10.0
    assert kept["run"] == "r1"  # the trainer's keys stay as they were
    with pytest.raises(evidence.EvidenceError, match="not an evidence folder"):
        evidence.record_collapses(tmp_path)
    assert math.isclose(kept["collapse"]["largest_fall"]["drop"], 70.0)


def test_every_flagged_run_of_fedlaw_table3_mlp_on_the_paper_draws():
    """The paper-protocol evidence (a partition per seed): Server-FT at both alphas on every seed, FedDF Dir(100)
    seed 8 (to 65.45% at round 66) and Dir(0.1) seed 10 (51.42% at round 117), FedProx Dir(0.1) seed 9 (51.52% at
    round 8) and FedDyn Dir(0.1) before each NaN; no other run."""
    flagged = _flagged((ROOT / "evidence" / "fedlaw_table3_fmnist_mlp" / "runs").iterdir())
    assert set(flagged) == {f"serverft-fmnist-dir{a}-mlp-s{s}" for a in ("100", "0.1") for s in (8, 9, 10)} | {
        "feddf-fmnist-dir100-mlp-s8",
        "feddf-fmnist-dir0.1-mlp-s10",
        "fedprox-fmnist-dir0.1-mlp-s9",
        "feddyn-fmnist-dir0.1-mlp-s8",
        "feddyn-fmnist-dir0.1-mlp-s9",
        "feddyn-fmnist-dir0.1-mlp-s10",
    }
    assert (66, 65.45) in flagged["feddf-fmnist-dir100-mlp-s8"]
    assert (117, 51.42) in flagged["feddf-fmnist-dir0.1-mlp-s10"]
    assert (8, 51.52) in flagged["fedprox-fmnist-dir0.1-mlp-s9"]
