"""The cost of an +ima/FMA pair at the paper's IMA FMNIST settings, with and without shared prefixes.

A full pair (300 rounds each) does not fit a short measurement, so this times rounds: the host's (FedAvg,
what the parent and an unshared child train before t_s), the child's after t_s (IMA's window included),
and writing and reading the fork state; and it checks on the way that the forked child equals the child
trained from round 0, on real Fashion-MNIST at full size. The pair's wall time on one device is then

    unshared   2 R x host round                       (the child trains its first t_s rounds too)
    shared     R x host round + (R - t_s) x IMA round + fork state written and read

    python scripts/fork_pair_cost.py --rounds 8 [--data-root data/fmnist]       (times rounds too)
    python scripts/fork_pair_cost.py --round-seconds 3.3                        (a measured round, e.g. bench)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fedrepro import data, partitions
from fedrepro.configure import expansion, forks, paramsfile, settings
from fedrepro.identity import partition_setting
from fedrepro.run import checkpoint
from fedrepro.run.provenance import machine
from fedrepro.run.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def pair_settings(rounds: int) -> tuple[dict, dict, dict]:
    """The paper's FedAvg and FedAvg+IMA on #C=2 (params/ima.yaml), and the full-length child."""
    params = paramsfile.load_params(ROOT / "params" / "ima.yaml")
    params["only"] = "ima_table1_fmnist"
    runs = [
        r
        for r in expansion.expand(params)
        if r.setting["partition"]["kind"] == "shards" and r.setting["seed"] == 1 and r.setting["algorithm"] == "fedavg"
    ]
    host = next(r.setting for r in runs if not r.setting["plugins"])
    child = next(r.setting for r in runs if r.setting["plugins"] == ["ima"])
    short = lambda s: {**copy.deepcopy(s), "rounds": rounds}
    child_short = short(child)
    child_short["ima"]["start_round"] = rounds - 3  # three rounds of IMA after the fork
    return settings.resolve(short(host)), settings.resolve(child_short), child


def fork_overheads(host: dict, child: dict, datasets, parts, tmp: Path, window: int) -> dict:
    """What sharing adds, at the real model size: the fork state's size, writing it, starting a child from it,
    and IMA's window average per round; no training."""
    parent = Trainer(host, tmp / "parent", None, None, datasets=datasets, parts=parts)
    parent.forks.history_length = window - 1
    parent.forks.history = [parent.model.flat.clone() for _ in range(window - 1)]
    start = forks.late_plugins(child)["ima"][0]
    path = tmp / "fork.pt"
    tic = time.perf_counter()
    checkpoint.save(parent.forks.fork_state(parent, start), path, digest=True)
    write_s = time.perf_counter() - tic
    forked = Trainer(child, tmp / "child", None, None, datasets=datasets, parts=parts)
    tic = time.perf_counter()
    forked.forks.start(forked, path, lambda p, r: forks.shares_prefix(child, p, r))
    read_s = time.perf_counter() - tic
    window_part = forked.algorithm.post_steps[-1]
    x = forked.model.flat.clone()
    from fedrepro.parts import RoundUpdates

    updates = RoundUpdates(start, None, None, None, None, None, 0.0)
    tic = time.perf_counter()
    for _ in range(20):
        window_part(x, updates)
    window_s = (time.perf_counter() - tic) / 20
    return {
        "fork_state_mb": path.stat().st_size / 1e6,
        "fork_write_s": write_s,
        "fork_read_and_start_s": read_s,
        "ima_window_average_s": window_s,
        "parameters": forked.model.numel,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="also train this many rounds of each (0: overheads only, "
        "with --round-seconds measured elsewhere, e.g. fedrepro bench)",
    )
    ap.add_argument("--round-seconds", type=float, help="seconds per host round when --rounds is 0")
    ap.add_argument("--data-root", default=str(ROOT / "data" / "fmnist"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    host, child, full = pair_settings(max(args.rounds, 8))
    window = full["ima"]["window"]
    datasets = tuple(data.load("fmnist", args.data_root, train=split) for split in (True, False))
    parts = partitions.make(datasets[0].labels.numpy(), partition_setting(host))
    load0 = os.getloadavg()
    result: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        result.update(fork_overheads(host, child, datasets, parts, tmp / "overheads", window))
        if args.rounds:
            result.update(timed_pair(host, child, datasets, parts, tmp, window))
    host_round = result.get("host_round_s", args.round_seconds)
    ima_round = result.get("ima_round_s", (host_round or 0) + result["ima_window_average_s"])
    R, t_s = full["rounds"], forks.late_plugins(full)["ima"][0]
    if host_round:
        one = R * host_round
        shared = one + (R - t_s) * ima_round + result["fork_write_s"] + result["fork_read_and_start_s"]
        result.update(
            {
                "pair_unshared_h": 2 * one / 3600,
                "pair_shared_h": shared / 3600,
                "one_run_h": one / 3600,
                "shared_over_one_run": shared / one,
                "unshared_over_one_run": 2.0,
            }
        )
    print(
        json.dumps(
            {
                "setting": "IMA Table 1 FMNIST CNN, #C=2, FedAvg / FedAvg+IMA (100 clients, 10 per round, E=5, B=50)",
                "rounds": R,
                "t_s": t_s,
                "host_round_s": host_round,
                "ima_round_s": ima_round,
                **result,
                "threads": args.threads,
                "loadavg_before": load0,
                "loadavg_after": os.getloadavg(),
                "machine": machine(),
            },
            indent=2,
        )
    )


def timed_pair(host, child, datasets, parts, tmp: Path, window: int) -> dict:
    """Rounds of the host and of the child after t_s, timed, and the forked child checked against the child
    trained from round 0."""
    start = forks.late_plugins(child)["ima"][0]
    trainer = lambda s, out: Trainer(s, tmp / out, None, None, datasets=datasets, parts=parts)
    trainer(child, "alone").run(checkpoint_every=0, progress=False)
    parent = trainer(host, "parent")
    parent.keep_forks, parent.history_length = {start: tmp / "parent" / "fork.pt"}, window - 1
    parent.run(checkpoint_every=0, progress=False)
    trainer(child, "forked").run(
        checkpoint_every=0,
        progress=False,
        fork_from=tmp / "parent" / "fork.pt",
        accepts=lambda p, r: forks.shares_prefix(child, p, r),
    )
    metrics = {name: pd.read_csv(tmp / name / "metrics.csv") for name in ("alone", "forked", "parent")}
    drop = ["seconds", "wall_time"]
    identical = metrics["alone"].drop(columns=drop).to_csv(index=False) == metrics["forked"].drop(columns=drop).to_csv(
        index=False
    ) and torch.equal(
        checkpoint.load(tmp / "alone" / "model.pt")["x"], checkpoint.load(tmp / "forked" / "model.pt")["x"]
    )
    return {
        "host_round_s": float(np.median(metrics["parent"]["seconds"])),
        "ima_round_s": float(np.median(metrics["forked"]["seconds"].iloc[start:])),
        "forked_equals_unshared": identical,
        "measured_rounds": len(metrics["parent"]),
    }


if __name__ == "__main__":
    sys.exit(main())
