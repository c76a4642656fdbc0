"""A table's own runs trained as one pack on a device for a fixed time: the seconds a packed round of the table's
settings takes (its data, partitions, methods, client programs and evaluation), measured, and the table's time
extrapolated from it. ``scripts/gpu_check.sh`` runs it for IMA Table 1's FMNIST rows (``fedrepro bench-table``).

The pack is ``fedrepro train-pack``'s (run/packed.py) in a child process, sent SIGTERM at the time box, so every
run checkpoints where it stands and a later call resumes it. The runs measured are the table's runs that train
from round 0; a run that starts from another's state (an +IMA child at t_s) trains its rounds on the same
model, data and client program as its host (IMA's averaging is a server step) and is priced at the same cost
a run-round, from its start. Each run's ``metrics.csv`` gives the wall clock at every round's end: the pack's
round is the median of the runs' steady rounds (the first round, which compiles and warms up, left out).
"""

from __future__ import annotations

import json
import math
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fedrepro import identity
from fedrepro.configure import expansion, forks, paramsfile
from fedrepro.run import checkpoint
from fedrepro.run.provenance import machine
from fedrepro.run.rundir import RunDir

GRACE_S = 120.0  # after SIGTERM: the round in flight ends and every run writes its checkpoint


def table_runs(configfiles: list[str], only: str) -> tuple[list, list, dict]:
    """The experiment's final runs (a tuned one with the chosen value, or the tune grid's first before the
    choice, as ``fedrepro plan`` counts them), its tuning runs, and the forks among them (child id -> Fork)."""
    from fedrepro.ops.plan import final_runs

    params = paramsfile.load_params_files(configfiles)
    params["only"] = only
    tunings: dict = {}
    runs = expansion.expand(params, tunings)
    runs = list(expansion.unique_runs(runs + final_runs(tunings, "results/runs")[0]).values())
    return [r for r in runs if not r.tuning], [r for r in runs if r.tuning], forks.of_params(params, runs)


def _partitions(runs, data_root: str, log) -> dict[str, str]:
    """Each run's partition folder, made (``fedrepro partition``) where it is missing."""
    folders = {}
    for run in runs:
        folder = f"results/partitions/{identity.partition_id(run.setting)}"
        if not Path(folder, "clients.npz").exists():
            part = identity.partition_setting(run.setting)
            cmd = [sys.executable, "-m", "fedrepro.cli", "partition", "--setting", json.dumps(part, sort_keys=True)]
            cmd += ["--data-root", f"{data_root}/{run.setting['dataset']}", "--out", folder]
            log(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip())
        folders[run.id] = folder
    return folders


def pack_members(base, partition_of: dict, data_root: str, root: str, overrides: dict | None) -> list[dict]:
    """``fedrepro train-pack``'s members, each in a folder named by its setting's id (with the overrides set,
    another run than the table's, as train-pack checks)."""
    members = []
    for r in base:
        setting = {**r.setting, **(overrides or {})}
        members.append(
            {
                "setting": setting,
                "out": f"{root}/runs/{identity.run_id(setting)}",
                "partition": partition_of[r.id],
                "data_root": f"{data_root}/{r.setting['dataset']}",
            }
        )
    return members


def round_rows(run_dir: Path) -> list[dict]:
    """A run's rows so far: its metrics.csv once finished, else those its checkpoint holds (a stopped run)."""
    paths = RunDir(run_dir)
    if paths.metrics.exists():
        return paths.read_metrics().to_dict("records")
    return checkpoint.load(paths.checkpoint)["rows"] if paths.checkpoint.exists() else []


def steady_round_seconds(rows: list[dict]) -> float | None:
    """Seconds a round took once warm: the wall clock's steps between round ends after the first."""
    wall = [row["wall_time"] for row in rows]
    steps = [b - a for a, b in zip(wall, wall[1:])]  # round 2 on: the first has no end before it
    return statistics.median(steps) if steps else None


def extrapolate(runs, fork_of: dict, pack_round_s: float, pack_runs: int) -> dict:
    """The table's time at the measured cost of one run's share of a packed round (module doc)."""
    run_round = pack_round_s / pack_runs
    rounds = sum(r.setting["rounds"] - (fork_of[r.id].round if r.id in fork_of else 0) for r in runs)
    return {
        "runs": len(runs),
        "forked_runs": sum(r.id in fork_of for r in runs),
        "run_rounds": rounds,
        "run_round_s": run_round,
        "minutes": run_round * rounds / 60,
        "packs_of_this_size": math.ceil(len(runs) / pack_runs),
        "how": "the run-rounds (a forked run's from its fork round) x the measured packed round / the runs in the pack",
    }


