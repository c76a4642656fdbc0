"""A method of the user's own (``add_method``, fedrepro.configure.overlay) against each table's methods.

Per experiment the added method ran in, and per cell of it (a grid point without its method and seed: a
partition, a dataset, ...), every method's number: ours (mean ± std over seeds) and, where a paper table of
params/paper_results.yaml has the cell, the paper's. The number is the paper table's metric where the
experiment belongs to one (``paper.run_metric``: e.g. the mean test accuracy of the last 10 rounds), else the
summary's final accuracy (the mean of the last 10 evaluated rounds), in percent.

The added method is compared with each baseline on the same seeds, which in a grid means the same partition
draws and the same sampled clients in every round: the difference is paired, seed by seed. The test
(``TEST``) is a two-sided paired t-test over those seeds at level ``ALPHA``: a win where the mean paired
difference favours the added method and p < ALPHA, a loss where it favours the baseline and p < ALPHA, a tie
otherwise (fewer than two paired seeds included: no test, a tie). Over all cells, the performance profile
(Dolan and Moré, 2002) gives, for each method and each tau, the share of the cells it ran where its number is
within tau points of the best method's of that cell.
"""

from __future__ import annotations

import math
from pathlib import Path

from fedrepro.report import paper
from fedrepro.report.frames import SEP

TEST = "two-sided paired t-test over seeds (the same partition draws and cohorts)"
ALPHA = 0.05
FINAL_ACC = {"kind": "final_acc", "scale": 100}  # an experiment no paper table holds: the summary's final accuracy


def _method(setting: dict) -> str:
    return "+".join([setting["algorithm"], *setting["plugins"]])


def _method_keys(grid: dict) -> set[str]:
    """The variant keys the experiment's method axis sets (the algorithm, and what a ``setting`` entry sets with
    it, such as FedAdam's server lr)."""
    keys = {"algorithm"}
    if not (isinstance(grid.get("algorithm"), list) and len(grid["algorithm"]) > 1):
        for entry in grid.get("setting") or []:
            keys |= set(_flat(entry)) if isinstance(entry, dict) else set()
    return keys


