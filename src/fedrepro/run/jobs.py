"""The two jobs a run is asked for: train it (``fedrepro train``), and give a child the state of its first
rounds (``fedrepro fork``)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from fedrepro.identity import stable_hash
from fedrepro.run import checkpoint
from fedrepro.run.fork_states import ForkError, ForkStates
from fedrepro.run.rundir import RunDir
from fedrepro.run.trainer import Trainer


def train(
    setting: dict,
    run_dir,
    partition_dir,
    data_root,
    checkpoint_every: int = 10,
    progress: bool = True,
    stop_after: int | None = None,
    tracker=None,
    keep_forks: list[int] = (),
    history: int = 0,
    fork_from: str | Path | None = None,
    accepts=None,
) -> dict:
    """``keep_forks``: rounds at which to keep a fork state for children (with the last ``history`` models);
    ``fork_from``: a parent's fork state to start from (``accepts`` checks the parent's setting)."""
    paths = RunDir(Path(run_dir))
    forks = ForkStates({int(r): paths.kept_fork(int(r)) for r in keep_forks}, history)
    trainer = Trainer(setting, run_dir, partition_dir, data_root, forks=forks)
    return trainer.run(checkpoint_every, progress, stop_after, tracker, fork_from, accepts)


def fork_state(setting: dict, run_dir, round_: int, history: int, out, partition_dir, data_root) -> str:
    """The state of run ``run_dir`` after ``round_`` rounds, with its last ``history`` models, at ``out``: the
    one the run kept while it trained (moved, not copied), else that prefix trained again, which gives the
    same bytes (a run that finished before a child asked for this round, or a kept state already used)."""
    paths, out = RunDir(Path(run_dir)), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = paths.kept_fork(round_)
    if kept.exists():
        try:
            state = checkpoint.load(kept)
            usable = (
                state.get("fork", {}).get("round") == round_
                and state["setting_hash"] == stable_hash(setting)
                and len(state.get("history", [])) >= min(history, round_)
            )
        except checkpoint.CheckpointError as err:
            print(f"warning: {err}; training the prefix again", file=sys.stderr)
            usable = False
        if usable:
            os.replace(kept, out)
            return "kept"
    scratch = out.parent / f".prefix-{round_}"
    # the fork state names the run
    trainer = Trainer(setting, scratch / paths.id, partition_dir, data_root, forks=ForkStates({round_: out}, history))
    trainer.run(checkpoint_every=10, progress=False, stop_after=round_)
    shutil.rmtree(scratch, ignore_errors=True)
    if not out.exists():
        raise ForkError(f"{out}: training {paths.id}'s first {round_} rounds wrote no fork state")
    return "trained"


def train_pack(members: list[dict], checkpoint_every: int = 10, progress: bool = False) -> list[dict]:
    """Several runs in one process as a pack (``run/packed.py``). ``members``: per run its ``setting``, ``out``
    folder, ``partition`` folder and ``data_root`` (and, where it has them, ``keep_forks``, ``history``,
    ``fork_from`` with its ``accepts``, and ``done_at``: its final folder where it trains elsewhere). A run whose
    folder (or ``done_at``) holds a summary of its setting is done and left alone (so a changed
    pack-mate retrains only itself); the others resume from their own checkpoints where they have one. Each data
    set is loaded once, on the device, and shared by the runs that train on it. Returns each run's outcome."""
    from fedrepro import data
    from fedrepro.records import read_json
    from fedrepro.run.packed import PackedRuns
    from fedrepro.run.process import pick_device

    trainers, outcomes, loaded = [], [], {}
    for member in members:
        setting, paths = member["setting"], RunDir(Path(member["out"]))
        done = [RunDir(Path(d)).summary for d in (member["out"], member.get("done_at")) if d]
        if any(f.exists() and read_json(f).get("setting_hash") == stable_hash(setting) for f in done):
            outcomes.append({"run": paths.root.name, "status": "done before"})
            continue
        device = pick_device(setting["device"])
        key = (
            setting["dataset"],
            str(member["data_root"]),
            json_key(setting["preprocess"]),
            json_key(setting["pretrained"]),
            str(device),
        )
        if key not in loaded:
            loaded[key] = tuple(
                data.load(
                    setting["dataset"],
                    member["data_root"],
                    train=split,
                    preprocess=setting["preprocess"],
                    pretrained=setting["pretrained"],
                ).to(device)
                for split in (True, False)
            )
        forks = ForkStates(
            {int(r): paths.kept_fork(int(r)) for r in member.get("keep_forks", ())}, member.get("history", 0)
        )
        trainers.append(
            (
                Trainer(
                    setting, member["out"], member["partition"], member["data_root"], datasets=loaded[key], forks=forks
                ),
                (member.get("fork_from"), member.get("accepts")),
            )
        )
        outcomes.append(None)
    if trainers:
        pack = PackedRuns([t for t, _ in trainers])
        forked = {id(t): f for t, f in trainers}
        results = iter(
            pack.run_each(
                lambda t: dict(
                    checkpoint_every=checkpoint_every,
                    progress=progress,
                    fork_from=forked[id(t)][0],
                    accepts=forked[id(t)][1],
                )
            )
        )
        outcomes = [next(results) if o is None else o for o in outcomes]
    return outcomes


def json_key(value) -> str:
    import json

    return json.dumps(value, sort_keys=True)
