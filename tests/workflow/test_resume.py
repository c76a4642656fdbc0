"""No lost work: a run stopped (--stop-after, SIGTERM, SIGKILL) and rerun equals the uninterrupted run
exactly on CPU; a run whose loss becomes NaN/inf is recorded as diverged."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import file_size_limit, make_partition, subprocess_env, train_args
from fedrepro import cli
from fedrepro.configure import registry
from fedrepro.run import checkpoint

BASE = {
    "dataset": "fmnist",
    "model": "mlp",
    "num_clients": 4,
    "participation": 0.5,
    "rounds": 6,
    "batch_size": 50,
    "device": "cpu",
    "eval_every": 1,
    "client": {"lr": 0.05},
    "partition": {"kind": "iid", "seed": 1},
}

# Methods with server or client state that a checkpoint must carry; the extra settings make
# their state matter within 6 rounds. A method not (yet) in the registry is skipped.
_PROXY = {"proxy_size": 20, "server_epochs": 2, "optimizer": "adam", "lr": 0.001}  # Adam: moments to keep
_PERMUTATION = {"cohort": {"warmup": "permutation"}}  # every client seen by round 2: the AWARE step runs
METHODS = {
    "fedavg": {},
    "fedaware": _PERMUTATION,
    "fedavg+ima": {"ima": {"start_round": 2, "window": 2}},
    "scaffold": {},
    "feddyn": {},
    "fedadam": {},
    "fednova": {},
    "fedlaw": {"fedlaw": {"proxy_size": 20}, "evaluation": {"proxy_holdout": 20}},
    "fedavgm": {},
    "fedavg+aware": _PERMUTATION,
    "fedyogi": {},
    # the proxy methods' server optimiser (Adam moments, kept across rounds by default)
    "feddf": {"feddf": _PROXY, "evaluation": {"proxy_holdout": 20}},
    "fedbe": {"fedbe": _PROXY, "evaluation": {"proxy_holdout": 20}},
    "serverft": {"serverft": _PROXY, "evaluation": {"proxy_holdout": 20}},
    "fedasam": {},
    "fedgma": {"fedgma": {"lr": 0.1}},
    "fedfa": {"model": "cnn"},  # anchors (server state) and calibration from round 2 of 6
}
# Variants of a method under their own case name: (algorithm, extra settings)
VARIANTS = {
    "fednova_vr": ("fednova", {"fednova": {"vr": True}, "participation": 1.0, "client": {"lr": 0.05, "momentum": 0.9}}),
    # the official codes' client protocol: per-client momentum kept across rounds (checkpointed state)
    # and a hold-out drawn from the seed
    "keep_momentum": ("fedavg", {"client": {"lr": 0.05, "momentum": 0.9, "keep_momentum": True}}),
    "holdout": ("fedavg", {"client": {"lr": 0.05, "holdout": 0.3}}),
    # FedNova's a_i with local momentum (its paper's Table 1 "with momentum" rows)
    "fednova_momentum": ("fednova", {"client": {"lr": 0.05, "momentum": 0.9}}),
}
# The cases whose method keeps state across rounds in its checkpointed parts: resumed with that state
# dropped, the run must come out different, or the exact-resume test above could not see it missing.
STATEFUL = [
    "fedaware",
    "fedavg+ima",
    "scaffold",
    "feddyn",
    "fedadam",
    "fedyogi",
    "fedavgm",
    "fedavg+aware",
    "fedfa",
    "feddf",
    "fedbe",
    "serverft",
    "fednova_vr",
]
CASES = [("fedavg", 1), ("fedavg", 4)] + [(m, 3) for m in METHODS if m != "fedavg"] + [(m, 3) for m in VARIANTS]


def _known(method: str) -> bool:
    name, *plugins = VARIANTS.get(method, (method,))[0].split("+")
    return name in registry.ALGORITHMS and all(p in registry.PLUGINS for p in plugins)


@pytest.fixture(scope="module")
def partition_dir(tiny_data_root, tmp_path_factory):
    return make_partition(tiny_data_root, tmp_path_factory.mktemp("part"), num_clients=4)


def _setting(method: str, **override) -> dict:
    if method in VARIANTS:
        algorithm, extra = VARIANTS[method]
        return {**BASE, "algorithm": algorithm, **extra, **override}
    return {**BASE, "algorithm": method, **METHODS.get(method, {}), **override}


def _metrics(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(run_dir / "metrics.csv").drop(columns=["seconds", "wall_time"])  # timings differ between runs


def _assert_same_run(a: Path, b: Path) -> None:
    pd.testing.assert_frame_equal(_metrics(a), _metrics(b), check_exact=True)
    xa, xb = checkpoint.load(a / "model.pt")["x"], checkpoint.load(b / "model.pt")["x"]
    assert torch.equal(xa, xb), "the final models differ"
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    assert sa["final_acc"] == sb["final_acc"] or (math.isnan(sa["final_acc"]) and math.isnan(sb["final_acc"]))


_reference: dict[str, Path] = {}


def _uninterrupted(method, tmp_path_factory, partition_dir, data_root) -> Path:
    if method not in _reference:
        out = tmp_path_factory.mktemp("ref") / method
        cli.main(train_args(_setting(method), out, partition_dir, data_root))
        _reference[method] = out
    return _reference[method]


@pytest.mark.parametrize("method,stop", CASES, ids=[f"{m}-stop{k}" for m, k in CASES])
def test_stop_and_resume_equals_uninterrupted(method, stop, tmp_path, tmp_path_factory, partition_dir, tiny_data_root):
    assert _known(method), f"{method} is not in registry.ALGORITHMS / PLUGINS"
    ref = _uninterrupted(method, tmp_path_factory, partition_dir, tiny_data_root)
    out = tmp_path / "run"
    args = train_args(_setting(method), out, partition_dir, tiny_data_root, "--checkpoint-every", "2")
    cli.main(args + ["--stop-after", str(stop)])
    assert (out / "checkpoint.pt").exists() and not (out / "summary.json").exists()
    state = checkpoint.load(out / "checkpoint.pt")
    assert state["next_round"] == stop and len(state["rows"]) == stop
    cli.main(args)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed"] is True and summary["status"] == "finished" and summary["rounds_done"] == 6
    assert not (out / "checkpoint.pt").exists()
    _assert_same_run(ref, out)


@pytest.mark.parametrize("method", STATEFUL)
def test_a_resume_without_the_methods_state_differs(
    method, tmp_path, tmp_path_factory, partition_dir, tiny_data_root, monkeypatch
):
    """The exact-resume test above can fail: the same stop and resume with the method's state left out of
    the restore (its parts start afresh at round 3) gives another model."""
    from fedrepro import parts

    ref = _uninterrupted(method, tmp_path_factory, partition_dir, tiny_data_root)
    out = tmp_path / "run"
    args = train_args(_setting(method), out, partition_dir, tiny_data_root, "--checkpoint-every", "2")
    cli.main(args + ["--stop-after", "3"])
    assert any(_has_values(v) for v in checkpoint.load(out / "checkpoint.pt")["algorithm"].values()), (
        "the checkpoint holds no state of the method"
    )
    monkeypatch.setattr(parts.Algorithm, "load_state_dict", lambda self, state: None)
    cli.main(args)
    assert json.loads((out / "summary.json").read_text())["resumed"] is True
    xa, xb = checkpoint.load(ref / "model.pt")["x"], checkpoint.load(out / "model.pt")["x"]
    assert not torch.equal(xa, xb), f"{method}: dropping its state changed nothing"


def _has_values(state) -> bool:
    """Whether a part's state dict holds any non-zero number (a tensor, a list, nested dicts)."""
    if isinstance(state, dict):
        return any(_has_values(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return any(_has_values(v) for v in state)
    if isinstance(state, torch.Tensor):
        return bool(state.numel()) and bool(state.ne(0).any())
    return isinstance(state, (int, float)) and not isinstance(state, bool) and state != 0


def test_checkpoint_of_another_setting_is_not_used(tmp_path, partition_dir, tiny_data_root):
    out = tmp_path / "run"
    cli.main(train_args(_setting("fedavg"), out, partition_dir, tiny_data_root, "--stop-after", "2"))
    other = _setting("fedavg", client={"lr": 0.01})
    cli.main(train_args(other, out, partition_dir, tiny_data_root))
    assert json.loads((out / "summary.json").read_text())["resumed"] is False
    # nothing of the other setting's rounds was kept: the model is that of a fresh run of this setting
    cli.main(train_args(other, tmp_path / "fresh", partition_dir, tiny_data_root))
    assert torch.equal(checkpoint.load(out / "model.pt")["x"], checkpoint.load(tmp_path / "fresh" / "model.pt")["x"])


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killed_run_resumes_to_the_same_result(sig, tmp_path, partition_dir, tiny_data_root):
    """SIGTERM (Slurm preemption) saves a checkpoint before exit; after SIGKILL the last periodic one is used."""
    setting = _setting("fedavg", rounds=400, eval_every=50)
    ref = tmp_path / "ref"
    cli.main(train_args(setting, ref, partition_dir, tiny_data_root, "--checkpoint-every", "0"))
    out = tmp_path / "run"
    args = train_args(setting, out, partition_dir, tiny_data_root, "--checkpoint-every", "50")
    proc = subprocess.Popen(
        ["fedrepro", *args], env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for(out / "checkpoint.pt", proc)  # round 50 is done: the loop is running
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, "the run was meant to be interrupted, not to finish"
    assert not (out / "summary.json").exists()
    state = checkpoint.load(out / "checkpoint.pt")
    if sig == signal.SIGTERM:
        assert "SIGTERM" in err
        # saved by the handler after the round it interrupted, not the periodic one of round 50
        assert 50 < state["next_round"] < 400 and len(state["rows"]) == state["next_round"]
    else:
        assert state["next_round"] % 50 == 0
    proc = subprocess.run(["fedrepro", *args], env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["resumed"] is True
    _assert_same_run(ref, out)


def test_nan_loss_is_recorded_as_diverged(tmp_path, partition_dir, tiny_data_root):
    out = tmp_path / "run"
    cli.main(train_args(_setting("fedavg", rounds=20, client={"lr": 1.0e8}), out, partition_dir, tiny_data_root))
    summary = json.loads((out / "summary.json").read_text())
    metrics = pd.read_csv(out / "metrics.csv")
    assert summary["status"] == "diverged"
    assert summary["rounds_done"] == len(metrics) < 20, "a diverged run stops"
    # the blow-up shows in the last round, in the training loss or in the step it took (engine.diverged)
    last = metrics.iloc[-1]
    assert not all(math.isfinite(last[k]) for k in ("train_loss", "step_norm", "global_norm", "update_norm_max"))
    assert math.isnan(summary["final_acc"])
    assert not (out / "checkpoint.pt").exists()


def test_a_checkpoint_holds_the_trainers_state_and_each_observers_declared_state(
    tmp_path, partition_dir, tiny_data_root
):
    """Every observer declares the state it keeps; a checkpoint holds that and the trainer's own, nothing more,
    so a resume restores exactly what the observers say they need."""
    from fedrepro.configure.settings import resolve
    from fedrepro.run.observers import Observer
    from fedrepro.run.trainer import Trainer

    setting = resolve({**BASE, "algorithm": "fedavg", "rounds": 4, "snapshots": {"rounds": [1]}})
    trainer = Trainer(setting, tmp_path / "run", partition_dir, tiny_data_root)
    trainer.run(progress=False, stop_after=2)
    saved = checkpoint.load(trainer.paths.checkpoint)
    declared = {key for observer in trainer.observers for key in observer.saves}
    assert declared == {"rows", "snapshots", "cosines", "history", "forked_from"}
    core = {"next_round", "x", "buffers", "algorithm", "elapsed", "setting_hash", "client_momentum", "torch_rng"}
    assert set(saved) == core | declared
    assert len(saved["rows"]) == 2 and set(saved["snapshots"]) == {
        "round_1_global",
        "round_1_client_0",
        "round_1_client_1",
        "round_1_sizes",
        "round_1_next",
    }

    class Undeclared(Observer):
        def state(self):
            return {"kept": 1}

    trainer.observers.append(Undeclared())
    with pytest.raises(AssertionError, match="declares"):
        trainer.state(2)


def test_a_full_disk_ends_in_one_line_naming_the_run_and_the_last_checkpoint_stands(
    tmp_path, partition_dir, tiny_data_root
):
    setting = _setting("fedavg")
    ref = tmp_path / "ref"
    cli.main(train_args(setting, ref, partition_dir, tiny_data_root))
    out = tmp_path / "run"
    args = train_args(setting, out, partition_dir, tiny_data_root, "--checkpoint-every", "1")
    cli.main(args + ["--stop-after", "2"])
    kept = (out / "checkpoint.pt").read_bytes()
    # round 3's checkpoint (the model and three rounds of rows) cannot be written; metrics.csv still can
    full = subprocess.run(
        ["fedrepro", *args],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=file_size_limit(len(kept) // 2),
    )
    assert full.returncode == 2, full.stderr[-2000:]
    assert "Traceback" not in full.stderr, full.stderr[-2000:]
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith(f"fedrepro train: cannot write {out}: File too large; free space there"), last
    assert (out / "checkpoint.pt").read_bytes() == kept, "the last complete checkpoint stands"
    assert not [p.name for p in out.iterdir() if p.name.endswith(".part")], "no temporary file is left behind"
    assert not (out / "summary.json").exists()
    cli.main(args)  # space freed: the run resumes at round 3 and ends as the uninterrupted one
    assert json.loads((out / "summary.json").read_text())["resumed"] is True
    _assert_same_run(ref, out)
