"""The HTML report: one self-contained page per params file (figures embedded), opened from disk.

Per experiment: a table of mean +- std over seeds, accuracy and loss curves (the band: lowest to
highest seed), partition heatmaps, and provenance; the papers' tables cell by cell beside ours. Missing runs are listed, not fatal: a partial grid
still gives a report.
"""
from __future__ import annotations

import base64
import io
import json
import math
import re
import shutil
from pathlib import Path


import numpy as np
import pandas as pd

from fedrepro import partition_records, records, tables
from fedrepro.identity import stable_hash
from fedrepro.rundir import RunDir

TEMPLATES = Path(__file__).with_name("templates")


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _file_png(path: Path) -> str | None:
    return base64.b64encode(path.read_bytes()).decode() if path.exists() else None


def load_runs(manifest: dict, runs_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per run with its summary, one row per run and round) for the manifest's runs."""
    rows, curves = [], []
    for exp_name, exp in manifest["experiments"].items():
        for run in exp["runs"]:
            run_dir = RunDir(runs_dir / run["id"])
            base = {"experiment": exp_name, "run": run["id"], "label": run["label"], "seed": run["seed"],
                    "partition": run["partition"]}
            if not run_dir.finished():
                rows.append({**base, "status": "missing", "variant": run["variant"]})
                continue
            summary = run_dir.read_summary()  # a truncated file is named
            rows.append({**base, "variant": run["variant"], "status": summary["status"],
                         "final_acc": summary["final_acc"],
                         "best_acc": summary["best_acc"], "e_ludd": summary["e_ludd"],
                         "runtime_s": summary["runtime_s"],
                         "device": f"{summary.get('host', '?')}: {summary['device']}, "
                                   f"{summary.get('cpu_threads', '?')} CPU threads"
                                   + (f", {summary['cpu_kernels']} kernels" if "cpu_kernels" in summary else ""),
                         "git_commit": summary["git_commit"], "rounds_done": summary["rounds_done"],
                         "versions": summary.get("versions", {}),
                         "accelerator": accelerator_text(summary.get("accelerator"))})
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
        table.append({
            "label": label,
            "runs": f"{len(done)}/{len(group)}",
            "diverged": int((group["status"] == "diverged").sum()),
            "final_acc": _mean_std(done.get("final_acc", pd.Series(dtype=float))),
            "best_acc": _mean_std(done.get("best_acc", pd.Series(dtype=float))),
            "e_ludd": _mean_std(done.get("e_ludd", pd.Series(dtype=float)), scale=1.0),
            "runtime": f"{done['runtime_s'].mean():.0f} s" if "runtime_s" in done and len(done) else "—",
        })
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


def switch_effects(runs: pd.DataFrame) -> dict | None:
    """For an experiment of switches (``switches: true``), each switch's effect on the final accuracy of
    each method: mean over seeds, and the difference from the method's run that switches nothing. A point
    that switches everything the method's other points switch one at a time is the row of all of them."""
    done = runs[runs["status"] == "finished"] if len(runs) else runs
    if done.empty:
        return None
    method_of = lambda variant: str(variant.get("algorithm", ""))
    keys_of = lambda variant: frozenset(k for k in variant if k != "algorithm")
    declared = {}  # per method, the key sets its grid points switch (finished or not)
    for variant in runs["variant"]:
        declared.setdefault(method_of(variant), set()).add(keys_of(variant))

    def label(variant: dict) -> str:
        # a point that switches exactly what the method's other points switch one at a time: their sum
        others = [keys for keys in declared[method_of(variant)] if keys and keys != keys_of(variant)]
        return ALL_SWITCHES if len(others) > 1 and keys_of(variant) == frozenset().union(*others) \
            else switch_label(variant)

    done = done.assign(method=[method_of(v) for v in done["variant"]], switch=[label(v) for v in done["variant"]])
    methods = list(dict.fromkeys(done["method"]))
    switches = list(dict.fromkeys(["", *done["switch"]]))
    mean = done.groupby(["switch", "method"])["final_acc"].mean() * 100
    rows = []
    for switch in switches:
        cells = []
        for method in methods:
            value, base = mean.get((switch, method)), mean.get(("", method))
            cells.append(None if value is None else
                         {"value": value, "delta": None if base is None or switch == "" else value - base})
        rows.append({"switch": switch or "none (the paper's protocol)", "cells": cells})
    return {"methods": methods, "rows": rows}