def _flat(entry: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in entry.items():
        name = f"{prefix}.{key}" if prefix else key
        out.update(_flat(value, name) if isinstance(value, dict) else {name: value})
    return out


def _metric(experiment: str, tables: dict) -> tuple[dict, bool, list]:
    """(the metric, whether lower is better, the paper's cells) of the table that holds the experiment."""
    for name, table in tables.items():
        if paper.table_experiments(name, table, [experiment]):
            return table["metric"], paper.lower_is_better(table, table["metric"]), paper.cells({name: table})
    return FINAL_ACC, False, []


def _value(metric: dict, run: dict) -> float | None:
    if metric is FINAL_ACC:
        acc = run["summary"].get("final_acc")
        return None if run["summary"].get("status") != "finished" or acc is None else 100 * acc
    return paper.run_metric(metric, run["summary"], run["metrics"])


def paired(ours: dict[int, float], theirs: dict[int, float], lower: bool) -> dict:
    """The paired comparison of two methods in one cell: per-seed values by seed; positive differences favour
    ``ours``."""
    from scipy import stats

    seeds = sorted(set(ours) & set(theirs))
    diffs = [(theirs[s] - ours[s]) if lower else (ours[s] - theirs[s]) for s in seeds]
    out = {"seeds": len(seeds), "mean_diff": sum(diffs) / len(diffs) if diffs else None, "p": None, "outcome": "tie"}
    if len(diffs) >= 2 and any(d != diffs[0] for d in diffs):
        out["p"] = float(stats.ttest_rel([ours[s] for s in seeds], [theirs[s] for s in seeds]).pvalue)
    elif len(diffs) >= 2 and diffs[0] != 0:  # the same nonzero difference at every seed: no spread, p -> 0
        out["p"] = 0.0
    if out["p"] is not None and out["p"] < ALPHA:
        out["outcome"] = "win" if out["mean_diff"] > 0 else "loss"
    return out


def comparisons(manifest: dict, runs_dir: str | Path) -> dict | None:
    """The report's section for the added methods: per experiment its cells, and the performance profile; None
    when the manifest adds no method."""
    added = manifest.get("added_methods")
    if not added:
        return None
    tables = paper.load_results()
    ids = {r["id"] for exp in manifest["experiments"].values() for r in exp["runs"]}
    runs = {r["id"]: r for r in paper.load_runs(runs_dir, ids)}
    experiments, profile_cells = [], []
    for name, exp in manifest["experiments"].items():
        metric, lower, paper_cells = _metric(name, tables)
        method_keys = _method_keys(exp["grid"])
        cells: dict[str, dict[str, dict[int, float]]] = {}  # cell -> method -> seed -> value
        settings: dict[tuple[str, str], dict] = {}
        for entry in exp["runs"]:
            method = _method(entry["setting"])
            cell = SEP.join(f"{k}={v}" for k, v in entry["variant"].items() if k not in method_keys) or "all"
            settings[(cell, method)] = entry["setting"]
            run = runs.get(entry["id"])
            value = _value(metric, run) if run else None
            methods = cells.setdefault(cell, {})
            methods.setdefault(method, {})
            if value is not None and math.isfinite(value):
                methods[method][entry["seed"]] = value
        mine = [m for m in added if any(m in methods for methods in cells.values())]
        if not mine:
            continue
        rows = []
        for cell, methods in cells.items():
            for method, values in methods.items():
                published = [c for c in paper_cells if paper.matches(settings[(cell, method)], c.match)]
                rows.append(
                    {
                        "cell": cell,
                        "method": method,
                        "added": method in added,
                        "seeds": len(values),
                        "ours": _mean(values),
                        "ours_std": _std(values),
                        "paper": published[0].value if published else None,
                    }
                )
        versus = []
        for new in mine:
            baselines = dict.fromkeys(m for methods in cells.values() for m in methods if m not in added)
            for base in baselines:
                pairs = [
                    (cell, paired(methods[new], methods[base], lower))
                    for cell, methods in cells.items()
                    if new in methods and base in methods
                ]
                tally = {k: sum(1 for _, p in pairs if p["outcome"] == k) for k in ("win", "tie", "loss")}
                versus.append({"method": new, "baseline": base, "cells": [{"cell": c, **p} for c, p in pairs], **tally})
        for methods in cells.values():
            means = {m: _mean(v) for m, v in methods.items() if v}
            if any(m in means for m in mine) and len(means) > 1:
                profile_cells.append({m: (-v if lower else v) for m, v in means.items()})
        experiments.append(
            {
                "name": name,
                "title": exp["title"],
                "metric": metric.get("kind"),
                "lower": lower,
                "rows": rows,
                "versus": versus,
            }
        )
    return {
        "added": added,
        "test": TEST,
        "alpha": ALPHA,
        "experiments": experiments,
        "profile": profile(profile_cells),
        "figure": profile_figure(profile(profile_cells)),
    }


def _mean(values: dict) -> float | None:
    return sum(values.values()) / len(values) if values else None


def _std(values: dict) -> float | None:
    if len(values) < 2:
        return None
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values.values()) / (len(values) - 1))


def profile(cells: list[dict[str, float]]) -> dict:
    """Per method, its gaps to the best of each cell it ran (points, >= 0; scores are higher-is-better), sorted:
    the share of them <= tau is the method's performance profile at tau."""
    gaps: dict[str, list[float]] = {}
    for scores in cells:
        best = max(scores.values())
        for method, score in scores.items():
            gaps.setdefault(method, []).append(best - score)
    return {method: sorted(values) for method, values in gaps.items()}


def within(gaps: list[float], tau: float) -> float:
    """The share of a method's cells where it is within ``tau`` of the best."""
    return sum(1 for g in gaps if g <= tau) / len(gaps) if gaps else 0.0


def profile_figure(gaps: dict[str, list[float]]) -> str | None:
    """The performance profile as a step plot (base64 PNG): tau in points on x, the share of cells on y."""
    if not gaps:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedrepro.report.plots import _png

    top = max([g for values in gaps.values() for g in values] + [1.0])
    taus = [top * i / 200 for i in range(201)]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for method, values in sorted(gaps.items()):
        ax.step(
            taus,
            [within(values, t) for t in taus],
            where="post",
            label=f"{method} ({len(values)} cell{'' if len(values) == 1 else 's'})",
        )
    ax.set_xlabel("tau: points behind the best method of the cell")
    ax.set_ylabel("share of cells within tau")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7, loc="lower right")
    return _png(fig)
