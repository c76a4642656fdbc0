"""Grids as trees: a run that forks from another run's state at the round its setting first acts
differently (an +ima run from its host's run at t_s) ends with the metrics and the model it has trained
from round 0, byte for byte on CPU; the pairs are derived from the plug-ins' declarations."""

from __future__ import annotations

import copy
import inspect
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import make_partition, subprocess_env, train_args
from fedrepro import cli
from fedrepro.configure import expansion, forks, schema, settings
from fedrepro.run import checkpoint
from fedrepro.run.fork_states import ForkError
from fedrepro.run.jobs import fork_state
from fedrepro.run.trainer import Trainer

START, WINDOW, ROUNDS = 3, 3, 6
BASE = {
    "dataset": "fmnist",
    "model": "mlp",
    "num_clients": 4,
    "participation": 0.5,
    "rounds": ROUNDS,
    "batch_size": 50,
    "device": "cpu",
    "eval_every": 2,
    # a decaying lr: the child's schedule before t_s must be its host's
    "client": {"lr": 0.05, "lr_decay": 0.9, "momentum": 0.5},
    "partition": {"kind": "iid", "seed": 1},
}
IMA = {"ima": {"start_round": START, "window": WINDOW, "lr_decay": 0.8}}
# hosts with server state (FedAdam's moments, SCAFFOLD's control variates) and client terms (FedProx)
HOSTS = ["fedavg", "fedprox", "scaffold", "fedadam"]
TIMINGS = ["seconds", "wall_time"]  # when a round ran, not what it computed


@pytest.fixture(scope="module")
def partition_dir(tiny_data_root, tmp_path_factory):
    return make_partition(tiny_data_root, tmp_path_factory.mktemp("part"), num_clients=4)


def _settings(host: str) -> tuple[dict, dict]:
    parent = settings.resolve({**copy.deepcopy(BASE), "algorithm": host})
    child = settings.resolve({**copy.deepcopy(BASE), **IMA, "algorithm": f"{host}+ima"})
    return parent, child


def _train(setting, out, partition_dir, data_root, *extra) -> dict:
    # --debug: a refusal raises its exception (ForkError) instead of ending in one line and status 2
    cli.main(["--debug", *train_args(setting, out, partition_dir, data_root, "--checkpoint-every", "2", *extra)])
    return json.loads((out / "summary.json").read_text())


def _csv_without_timings(run: Path) -> str:
    """metrics.csv as written, less the columns that say when a round ran: compared as text."""
    frame = pd.read_csv(run / "metrics.csv")
    assert list(frame.columns[-2:]) == TIMINGS or set(TIMINGS) <= set(frame.columns)
    return frame.drop(columns=TIMINGS).to_csv(index=False)


def assert_same_run(a: Path, b: Path) -> None:
    assert _csv_without_timings(a) == _csv_without_timings(b), "the metrics differ"
    ma, mb = checkpoint.load(a / "model.pt"), checkpoint.load(b / "model.pt")
    assert torch.equal(ma["x"], mb["x"]) and torch.equal(ma["buffers"], mb["buffers"]), "the final models differ"
    for name in ("cosines.npz",):
        assert (a / name).exists() == (b / name).exists()
        if (a / name).exists():
            import numpy as np

            za, zb = np.load(a / name), np.load(b / name)
            assert sorted(za) == sorted(zb) and all(np.array_equal(za[k], zb[k]) for k in za)