CURVES = [("test_acc", "test accuracy %", 100.0), ("test_loss", "test loss", 1.0),
          ("train_loss", "train loss (cohort mean)", 1.0)]
SEP = " · "


def short_labels(labels: list[str]) -> tuple[dict[str, str], list[str]]:
    """Labels without the parts (`` · ``-separated) that every label shares; those parts, once."""
    split = {label: label.split(SEP) for label in labels}
    common = [part for part in split[labels[0]] if all(part in parts for parts in split.values())] if labels else []
    if len(labels) < 2:
        common = []
    short = {label: SEP.join(p for p in parts if p not in common) or label for label, parts in split.items()}
    return short, common


def band_text(seeds: int) -> str:
    """What the band around a mean curve is, for the number of seeds behind it."""
    if seeds <= 1:
        return "one seed per line, no band"
    return f"mean over {seeds} seeds; band: lowest to highest seed"


SAME_CURVE = 0.002  # test accuracy within 0.2 points (20 of 10,000 test images): float rounding, not method


def coinciding(curve: pd.DataFrame, column: str = "test_acc", atol: float = SAME_CURVE) -> list[tuple[str, str]]:
    """Pairs of labels (same experiment) whose every seed has the same curve, round by round, up to
    ``atol``: methods that coincide by construction (FedNova and FedAvg when every client runs the same
    number of steps), where only floating-point rounding differs."""
    if curve.empty or column not in curve:
        return []
    series = {}
    for (label, seed), group in curve.groupby(["label", "seed"], sort=False):
        series.setdefault(label, {})[seed] = group.sort_values("round")[column].to_numpy()
    labels, pairs, taken = list(series), [], set()
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            if b in taken or set(series[a]) != set(series[b]):
                continue
            if all(len(series[a][s]) == len(series[b][s]) and np.allclose(series[a][s], series[b][s], rtol=0, atol=atol,
                                                                             equal_nan=True) for s in series[a]):
                pairs.append((a, b))
                taken.add(b)
    return pairs


def coincide_note(a: str, b: str, variants: dict[str, dict]) -> str:
    """One sentence for the page: which two lines coincide, and why when the reason is known."""
    methods = {variants.get(a, {}).get("algorithm"), variants.get(b, {}).get("algorithm")}
    why = ""
    if methods == {"fedavg", "fednova"}:
        why = (" FedNova normalises each client's update by its number of local steps; when every client runs "
               "the same number of steps, that is FedAvg exactly.")
    return (f"{b} coincides with {a}: the same test accuracy (within {SAME_CURVE * 100:g} points) in every round "
            f"of every seed; its curve is drawn dashed over {a}'s.{why}")


def collapse_points(curve: pd.DataFrame) -> pd.DataFrame:
    """One row per collapse episode (fedrepro.collapses) of each run in ``curve`` (its rows per run and round):
    run, method (when the frame has one), seed, round and accuracy (points) of the episode's lowest round."""
    from fedrepro import catalog, collapses

    rows = []
    if curve.empty or "test_acc" not in curve:
        return pd.DataFrame(columns=["run", "method", "seed", "round", "acc", "text"])
    for run, part in curve.groupby("run", sort=False):
        dataset = str(part["partition"].iloc[0]).split("-")[0] if "partition" in part else ""
        classes = catalog.DATASETS.get(dataset, {}).get("num_classes", 10)
        record = collapses.detect(part["round"].tolist(), part["test_acc"].tolist(), classes)
        for e in record["episodes"]:
            rows.append({"run": run, "method": part["method"].iloc[0] if "method" in part else None,
                         "seed": part["seed"].iloc[0] if "seed" in part else None,
                         "round": e["low_round"], "acc": e["low_acc"], "text": collapses.describe({**record, "episodes": [e]})})
    return pd.DataFrame(rows, columns=["run", "method", "seed", "round", "acc", "text"])