def measure(
    configfiles: list[str],
    only: str,
    seconds: float,
    out: str | Path,
    root: str = "results/table_pack",
    data_root: str = "data",
    max_runs: int = 0,
    algorithms: tuple[str, ...] = (),
    overrides: dict | None = None,
    log=print,
) -> dict:
    """Train the table's round-0 runs (of ``algorithms`` only, if given; with ``overrides`` set in every
    setting, a precision say, which makes them other runs) as one pack for ``seconds``; write and return the
    record (module doc)."""
    runs, tuning_runs, fork_of = table_runs(configfiles, only)
    if not runs:
        raise SystemExit(f"fedrepro bench-table: --only {only} names no runs of {', '.join(configfiles)}")
    base = sorted((r for r in runs if r.id not in fork_of), key=lambda r: r.id)
    if algorithms:
        base = [r for r in base if r.setting["algorithm"] in algorithms]
    if max_runs:
        base = base[:max_runs]
    if not base:
        raise SystemExit(f"fedrepro bench-table: no round-0 run of {only} is of {', '.join(algorithms)}")
    partition_of = _partitions(base, data_root, log)
    members = pack_members(base, partition_of, data_root, root, overrides)
    folder = {r.id: m["out"] for r, m in zip(base, members)}
    Path(root).mkdir(parents=True, exist_ok=True)
    Path(root, "members.json").write_text(json.dumps(members, indent=1, sort_keys=True))
    cmd = [sys.executable, "-m", "fedrepro.cli", "train-pack", "--members", f"{root}/members.json"]
    cmd += ["--checkpoint-every", "10", "--report", f"{root}/report.json"]
    log(f"bench-table: {len(base)} runs of {only} in one pack for {seconds:.0f} s")
    tic = time.monotonic()
    with open(Path(root, "train_pack.log"), "a") as pack_log:
        child = subprocess.Popen(cmd, stdout=pack_log, stderr=subprocess.STDOUT)
        try:
            child.wait(timeout=seconds)
            stopped = "finished"
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGTERM)
            stopped = "time box"
            try:
                child.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
                stopped = "time box; killed after the grace period (no checkpoint of the last rounds)"
    wall = time.monotonic() - tic
    per_run = {}
    for r in base:
        rows = round_rows(Path(folder[r.id]))
        per_run[r.id] = {
            "trained_as": Path(folder[r.id]).name,
            "algorithm": r.setting["algorithm"],
            "partition": r.setting["partition"]["kind"],
            "seed": r.setting["seed"],
            "rounds_done": len(rows),
            "steady_round_s": steady_round_seconds(rows),
            "last_test_acc": float(rows[-1]["test_acc"]) if rows else None,
        }
    steady = [v["steady_round_s"] for v in per_run.values() if v["steady_round_s"] is not None]
    pack_round = statistics.median(steady) if steady else None
    record = {
        "machine": machine(),
        "configfiles": configfiles,
        "experiment": only,
        "algorithms": list(algorithms),
        "overrides": overrides or {},
        "time_box_s": seconds,
        "wall_s": round(wall, 1),
        "stopped": stopped,
        "exit_code": child.returncode,
        "pack_runs": len(base),
        "pack_round_s": pack_round,
        "runs": per_run,
    }
    if pack_round is not None:
        record["table"] = extrapolate(runs, fork_of, pack_round, len(base))
        record["tuning"] = extrapolate(tuning_runs, fork_of, pack_round, len(base)) if tuning_runs else None
        t = record["table"]
        log(
            f"bench-table: a packed round of {len(base)} runs {pack_round:.3f} s ({t['run_round_s'] * 1e3:.1f} ms "
            f"a run-round); {only}: {t['runs']} runs, {t['run_rounds']} run-rounds, {t['minutes']:.1f} min extrapolated"
        )
    else:
        log(f"bench-table: no run trained two rounds; the pack's log: {root}/train_pack.log")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(record, indent=2, default=str))
    return record
