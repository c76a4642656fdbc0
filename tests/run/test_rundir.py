"""The run folder: its state in each case, corrupt files named, whole-or-nothing writes."""

import ast
import json
import os
from pathlib import Path

import pandas as pd
import pytest

from fedrepro import identity
from fedrepro.records import CorruptFileError
from fedrepro.report import paper
from fedrepro.run import rundir

SETTING = {"algorithm": "fedavg", "dataset": "fmnist"}


def _finished(folder: Path, status: str = "finished") -> rundir.RunDir:
    run = rundir.RunDir(folder)
    folder.mkdir(parents=True)
    run.write_metrics(pd.DataFrame({"round": [1, 2], "test_acc": [0.5, 0.6]}))
    run.write_summary({"status": status, "setting": SETTING, "final_acc": 0.55})
    return run


def test_the_state_of_a_run_folder_in_each_case(tmp_path):
    assert rundir.RunDir(tmp_path / "never").state() == "missing"
    assert _finished(tmp_path / "done").state() == "done"
    assert _finished(tmp_path / "nan", status="diverged").state() == "diverged"
    stopped = rundir.RunDir(tmp_path / "stopped")
    stopped.root.mkdir()
    stopped.checkpoint.write_bytes(b"state")
    assert stopped.state() == "interrupted"
    assert [r.id for r in rundir.finished_runs(tmp_path)] == ["done", "nan"]
    assert list(rundir.finished_runs(tmp_path / "absent")) == []


def test_what_is_written_reads_back(tmp_path):
    run = _finished(tmp_path / "r")
    assert run.read_summary()["final_acc"] == 0.55
    assert run.read_metrics()["test_acc"].tolist() == [0.5, 0.6]
    assert json.loads(run.summary.read_text())["status"] == "finished"  # plain JSON for any reader


@pytest.mark.parametrize("content", ["", '{"status": "fini', "[1, 2]"])
def test_a_corrupt_summary_is_named(tmp_path, content):
    run = rundir.RunDir(tmp_path / "r")
    run.root.mkdir()
    run.summary.write_text(content)
    with pytest.raises(CorruptFileError, match=str(run.summary)):
        run.state()


@pytest.mark.parametrize("content", ["", "round,test_acc\n1,0.5\n2,0.6,7,8\n"])
def test_corrupt_metrics_are_named(tmp_path, content):
    run = _finished(tmp_path / "r")
    run.metrics.write_text(content)
    with pytest.raises(CorruptFileError, match=str(run.metrics)):
        run.read_metrics()


def test_a_write_cut_short_leaves_the_old_summary_and_no_scraps(tmp_path, monkeypatch):
    run = _finished(tmp_path / "r")

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        run.write_summary({"status": "finished", "setting": SETTING, "final_acc": 0.9})
    assert run.read_summary()["final_acc"] == 0.55
    assert sorted(p.name for p in run.root.iterdir()) == ["metrics.csv", "summary.json"]


def test_the_papers_table_skips_a_run_with_corrupt_metrics_and_keeps_the_others(tmp_path, capsys):
    _finished(tmp_path / "good")
    _finished(tmp_path / "bad").metrics.write_text("round,test_acc\n1,0.5\n2,0.6,7,8\n")
    assert [r["id"] for r in paper.load_runs(tmp_path)] == ["good"]
    assert "bad/metrics.csv" in capsys.readouterr().err


def test_the_planner_does_not_import_the_benchmark():
    source = (identity.PACKAGE / "ops" / "plan.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    imported |= {
        f"{node.module}.{a.name}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)
        for a in node.names
    }
    assert "fedrepro.ops.bench" not in imported