def curves_figure(curve: pd.DataFrame, same_as: dict[str, str] | None = None) -> str | None:
    """One row per partition (so a panel compares methods on the same data), one column per metric.

    A line that coincides with another (``same_as``: label -> the label it equals) is drawn dashed on
    top, so that neither hides the other. Legends sit outside the axes; line names drop what all
    lines of the figure share (said in the title instead)."""
    if curve.empty:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    same_as = same_as or {}
    curve = curve.assign(split=curve["partition"].str.split("-").str[1])
    curve = curve.assign(method=[label.replace(f"{SEP}{split}", "") for label, split in zip(curve["label"], curve["split"])])
    short, common = short_labels(list(dict.fromkeys(curve["method"])))
    dashed = {(split, short[m]) for label, m, split in zip(curve["label"], curve["method"], curve["split"])
              if label in same_as}
    curve = curve.assign(method=curve["method"].map(short))
    splits = list(dict.fromkeys(curve["split"]))
    seeds = int(curve.groupby("label")["seed"].nunique().max())
    methods = list(dict.fromkeys(curve["method"]))
    palette = dict(zip(methods, sns.color_palette("tab10", len(methods))))
    fig, axes = plt.subplots(len(splits), len(CURVES), figsize=(14, 3.2 * len(splits)), squeeze=False)
    collapsed: set[str] = set()
    for row, split in zip(axes, splits):
        part = curve[curve["split"] == split]
        for ax, (column, title, scale) in zip(row, CURVES):
            ax.set_title(f"{split}: {title}", fontsize=10)
            source = part.dropna(subset=[column])
            if source.empty:  # e.g. only diverged runs: nothing finite to draw
                ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes)
                continue
            source = source.assign(**{column: source[column] * scale})
            drawn = [m for m in methods if m in set(source["method"])]
            sns.lineplot(data=source, x="round", y=column, hue="method", hue_order=drawn, palette=palette,
                         legend=False, ax=ax, errorbar=("pi", 100) if seeds > 1 else None)
            for line, method in zip(ax.get_lines(), drawn):
                if (split, method) in dashed:
                    line.set_linestyle((0, (4, 3)))
                    line.set_linewidth(2.2)
                    line.set_zorder(5)
            if column == "test_acc":  # each collapse at its lowest round, in its method's colour
                for (method, _), lows in collapse_points(part).groupby(["method", "run"]):
                    collapsed.add(method)
                    ax.scatter(lows["round"], lows["acc"], marker="v", s=36, color=palette[method],
                               edgecolors="black", linewidths=0.6, zorder=6)
            ax.set_ylabel("")
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    handles = [matplotlib.lines.Line2D([], [], color=palette[m], label=m) for m in methods]
    if collapsed:
        handles.append(matplotlib.lines.Line2D([], [], color="grey", marker="v", linestyle="", markeredgecolor="black",
                                               label="collapse: a run's accuracy more than 20 points\nbelow its best "
                                                     "so far, or at chance (its lowest round)"))
    if dashed:
        handles.append(matplotlib.lines.Line2D([], [], color="grey", linestyle="--",
                                               label="dashed: same curve as another line"))
    fig.tight_layout()
    title = band_text(seeds) + (f"; all lines: {SEP.join(common)}" if common else "")
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 0.98), fontsize=9, frameon=False,
               title=title.replace("; ", "\n"), title_fontsize=9, alignment="left")
    return _png(fig)