@pytest.mark.parametrize("host", HOSTS)
def test_forked_ima_run_equals_the_run_trained_from_round_0(host, tmp_path, partition_dir, tiny_data_root):
    parent, child = _settings(host)
    alone = tmp_path / "alone"
    assert _train(child, alone, partition_dir, tiny_data_root)["forked_from"] is None
    # the parent keeps its state at t_s (inside the checkpoint interval 2..4) with the window's P-1 models
    host_run = tmp_path / "host"
    summary = _train(
        parent, host_run, partition_dir, tiny_data_root, "--keep-forks", str(START), "--fork-history", str(WINDOW - 1)
    )
    assert summary["rounds_done"] == ROUNDS and summary["kept_forks"] == {"rounds": [START], "history": WINDOW - 1}
    kept = host_run / "fork" / f"kept-{START}.pt"
    state = checkpoint.load(kept)
    assert state["next_round"] == START and len(state["rows"]) == START and len(state["history"]) == WINDOW - 1
    forked = tmp_path / "forked"
    summary = _train(child, forked, partition_dir, tiny_data_root, "--fork-from", str(kept))
    assert summary["forked_from"] == {"run": "host", "round": START} and summary["rounds_done"] == ROUNDS
    assert_same_run(alone, forked)
    assert pd.read_csv(forked / "metrics.csv")["ima_active"].notna().sum() == ROUNDS - START


def test_keeping_fork_states_changes_nothing_of_the_parent(tmp_path, partition_dir, tiny_data_root):
    parent, _ = _settings("fedavg")
    _train(parent, tmp_path / "plain", partition_dir, tiny_data_root)
    _train(parent, tmp_path / "keeps", partition_dir, tiny_data_root, "--keep-forks", "2,4", "--fork-history", "2")
    assert_same_run(tmp_path / "plain", tmp_path / "keeps")
    assert sorted(p.name for p in (tmp_path / "keeps" / "fork").iterdir()) == ["kept-2.pt", "kept-4.pt"]


def test_fork_from_a_parent_resumed_after_a_stop_and_a_child_stopped_after_its_fork(
    tmp_path, partition_dir, tiny_data_root
):
    """The parent is stopped after round 2 (its checkpoint must carry the window's last models), resumed;
    the child is stopped after round 4, one round past its fork, and resumed from its own checkpoint."""
    parent, child = _settings("scaffold")
    alone = tmp_path / "alone"
    _train(child, alone, partition_dir, tiny_data_root)
    host_run = tmp_path / "host"
    keep = ["--keep-forks", str(START), "--fork-history", str(WINDOW - 1)]
    cli.main(
        [
            "train",
            "--setting",
            json.dumps(parent),
            "--partition",
            str(partition_dir),
            "--data-root",
            str(tiny_data_root),
            "--out",
            str(host_run),
            "--no-progress",
            "--checkpoint-every",
            "2",
            "--stop-after",
            "2",
            *keep,
        ]
    )
    assert not (host_run / "fork").exists() and len(checkpoint.load(host_run / "checkpoint.pt")["history"]) == 2
    assert _train(parent, host_run, partition_dir, tiny_data_root, *keep)["resumed"] is True
    kept = host_run / "fork" / f"kept-{START}.pt"
    forked = tmp_path / "forked"
    fork = ["--fork-from", str(kept)]
    cli.main(
        [
            "train",
            "--setting",
            json.dumps(child),
            "--partition",
            str(partition_dir),
            "--data-root",
            str(tiny_data_root),
            "--out",
            str(forked),
            "--no-progress",
            "--checkpoint-every",
            "2",
            "--stop-after",
            "4",
            *fork,
        ]
    )
    summary = _train(child, forked, partition_dir, tiny_data_root, *fork)
    assert summary["resumed"] is True and summary["forked_from"] == {"run": "host", "round": START}
    assert_same_run(alone, forked)


def _with_input_dropout(build):
    """models.build with a Dropout on the input in front: dropout draws from the global torch stream, whose
    position a killed process loses and its resume must take from the checkpoint (no fmnist model of the
    registry draws from it: every other stream is drawn from (seed, round, client))."""
    import torch

    def built(*args, **kwargs):
        return torch.nn.Sequential(torch.nn.Dropout(0.2), build(*args, **kwargs))

    return built


