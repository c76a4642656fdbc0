"""A params file's runs as frames, for the report page and for `dvc metrics` / `dvc plots`.

One row per run with its summary (a missing run is a row with status ``missing``: a partial grid still gives a
report) and one row per run and round; the per-experiment summary table, the switches' effects, and the small
per-variant files `fedrepro collect` writes.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd

from fedrepro import records
from fedrepro.run.rundir import RunDir

SEP = " · "  # between the parts of a run label


def load_runs(manifest: dict, runs_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per run with its summary, one row per run and round) for the manifest's runs."""
    rows, curves = [], []
    for exp_name, exp in manifest["experiments"].items():
        for run in exp["runs"]:
            run_dir = RunDir(runs_dir / run["id"])
            base = {
                "experiment": exp_name,
                "run": run["id"],
                "label": run["label"],
                "seed": run["seed"],
                "partition": run["partition"],
            }
            if not run_dir.finished():
                rows.append({**base, "status": "missing", "variant": run["variant"]})
                continue
            summary = run_dir.read_summary()  # a truncated file is named
            rows.append(
                {
                    **base,
                    "variant": run["variant"],
                    "status": summary["status"],
                    "final_acc": summary["final_acc"],
                    "best_acc": summary["best_acc"],
                    "e_ludd": summary["e_ludd"],
                    "runtime_s": summary["runtime_s"],
                    "device": f"{summary.get('host', '?')}: {summary['device']}, "
                    f"{summary.get('cpu_threads', '?')} CPU threads"
                    + (f", {summary['cpu_kernels']} kernels" if "cpu_kernels" in summary else ""),
                    "git_commit": summary["git_commit"],
                    "rounds_done": summary["rounds_done"],
                    "versions": summary.get("versions", {}),
                    "accelerator": accelerator_text(summary.get("accelerator")),
                }
            )
            metrics = run_dir.read_metrics()
            metrics = metrics.assign(**base)
            curves.append(metrics)
    runs = pd.DataFrame(rows)
    curve = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame()
    return runs, curve


def _mean_std(values: pd.Series, scale: float = 100.0) -> str:
    values = values.dropna()
    if values.empty:
        return "—"
    if len(values) == 1:
        return f"{values.iloc[0] * scale:.2f}"
    return f"{values.mean() * scale:.2f} ± {values.std(ddof=1) * scale:.2f}"


def summary_table(runs: pd.DataFrame) -> list[dict]:
    table = []
    for label, group in runs.groupby("label", sort=False):
        done = group[group["status"] == "finished"]
        table.append(
            {
                "label": label,
                "runs": f"{len(done)}/{len(group)}",
                "diverged": int((group["status"] == "diverged").sum()),
                "final_acc": _mean_std(done.get("final_acc", pd.Series(dtype=float))),
                "best_acc": _mean_std(done.get("best_acc", pd.Series(dtype=float))),
                "e_ludd": _mean_std(done.get("e_ludd", pd.Series(dtype=float)), scale=1.0),
                "runtime": f"{done['runtime_s'].mean():.0f} s" if "runtime_s" in done and len(done) else "—",
            }
        )
    return table


def switch_label(variant: dict) -> str:
    """What a grid point switches, besides its algorithm: the keys outside the algorithm's own section when
    there are any (a proxy-size switch sets ``evaluation.proxy_holdout`` for every method and
    ``fedlaw.proxy_size`` for FedLAW: one row), else the method's own keys."""
    algorithm = str(variant.get("algorithm", "")).split("+")[0]
    keys = {k: v for k, v in variant.items() if k != "algorithm"}
    shared = {k: v for k, v in keys.items() if k.split(".")[0] != algorithm}
    return SEP.join(f"{k}={v}" for k, v in (shared or keys).items())


ALL_SWITCHES = "all switches together"


def switch_effects(runs: pd.DataFrame, switches: bool | list[str] = True) -> dict | None:
    """For an experiment of switches (``switches: true``), each switch's effect on the final accuracy of
    each method: mean over seeds, and the difference from the method's run that switches nothing. A point
    that switches everything the method's other points switch one at a time is the row of all of them.
    With ``switches`` a list of grid keys, those keys alone are switches (a key at the first value the grid
    gives it switches nothing) and every other key of a point names its method."""
    # a diverged run has no final accuracy, but whether a switch makes a method diverge is its effect too
    done = runs[runs["status"].isin(["finished", "diverged"])] if len(runs) else runs
    if done.empty:
        return None
    if isinstance(switches, list):
        return _effects(done, *_by_switch_keys(runs, switches))
    method_of = lambda variant: str(variant.get("algorithm", ""))
    keys_of = lambda variant: frozenset(k for k in variant if k != "algorithm")
    declared = {}  # per method, the key sets its grid points switch (finished or not)
    for variant in runs["variant"]:
        declared.setdefault(method_of(variant), set()).add(keys_of(variant))

    def label(variant: dict) -> str:
        # a point that switches exactly what the method's other points switch one at a time: their sum
        others = [keys for keys in declared[method_of(variant)] if keys and keys != keys_of(variant)]
        return (
            ALL_SWITCHES
            if len(others) > 1 and keys_of(variant) == frozenset().union(*others)
            else switch_label(variant)
        )

    return _effects(done, method_of, label)