def _nan_to_none(record: dict) -> dict:
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in record.items()}


def paper_comparisons(manifest: dict, runs_dir: Path) -> list[dict]:
    """The papers' tables whose experiments this params file runs, cell by cell beside ours.

    A table ``T`` of params/paper_results.yaml takes its runs from the experiments it lists under
    ``experiments``, or else from those named ``T`` or ``T_*`` (e.g. ``ima_table1`` from
    ``ima_table1_fmnist``), so ablation runs that happen to share a cell's settings never leak into it.
    """
    from fedrepro import claims, compute, paper
    from fedrepro.spec import tuning

    tables = paper.load_results()
    out = []
    for name, table in tables.items():
        experiments = paper.table_experiments(name, table, manifest["experiments"])
        if not experiments:
            continue
        declared = [r for e in experiments for r in manifest["experiments"][e]["runs"]]
        joined = paper.join({name: table}, paper.load_runs(runs_dir, {r["id"] for r in declared}))
        # a tuned experiment's final runs are in its scope before their tuning chose (fedrepro.spec.tuning)
        scope = [r["setting"] for r in declared] + tuning.waiting_settings(manifest, experiments)
        for cell in joined:
            cell.in_scope = any(paper.matches(setting, cell.match) for setting in scope)
        metric = table["metric"]["kind"]
        tolerance = paper.tolerance(table)
        frame = paper.table_frame(joined, name, tolerance, table.get("paper_seeds"))
        columns = [c["label"] for c in table["columns"]]
        rows = []
        for label in dict.fromkeys(frame["row"]):
            cells = frame[frame["row"] == label].set_index("column")
            rows.append({"label": label, "cells": [_nan_to_none(cells.loc[c].to_dict()) for c in columns]})
        lower = [lower_is_better(table, c.get("metric") or table["metric"]) for c in table["columns"]]
        mark_best(rows, table.get("best_among", "rows"), lower)
        compared = frame.dropna(subset=["paper", "ours"])
        # a cell whose every seed diverged was run and is outside the gap, as the verification matrix counts it
        all_diverged = int((frame["paper"].notna() & frame["ours"].isna() & (frame["diverged"] > 0)).sum())
        in_scope = frame.dropna(subset=["paper"])["in_scope"]
        noise = compared[compared["verdict"] == "seed noise only"]
        with_interval = compared["consistent"].notna()
        verdict = (f"{int(compared['within'].sum())}/{len(compared) + all_diverged} cells run so far are reproduced"
                   f" (|Δ| ≤ {tolerance:g} {table.get('unit', 'rounds' if metric == 'rounds_to_target' else 'points')})"
                   f"{f'; {all_diverged} diverged at every seed' if all_diverged else ''}. Separately, "
                   f"{int(compared.loc[with_interval, 'consistent'].astype(bool).sum())}/{int(with_interval.sum())} "
                   f"with two or more seeds are consistent within seed noise (the paper's value inside the "
                   f"{paper.CONFIDENCE:.0%} t interval){f', {len(noise)} of them only so' if len(noise) else ''}. "
                   f"{int(in_scope.sum())} of the paper's {len(in_scope)} cells are in this params file's scope.")
        counted = dict.fromkeys(runs_dir / r for cell in joined for r in cell.runs + cell.diverged)
        out.append({"name": name, "title": table["title"], "claim": table.get("claim", ""), "columns": columns,
                    "compute": compute.text(compute.of_runs(list(counted))),
                    "rows": rows, "verdict": verdict, "claims": claims.evaluate_table(name, table, joined),
                    "experiments": experiments, "tolerance": tolerance, "best_among": table.get("best_among", "rows"),
                    "unit": table.get("unit", "rounds" if metric == "rounds_to_target" else "%")})
    return out


def lower_is_better(table: dict, metric: dict) -> bool:
    """Rounds to a target, and a table that says ``better: lower`` (a loss, FedNova Fig. 5), bold the lowest."""
    return metric["kind"] == "rounds_to_target" or table.get("better", "higher") == "lower"


