"""The cost of an +ima/FMA pair at the paper's IMA FMNIST settings, with and without shared prefixes.

A full pair (300 rounds each) does not fit a short measurement, so this times rounds: the host's (FedAvg,
what the parent and an unshared child train before t_s), the child's after t_s (IMA's window included),
and writing and reading the fork state; and it checks on the way that the forked child equals the child
trained from round 0, on real Fashion-MNIST at full size. The pair's wall time on one device is then

    unshared   2 R x host round                       (the child trains its first t_s rounds too)
    shared     R x host round + (R - t_s) x IMA round + fork state written and read

    python scripts/fork_pair_cost.py [--rounds 8] [--data-root data/fmnist]  (writes JSON to stdout)
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

from fedrepro import checkpoint, config, data, engine, forks, partition
from fedrepro.identity import partition_setting
from fedrepro.provenance import machine

ROOT = Path(__file__).resolve().parents[1]


def pair_settings(rounds: int) -> tuple[dict, dict, dict]:
    """The paper's FedAvg and FedAvg+IMA on #C=2 (params/ima.yaml), and the full-length child."""
    params = config.load_params(ROOT / "params" / "ima.yaml")
    params["only"] = "ima_table1_fmnist"
    runs = [r for r in config.expand(params) if r.setting["partition"]["kind"] == "shards" and r.setting["seed"] == 1
            and r.setting["algorithm"] == "fedavg"]
    host = next(r.setting for r in runs if not r.setting["plugins"])
    child = next(r.setting for r in runs if r.setting["plugins"] == ["ima"])
    short = lambda s: {**copy.deepcopy(s), "rounds": rounds}
    child_short = short(child)
    child_short["ima"]["start_round"] = rounds - 3  # three rounds of IMA after the fork
    return config.resolve(short(host)), config.resolve(child_short), child


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--data-root", default=str(ROOT / "data" / "fmnist"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    host, child, full = pair_settings(args.rounds)
    start = forks.late_plugins(child)["ima"][0]
    datasets = tuple(data.load("fmnist", args.data_root, train=split) for split in (True, False))
    parts = partition.make(datasets[0].labels.numpy(), partition_setting(host))
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trainer = lambda s, out: engine.Trainer(s, tmp / out, None, None, datasets=datasets, parts=parts)
        alone = trainer(child, "alone")
        alone.run(checkpoint_every=0, progress=False)
        parent = trainer(host, "parent")
        parent.keep_forks, parent.history_length = {start: tmp / "parent" / "fork.pt"}, full["ima"]["window"] - 1
        tic = time.perf_counter()
        parent.run(checkpoint_every=0, progress=False)
        parent_wall = time.perf_counter() - tic
        tic = time.perf_counter()
        checkpoint.save(parent.fork_state(start), tmp / "write-timing.pt", digest=True)
        write_s = time.perf_counter() - tic
        forked = trainer(child, "forked")
        tic = time.perf_counter()
        forked.run(checkpoint_every=0, progress=False, fork_from=tmp / "parent" / "fork.pt",
                   accepts=lambda p, r: forks.shares_prefix(child, p, r))
        forked_wall = time.perf_counter() - tic
        metrics = {name: pd.read_csv(tmp / name / "metrics.csv") for name in ("alone", "forked", "parent")}
        drop = ["seconds", "wall_time"]
        identical = (metrics["alone"].drop(columns=drop).to_csv(index=False)
                     == metrics["forked"].drop(columns=drop).to_csv(index=False)
                     and torch.equal(checkpoint.load(tmp / "alone" / "model.pt")["x"],
                                     checkpoint.load(tmp / "forked" / "model.pt")["x"]))
        fork_mb = (tmp / "parent" / "fork.pt").stat().st_size / 1e6 if (tmp / "parent" / "fork.pt").exists() else \
            (tmp / "write-timing.pt").stat().st_size / 1e6
        host_round = float(np.median(metrics["parent"]["seconds"]))
        ima_round = float(np.median(metrics["forked"]["seconds"].iloc[start:]))
        read_s = forked_wall - float(metrics["forked"]["seconds"].iloc[start:].sum())
    R, t_s = full["rounds"], forks.late_plugins(full)["ima"][0]
    unshared = 2 * R * host_round
    shared = R * host_round + (R - t_s) * ima_round + write_s + max(read_s, 0.0)
    print(json.dumps({
        "setting": "IMA Table 1 FMNIST CNN, #C=2, FedAvg / FedAvg+IMA (100 clients, 10 per round, E=5, B=50)",
        "rounds": R, "t_s": t_s, "host_round_s": host_round, "ima_round_s": ima_round,
        "fork_state_mb": fork_mb, "fork_write_s": write_s, "fork_read_and_start_s": read_s,
        "pair_unshared_h": unshared / 3600, "pair_shared_h": shared / 3600,
        "one_run_h": R * host_round / 3600, "shared_over_one_run": shared / (R * host_round),
        "forked_equals_unshared": identical, "measured_rounds": args.rounds, "threads": args.threads,
        "loadavg_before": load0, "loadavg_after": os.getloadavg(), "machine": machine(),
        "device": str(parent.device)}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