# The train entry point (cli.main, what the `fedrepro` script calls) on that model, with one change: in the
# round its first argument names (-1: none), once the cohort's first client has trained (model, momentum buffer
# and torch stream half moved in memory), the process says so in a file and waits to be killed. Without it the
# test could not choose when the kill lands: on a loaded machine the run may pass its fork round between a poll
# and the kill. If nothing kills it, it ends itself rather than wait forever.
TRAIN = (
    inspect.getsource(_with_input_dropout)
    + """
import os, sys, time
from pathlib import Path
from fedrepro import cli, models
from fedrepro.run import client

pause, ready, argv = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
models.build = _with_input_dropout(models.build)
train = client.LocalSGD.train

def train_then_wait(self, run, *args, **kwargs):
    result = train(self, run, *args, **kwargs)
    if run.round == pause:
        ready.write_text(str(os.getpid()))
        time.sleep(900)
        os._exit(3)
    return result

client.LocalSGD.train = train_then_wait
cli.main(argv)
"""
)


@pytest.mark.slow
def test_fork_from_a_parent_resumed_after_a_sigkill(tmp_path, partition_dir, tiny_data_root, monkeypatch):
    """A real parent process is killed (SIGKILL: no handler, no last checkpoint) in the middle of the round
    before its fork round, after its periodic checkpoint of round 2; run again, it resumes from that
    checkpoint and writes its fork state at t_s; the child started from it equals the child trained from
    round 0, and the parent the parent never killed."""
    from fedrepro import models

    # SCAFFOLD: server and client control variates; kept client momentum; dropout: the global torch stream
    parent, child = ({**s, "client": {**s["client"], "keep_momentum": True}} for s in _settings("scaffold"))
    every, paused = 2, START - 1  # a checkpoint after 2 rounds, killed inside round index 2 (t_s = 3)
    args = [
        "train",
        "--setting",
        json.dumps(parent),
        "--partition",
        str(partition_dir),
        "--data-root",
        str(tiny_data_root),
        "--out",
        str(tmp_path / "host"),
        "--no-progress",
        "--threads",
        "1",
        "--checkpoint-every",
        str(every),
        "--keep-forks",
        str(START),
        "--fork-history",
        str(WINDOW - 1),
    ]
    ready, log = tmp_path / "paused", tmp_path / "killed.log"
    with open(log, "w") as out:  # a file, not a pipe nobody reads while the run goes on
        proc = subprocess.Popen(
            [sys.executable, "-c", TRAIN, str(paused), str(ready), *args],
            env=subprocess_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 600  # generous: a loaded machine starts torch slowly
        while not ready.exists():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the parent never reached the round it is killed in"
            time.sleep(0.05)
        state = checkpoint.load(tmp_path / "host" / "checkpoint.pt")
        assert state["next_round"] == every and len(state["history"]) == WINDOW - 1
        assert not (tmp_path / "host" / "fork").exists(), "killed before its fork round"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL and not (tmp_path / "host" / "summary.json").exists()
    resumed = subprocess.run(
        [sys.executable, "-c", TRAIN, "-1", str(ready), *args],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((tmp_path / "host" / "summary.json").read_text())
    assert summary["resumed"] is True and summary["rounds_done"] == ROUNDS
    monkeypatch.setattr(models, "build", _with_input_dropout(models.build))
    _train(parent, tmp_path / "host_alone", partition_dir, tiny_data_root)
    assert_same_run(tmp_path / "host_alone", tmp_path / "host")
    _train(child, tmp_path / "alone", partition_dir, tiny_data_root)
    kept = tmp_path / "host" / "fork" / f"kept-{START}.pt"
    assert kept.exists(), "the resumed parent kept no fork state (its checkpoint lacked the window's models?)"
    summary = _train(child, tmp_path / "forked", partition_dir, tiny_data_root, "--fork-from", str(kept))
    assert summary["forked_from"] == {"run": "host", "round": START} and summary["resumed"] is False
    assert_same_run(tmp_path / "alone", tmp_path / "forked")


def test_the_fork_step_trains_the_prefix_again_when_nothing_was_kept(tmp_path, partition_dir, tiny_data_root):
    """A parent that finished before a child asked for its round: the fork step trains its first rounds
    again, into the same state; a kept state is moved, not copied."""
    parent, child = _settings("fedadam")
    host_run = tmp_path / "host"
    _train(parent, host_run, partition_dir, tiny_data_root, "--keep-forks", str(START), "--fork-history", "2")
    trained = tmp_path / "trained.pt"
    fork_state(parent, tmp_path / "other" / "host", START, 2, trained, partition_dir, tiny_data_root)
    moved = tmp_path / "moved.pt"
    assert fork_state(parent, host_run, START, 2, moved, partition_dir, tiny_data_root) == "kept"
    assert not (host_run / "fork" / f"kept-{START}.pt").exists()
    a, b = checkpoint.load(trained), checkpoint.load(moved)
    for key in ("x", "torch_rng"):
        assert torch.equal(a[key], b[key])
    assert all(torch.equal(p, q) for p, q in zip(a["history"], b["history"])) and len(a["history"]) == 2
    # as JSON text: rows hold NaN (global_train_loss between its rounds), which never equals itself
    assert [json.dumps({k: v for k, v in r.items() if k not in TIMINGS}, sort_keys=True) for r in a["rows"]] == [
        json.dumps({k: v for k, v in r.items() if k not in TIMINGS}, sort_keys=True) for r in b["rows"]
    ]
    assert not any(p.name.startswith(".prefix") for p in trained.parent.iterdir())


def test_a_fork_state_of_another_run_is_refused(tmp_path, partition_dir, tiny_data_root):
    parent, child = _settings("fedavg")
    other = settings.resolve({**copy.deepcopy(BASE), "algorithm": "fedavg", "client": {"lr": 0.01}})
    _train(other, tmp_path / "other", partition_dir, tiny_data_root, "--keep-forks", str(START), "--fork-history", "2")
    with pytest.raises(ForkError, match="does not share its first 3 rounds"):
        _train(
            child,
            tmp_path / "child",
            partition_dir,
            tiny_data_root,
            "--fork-from",
            str(tmp_path / "other" / "fork" / f"kept-{START}.pt"),
        )
    # a fork state from a later round than the child's t_s is refused too
    _train(parent, tmp_path / "late", partition_dir, tiny_data_root, "--keep-forks", "4", "--fork-history", "2")
    with pytest.raises(ForkError, match="does not share its first 4 rounds"):
        _train(
            child,
            tmp_path / "child2",
            partition_dir,
            tiny_data_root,
            "--fork-from",
            str(tmp_path / "late" / "fork" / "kept-4.pt"),
        )


# ----------------------------------------------------------------------------- the pairs, from the declarations


def _runs(points: list[dict]) -> list[settings.Run]:
    params = {"experiments": {"e": {"base": {**BASE, "rounds": 20}, "grid": {"setting": points}}}}
    return expansion.expand(schema.validate(params, "params.schema.yaml", "test"))


def test_ima_runs_fork_from_their_host_at_t_s_and_others_do_not():
    runs = _runs(
        [
            {"algorithm": "fedavg"},
            {"algorithm": "fedavg+ima"},
            {"algorithm": "fedavg+ima", "ima": {"start_round": 8, "window": 4}},
            {"algorithm": "fedadam+ima"},  # no fedadam run in the grid: trained from round 0
            {"algorithm": "fedprox"},
        ]
    )
    by = {
        ("+".join([r.setting["algorithm"], *r.setting["plugins"]]), r.setting.get("ima", {}).get("start_round")): r
        for r in runs
    }
    shared = forks.assign(runs)
    host = by[("fedavg", None)].id
    # an unset start_round resolves to the paper's int(0.75 * 20) before the run is named; window 5
    assert shared == {
        by[("fedavg+ima", 15)].id: forks.Fork(host, 15, 4),
        by[("fedavg+ima", 8)].id: forks.Fork(host, 8, 3),
    }
    assert forks.kept(shared) == {host: ([8, 15], 4)}


def test_acts_from_is_the_round_the_plug_in_resolves():
    for start, rounds in [(None, 20), (None, 7), (3, 20), (1, 5)]:
        setting = settings.resolve(
            {**BASE, "algorithm": "fedavg+ima", "rounds": rounds, "ima": {"start_round": start, "window": 1}}
        )
        assert forks.late_plugins(setting)["ima"] == (int(0.75 * rounds) if start is None else start, 0)


def test_sharing_can_be_turned_off_and_the_manifest_names_each_fork():
    params = {"experiments": {"e": {"base": {**BASE, "rounds": 20}, "grid": {"algorithm": ["fedavg", "fedavg+ima"]}}}}
    params = schema.validate(params, "params.schema.yaml", "test")
    runs = expansion.expand(params)
    entries = expansion.manifest(params, runs, "t")["experiments"]["e"]["runs"]
    assert [e.get("fork", {}).get("round") for e in entries] == [None, 15]
    assert entries[1]["fork"]["parent"] == entries[0]["id"]
    off = expansion.manifest({**params, "share_prefixes": False}, runs, "t")["experiments"]["e"]["runs"]
    assert not any("fork" in e for e in off)


def test_the_workflow_asks_the_invocations_forks_and_a_finished_run_answers_from_its_summary(tmp_path):
    """What workflow/rules/train.smk passes to the train and fork jobs (WorkflowForks): a parent keeps its state
    at t_s with the window's history, the child starts there; once a run finished, its summary answers."""
    params = schema.validate(
        {"experiments": {"e": {"base": {**BASE, "rounds": 20}, "grid": {"algorithm": ["fedavg", "fedavg+ima"]}}}},
        "params.schema.yaml",
        "test",
    )
    host, child = expansion.expand(params)
    runs = {host.id: host, child.id: child}
    plan = forks.WorkflowForks(params, runs, str(tmp_path))
    assert plan.of_run(child.id) == (host.id, 15) and plan.of_run(host.id) is None
    assert plan.train_args(host.id, None) == ["--keep-forks", "15", "--fork-history", "4"]
    assert plan.train_args(child.id, "f.pt") == ["--fork-from", "f.pt"]
    assert plan.history(host.id, 15) == 4 and plan.history(host.id, 3) == 0
    assert forks.WorkflowForks({**params, "share_prefixes": False}, runs, str(tmp_path)).of_run(child.id) is None
    # the child finished in an invocation whose params file named its host; this one (a subset) names only it
    (tmp_path / child.id).mkdir()
    (tmp_path / child.id / "summary.json").write_text(json.dumps({"forked_from": {"run": host.id, "round": 15}}))
    alone = forks.WorkflowForks(params, {child.id: child}, str(tmp_path))
    assert alone.of_run(child.id) == (host.id, 15)
    assert alone.recorded_parents() == {host.id: host.setting}


def test_a_model_with_dropout_forks_exactly(tmp_path, partition_dir, tiny_data_root):
    """Dropout draws from the global torch stream: the fork state carries its position."""
    from fedrepro import data
    from fedrepro.identity import partition_setting
    from fedrepro.partitions import records as partition_records

    parent, child = _settings("fedavg")
    datasets = tuple(data.load("fmnist", tiny_data_root, train=split) for split in (True, False))
    parts = partition_records.load(partition_dir, partition_setting(parent))

    def trainer(setting, out):
        torch.manual_seed(0)
        module = torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(784, 32),
            torch.nn.ReLU(),
            torch.nn.Dropout(0.5),
            torch.nn.Linear(32, 10),
        )
        return Trainer(setting, tmp_path / out, None, None, datasets=datasets, parts=parts, module=module)

    trainer(child, "alone").run(checkpoint_every=0, progress=False)
    host = trainer(parent, "host")
    host.forks.keep, host.forks.history_length = {START: tmp_path / "host" / "fork.pt"}, WINDOW - 1
    host.run(checkpoint_every=0, progress=False)
    torch.manual_seed(123)  # the child's process starts with another stream position
    trainer(child, "forked").run(
        checkpoint_every=0,
        progress=False,
        fork_from=tmp_path / "host" / "fork.pt",
        accepts=lambda p, r: forks.shares_prefix(child, p, r),
    )
    assert_same_run(tmp_path / "alone", tmp_path / "forked")