def mark_best(rows: list[dict], among: str, lower_is_better: list[bool]) -> None:
    """Set each cell's ``best_ours`` and ``best_paper``: the best number of its group, as a paper bolds it.

    A group is a column's cells (``among`` = rows: methods as rows) or a row's (``among`` = columns);
    higher is better except in the columns ``lower_is_better`` names (rounds to a target, a loss). Ties are all
    best; a group with fewer than two numbers has no best."""
    width = len(lower_is_better)
    if among == "rows":
        groups = [[(r, c) for r in range(len(rows))] for c in range(width)]
    else:
        groups = [[(r, c) for c in range(width)] for r in range(len(rows))]
    for group in groups:
        for side in ("ours", "paper"):
            scores = {}
            for r, c in group:
                cell = rows[r]["cells"][c]
                cell[f"best_{side}"] = False
                value = cell.get(side)
                if value is not None and not math.isnan(value):
                    scores[(r, c)] = -value if lower_is_better[c] else value
            if len(scores) >= 2:
                top = max(scores.values())
                for (r, c), score in scores.items():
                    rows[r]["cells"][c][f"best_{side}"] = score == top


def ablation_figure(runs: pd.DataFrame) -> str | None:
    """Final accuracy against every numeric grid axis with three or more values (α, window P,
    start round, participation, local epochs, ...), one line per value of the other axes."""
    done = runs[runs["status"] == "finished"] if len(runs) else runs
    if done.empty:
        return None
    variants = pd.DataFrame(list(done["variant"]), index=done.index)
    axes = [c for c in variants if c != "algorithm" and pd.api.types.is_numeric_dtype(variants[c])
            and variants[c].nunique() >= 3]
    if not axes:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, axs = plt.subplots(1, len(axes), figsize=(5.5 * len(axes), 3.8), squeeze=False)
    for ax, axis in zip(axs[0], axes):
        others = [c for c in variants if c != axis]
        lines = [" · ".join(str(v) if k == "algorithm" else f"{k}={v}" for k, v in row.items())
                 for row in variants[others].to_dict("records")] if others else "all"
        if not isinstance(lines, str):
            short, common = short_labels(list(dict.fromkeys(lines)))
            lines = [short[line] for line in lines]
        else:
            common = []
        frame = done.assign(value=variants[axis], acc=done["final_acc"] * 100, line=lines)
        seeds = int(frame.groupby(["line", "value"])["seed"].nunique().max())
        sns.lineplot(data=frame, x="value", y="acc", hue="line", marker="o", ax=ax,
                     errorbar=("pi", 100) if seeds > 1 else None)
        ax.set_xlabel(axis)
        ax.set_ylabel("final accuracy % (last 10 rounds)")
        ax.set_title(f"ablation over {axis}", fontsize=10)
        if frame["value"].min() > 0 and frame["value"].max() / frame["value"].min() >= 20:
            ax.set_xscale("log")
        title = band_text(seeds) + (f"\nall lines: {SEP.join(common)}" if common else "")
        ax.legend(fontsize=7, title=title, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return _png(fig)


def tuning_sections(manifest: dict, experiment: str) -> list[dict]:
    """The tunings (fedrepro.spec.tuning) whose final runs are this experiment's: per candidate the criterion on
    the validation split (the tuning curve), and the chosen value; a tuning not chosen yet says so."""
    out = []
    for tid, entry in manifest.get("tunings", {}).items():
        if experiment not in entry["experiments"]:
            continue
        choice = entry.get("choice")
        candidates = choice["candidates"] if choice else entry["selection"]["candidates"]
        text = lambda v: "—" if v is None else f"{v:.4f}"
        rows = [{"label": c["label"], "value": text(c.get("value")), "per_seed": [text(v) for v in c.get("values", [])],
                 "statuses": c.get("statuses", []), "chosen": bool(choice) and i == choice["chosen_index"]}
                for i, c in enumerate(candidates)]
        out.append({"id": tid, "label": entry["label"], "criterion": entry["criterion"], "seeds": entry["seeds"],
                    "validation": entry["validation"], "without": entry["without"],
                    "chosen": choice["chosen_label"] if choice else None, "rows": rows,
                    "png": tuning_figure(entry, choice) if choice else None})
    return out


def tuning_figure(entry: dict, choice: dict) -> str | None:
    """The criterion per candidate: against the value where one numeric axis is tuned (a log axis where the
    values span more than a decade), else per candidate label; diverged candidates are marked at the bottom."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cands = choice["candidates"]
    axes = list(entry["grid"])
    numeric = len(axes) == 1 and axes[0] != "setting" and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in entry["grid"][axes[0]])
    xs = [float(v) for v in entry["grid"][axes[0]]] if numeric else list(range(len(cands)))
    fig, ax = plt.subplots(figsize=(4.2, 2.8))
    ok = [(x, c["value"]) for x, c in zip(xs, cands) if c["value"] is not None]
    if ok:
        ax.plot(*zip(*sorted(ok)), "o-", color="tab:blue")
        low = min(v for _, v in ok)
        bad = [x for x, c in zip(xs, cands) if c["value"] is None]
        ax.plot(bad, [low] * len(bad), "x", color="tab:red", label="diverged") if bad else None
        best = cands[choice["chosen_index"]]
        ax.plot([xs[choice["chosen_index"]]], [best["value"]], "*", ms=14, color="tab:orange", label="chosen")
        ax.legend(fontsize=7)
    if numeric:
        positive = [x for x in xs if x > 0]
        if positive and len(positive) == len(xs) and max(positive) / min(positive) > 20:
            ax.set_xscale("log")
        ax.set_xlabel(axes[0])
    else:
        ax.set_xticks(xs, [c["label"] for c in cands], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(choice["criterion"].replace("_", " "), fontsize=8)
    ax.set_title(entry["label"], fontsize=8)
    return _png(fig)


def plain(value) -> str:
    """A grid value or setting as text a person reads: ``kind=dirichlet, alpha=0.1``, lists joined by
    ``; ``, never a Python repr."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={plain(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "; ".join(plain(v) for v in value) if any(isinstance(v, dict) for v in value) \
            else ", ".join(plain(v) for v in value)
    return str(value)


def sizes_text(sizes: dict) -> str:
    """A partition's client sizes ({min, max, mean}) as a phrase."""
    if not sizes:
        return ""
    if sizes.get("min") == sizes.get("max"):
        return f"every client holds {sizes['min']:,} samples"
    return f"client sizes {sizes['min']:,} to {sizes['max']:,} samples (mean {sizes['mean']:,.0f})"


def accelerator_text(record: dict | None) -> str | None:
    """A summary's ``accelerator`` record (fedrepro.provenance) as one line: torch, CUDA, cuDNN, the GPU and its
    driver, and the determinism switches that differ from a bit-for-bit setting; None for a summary without one."""
    if not record:
        return None
    gpu = record.get("gpu")
    flags = record.get("determinism", {})
    parts = [f"torch {record.get('torch')}", f"CUDA {record.get('cuda') or 'none'}",
             f"cuDNN {record.get('cudnn') or 'none'}",
             f"GPU {gpu['name']} (compute {gpu.get('capability')}), driver {gpu.get('driver') or 'unknown'}" if gpu
             else "no GPU"]
    switches = [f"deterministic algorithms {'on' if flags.get('deterministic_algorithms') else 'off'}"]
    switches += [name for key, name in (("cudnn_benchmark", "cuDNN benchmark on"),
                                        ("matmul_allow_tf32", "TF32 matmul"), ("cudnn_allow_tf32", "TF32 cuDNN"))
                 if flags.get(key)]
    return ", ".join(parts) + "; " + ", ".join(switches) if flags else ", ".join(parts)


def provenance_rows(manifest: dict, finished: pd.DataFrame, total: int) -> list[tuple[str, str]]:
    """(what, value) rows of the provenance table, only those with a value."""
    column = lambda name: sorted(set(finished[name].dropna())) if name in finished else []
    versions = finished["versions"].iloc[0] if "versions" in finished and len(finished) else {}
    kept = manifest.get("evidence")
    rows = [
        ("command", manifest.get("command", "")),
        ("params files", ", ".join(manifest.get("configfiles", []))),
        ("params hash", stable_hash(manifest["experiments"])),
        ("records", f"evidence folder {kept['name']}: {kept['runs_kept']} of {kept['runs_declared']} runs kept on "
                    f"{kept['kept']}; this page was rebuilt from it" if kept else ""),
        ("git commit(s) of the runs", " ".join(column("git_commit"))),
        ("machine(s): host, device", ", ".join(column("device"))),
        ("package versions", ", ".join(f"{k} {v}" for k, v in versions.items())),
        ("GPU stack and determinism switches", " | ".join(column("accelerator"))),
        ("total training time", f"{finished['runtime_s'].sum():.0f} s over {len(finished)} of {total} runs"
         if "runtime_s" in finished and len(finished) else ""),
    ]
    return [(what, value) for what, value in rows if value]


def write_figures(sections: list[dict], folder: Path) -> list[Path]:
    """The page's figures as files, ``<experiment>.<kind>.png`` (kind: curves, ablation,
    partition-<id>), for ``snakemake --report`` to pack with their captions."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for section in sections:
        figures = {"curves": section["curves"], "ablation": section["ablation"]}
        figures.update({f"partition-{p['id']}": p["png"] for p in section["partitions"]})
        for kind, png in figures.items():
            if png:
                path = folder / f"{section['name']}.{kind}.png"
                path.write_bytes(base64.b64decode(png))
                written.append(path)
    return written


def _collapse_list(curve: pd.DataFrame) -> list[dict]:
    """The section's collapsed runs, one entry per run: its id and every episode in words."""
    points = collapse_points(curve)
    return [{"run": run, "text": "; ".join(part["text"])} for run, part in points.groupby("run", sort=True)]


def build(manifest_path: str | Path, runs_dir: str | Path, partitions_dir: str | Path, out: str | Path,
          figures_dir: str | Path | None = None, paper_figures_dir: str | Path | None = None) -> Path:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    manifest = records.read_json(manifest_path)
    runs_dir, partitions_dir, out = Path(runs_dir), Path(partitions_dir), Path(out)
    runs, curve = load_runs(manifest, runs_dir)
    sections = []
    for exp_name, exp in manifest["experiments"].items():
        exp_runs = runs[runs["experiment"] == exp_name] if len(runs) else runs
        exp_curve = curve[curve["experiment"] == exp_name] if len(curve) else curve
        partitions = []
        for pid in dict.fromkeys(r["partition"] for r in exp["runs"]):
            info_path = partitions_dir / pid / "partition.json"
            info = json.loads(info_path.read_text()) if info_path.exists() else {}
            stat = partition_records.of_folder(partitions_dir / pid)
            partitions.append({"id": pid, "png": _file_png(partitions_dir / pid / "heatmap.png"),
                               "hash": info.get("content_hash", "missing"), "sizes": sizes_text(info.get("sizes", {})),
                               "heterogeneity": partition_records.caption(stat) if stat else ""})
        done = exp_runs[exp_runs["status"] != "missing"] if len(exp_runs) else exp_runs
        variants = {r["label"]: r["variant"] for r in exp["runs"]}
        pairs = coinciding(exp_curve)
        same_as = {b: a for a, b in pairs}
        table = summary_table(exp_runs) if len(exp_runs) else []
        for row in table:
            row["same_as"] = same_as.get(row["label"])
        sections.append({
            "name": exp_name, "title": exp["title"], "description": exp["description"],
            "grid": exp["grid"], "table": table,
            "curves": curves_figure(exp_curve, same_as), "ablation": ablation_figure(exp_runs) if len(exp_runs) else None,
            "coinciding": [coincide_note(a, b, variants) for a, b in pairs],
            "partitions": partitions,
            "tunings": tuning_sections(manifest, exp_name),
            "missing": [r for r in exp_runs.to_dict("records") if r["status"] == "missing"],
            "diverged": [r["run"] for r in exp_runs.to_dict("records") if r["status"] == "diverged"],
            "collapsed": _collapse_list(exp_curve),
            "runtime_total": float(done["runtime_s"].sum()) if "runtime_s" in done else 0.0,
            "switches": switch_effects(exp_runs) if exp.get("switches") and len(exp_runs) else None,
        })
    finished = runs[runs["status"] != "missing"] if len(runs) else runs
    provenance = provenance_rows(manifest, finished, len(runs))
    others = sorted(p.name for p in out.parent.glob("*.html") if p.name != out.name)
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]))
    env.filters["num"] = tables.number  # the exports print numbers as the page does
    comparisons = paper_comparisons(manifest, runs_dir)
    # beside the page, each table as CSV, LaTeX and Markdown, which the page links
    exports = tables.write(comparisons, tables_folder(out))
    for comparison in comparisons:
        comparison["exports"] = exports[comparison["name"]]
    env.filters["plain"] = plain
    html = env.get_template("report.html.j2").render(manifest=manifest, sections=sections, provenance=provenance,
                                                     runs_done=int(len(finished)), runs_total=int(len(runs)),
                                                     comparisons=comparisons,
                                                     paper_figures=paper_figures(paper_figures_dir, figures_dir),
                                                     others=others, page=out.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html)
    if figures_dir:
        write_figures(sections, Path(figures_dir))
    return out