def _by_switch_keys(runs: pd.DataFrame, keys: list[str]):
    """The method and the switch of a grid point when ``keys`` are the switches: the protocol's value of each key
    is the first the grid gives it (the order of the runs is the grid's)."""
    protocol = {}
    for variant in runs["variant"]:
        for key in keys:
            protocol.setdefault(key, variant.get(key))

    def method_of(variant: dict) -> str:
        return SEP.join(
            [str(variant.get("algorithm", ""))]
            + [f"{k}={v}" for k, v in variant.items() if k != "algorithm" and k not in keys]
        )

    def switch_of(variant: dict) -> str:
        return SEP.join(f"{k}={variant.get(k)}" for k in keys if variant.get(k) != protocol[k])

    return method_of, switch_of


def _effects(done: pd.DataFrame, method_of, switch_of) -> dict:
    done = done.assign(method=[method_of(v) for v in done["variant"]], switch=[switch_of(v) for v in done["variant"]])
    methods = list(dict.fromkeys(done["method"]))
    switches = list(dict.fromkeys(["", *done["switch"]]))
    finished = done[done["status"] == "finished"]
    mean = finished.groupby(["switch", "method"])["final_acc"].mean() * 100
    seeds = finished.groupby(["switch", "method"]).size()
    diverged = done[done["status"] == "diverged"].groupby(["switch", "method"]).size()
    rows = []
    for switch in switches:
        cells = []
        for method in methods:
            value, base = mean.get((switch, method)), mean.get(("", method))
            failed = int(diverged.get((switch, method), 0))
            cells.append(
                None
                if value is None and not failed
                else {
                    "value": value,
                    "seeds": int(seeds.get((switch, method), 0)),
                    "diverged": failed,
                    "delta": None if value is None or base is None or switch == "" else value - base,
                }
            )
        rows.append({"switch": switch or "none (the paper's protocol)", "cells": cells})
    return {"methods": methods, "rows": rows}


def accelerator_text(record: dict | None) -> str | None:
    """A summary's ``accelerator`` record (fedrepro.run.provenance) as one line: torch, CUDA, cuDNN, the GPU and its
    driver, and the determinism switches that differ from a bit-for-bit setting; None for a summary without one."""
    if not record:
        return None
    gpu = record.get("gpu")
    flags = record.get("determinism", {})
    parts = [
        f"torch {record.get('torch')}",
        f"CUDA {record.get('cuda') or 'none'}",
        f"cuDNN {record.get('cudnn') or 'none'}",
        f"GPU {gpu['name']} (compute {gpu.get('capability')}), driver {gpu.get('driver') or 'unknown'}"
        if gpu
        else "no GPU",
    ]
    switches = [f"deterministic algorithms {'on' if flags.get('deterministic_algorithms') else 'off'}"]
    switches += [
        name
        for key, name in (
            ("cudnn_benchmark", "cuDNN benchmark on"),
            ("matmul_allow_tf32", "TF32 matmul"),
            ("cudnn_allow_tf32", "TF32 cuDNN"),
        )
        if flags.get(key)
    ]
    return ", ".join(parts) + "; " + ", ".join(switches) if flags else ", ".join(parts)


def slug(label: str) -> str:
    """A run label as a short ASCII file name: ``fedavg+ima · dir0.1`` -> ``fedavg_ima_dir0_1``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_") or "run"


def collect(manifest_path: str | Path, runs_dir: str | Path, metrics_out: str | Path, curves_out: str | Path) -> None:
    """Small files for `dvc metrics` and `dvc plots`, one per experiment and variant (method and setting):
    ``metrics_out/<experiment>/<variant>.json`` (final_acc, final_acc_std, e_ludd, seeds: one row of
    `dvc metrics show` each) and ``curves_out/<experiment>/<variant>.csv`` (per round, the mean over
    seeds: one line each in `dvc plots show`). Accuracy is a fraction in both."""
    manifest = records.read_json(manifest_path)
    runs, curve = load_runs(manifest, Path(runs_dir))
    metrics_out, curves_out = Path(metrics_out), Path(curves_out)
    for folder in (metrics_out, curves_out):
        shutil.rmtree(folder, ignore_errors=True)  # a variant no longer in the grid leaves no stale file
        folder.mkdir(parents=True)
    done = runs[runs["status"] == "finished"] if len(runs) else runs
    for (experiment, label), group in done.groupby(["experiment", "label"], sort=False):
        path = metrics_out / experiment / f"{slug(label)}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "final_acc": round(float(group["final_acc"].mean()), 6),
                    "final_acc_std": round(float(group["final_acc"].std(ddof=1)), 6) if len(group) > 1 else 0.0,
                    "e_ludd": round(float(group["e_ludd"].mean()), 6),
                    "seeds": int(len(group)),
                },
                indent=1,
            )
        )
        finished = curve[curve["run"].isin(set(group["run"]))]
        columns = [c for c in ("test_acc", "test_loss", "train_loss", "e_lud") if c in finished]
        mean = finished.groupby("round", sort=True)[columns].mean().round(6).reset_index()
        path = curves_out / experiment / f"{slug(label)}.csv"
        path.parent.mkdir(exist_ok=True)
        mean.to_csv(path, index=False)