def tables_folder(page: str | Path) -> Path:
    """Where the page's tables go: ``reports/<name>_tables`` beside ``reports/<name>.html``."""
    page = Path(page)
    return page.with_name(f"{page.stem}_tables")


def slug(label: str) -> str:
    """A run label as a short ASCII file name: ``fedavg+ima · dir0.1`` -> ``fedavg_ima_dir0_1``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_") or "run"


def paper_figures(folder: str | Path | None, figures_dir: str | Path | None) -> list[dict]:
    """The papers' analysis figures (fedrepro.figures) with their captions, copied into the page's
    figures folder as ``paper.<name>.png`` so that `snakemake --report` packs them too."""
    if not folder or not Path(folder).exists():
        return []
    from fedrepro import figures

    records = []
    for record in figures.load_captions(folder):
        png = Path(folder) / record["image"]
        if not png.exists():
            continue
        if figures_dir:
            Path(figures_dir).mkdir(parents=True, exist_ok=True)
            (Path(figures_dir) / f"paper.{record['name']}.png").write_bytes(png.read_bytes())
        records.append({**record, "png": _file_png(png)})
    return records


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
        path.write_text(json.dumps({
            "final_acc": round(float(group["final_acc"].mean()), 6),
            "final_acc_std": round(float(group["final_acc"].std(ddof=1)), 6) if len(group) > 1 else 0.0,
            "e_ludd": round(float(group["e_ludd"].mean()), 6), "seeds": int(len(group))}, indent=1))
        finished = curve[curve["run"].isin(set(group["run"]))]
        columns = [c for c in ("test_acc", "test_loss", "train_loss", "e_lud") if c in finished]
        mean = finished.groupby("round", sort=True)[columns].mean().round(6).reset_index()
        path = curves_out / experiment / f"{slug(label)}.csv"
        path.parent.mkdir(exist_ok=True)
        mean.to_csv(path, index=False)
