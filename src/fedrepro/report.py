"""The HTML report: one self-contained page per params file (figures embedded), opened from disk.

Per experiment: a table of mean +- std over seeds, accuracy and loss curves with 95% bands over
seeds, partition heatmaps, and provenance. Missing runs are listed, not fatal: a partial grid
still gives a report.
"""
from __future__ import annotations

import base64
import io
import json
import math
from pathlib import Path


import pandas as pd

from fedrepro.config import stable_hash

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
            run_dir = runs_dir / run["id"]
            base = {"experiment": exp_name, "run": run["id"], "label": run["label"], "seed": run["seed"],
                    "partition": run["partition"]}
            summary_path = run_dir / "summary.json"
            if not summary_path.exists():
                rows.append({**base, "status": "missing", "variant": run["variant"]})
                continue
            summary = json.loads(summary_path.read_text())
            rows.append({**base, "variant": run["variant"], "status": summary["status"],
                         "final_acc": summary["final_acc"],
                         "best_acc": summary["best_acc"], "e_ludd": summary["e_ludd"],
                         "runtime_s": summary["runtime_s"],
                         "device": f"{summary.get('host', '?')}: {summary['device']}, "
                                   f"{summary.get('cpu_threads', '?')} CPU threads",
                         "git_commit": summary["git_commit"], "rounds_done": summary["rounds_done"],
                         "versions": summary.get("versions", {})})
            metrics = pd.read_csv(run_dir / "metrics.csv")
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


CURVES = [("test_acc", "test accuracy"), ("test_loss", "test loss"), ("train_loss", "train loss (cohort mean)")]


def curves_figure(curve: pd.DataFrame) -> str | None:
    """One row per partition (so a panel compares methods on the same data), one column per metric."""
    if curve.empty:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    curve = curve.assign(split=curve["partition"].str.split("-").str[1])
    curve = curve.assign(method=[label.replace(f" · {split}", "") for label, split in zip(curve["label"], curve["split"])])
    splits = list(dict.fromkeys(curve["split"]))
    palette = dict(zip(dict.fromkeys(curve["method"]), sns.color_palette("tab10", curve["method"].nunique())))
    fig, axes = plt.subplots(len(splits), len(CURVES), figsize=(15, 3.4 * len(splits)), squeeze=False)
    handles, labels = [], []
    for row, split in zip(axes, splits):
        part = curve[curve["split"] == split]
        for ax, (column, title) in zip(row, CURVES):
            ax.set_title(f"{split}: {title}", fontsize=10)
            source = part.dropna(subset=[column])
            if source.empty:  # e.g. only diverged runs: nothing finite to draw
                ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes)
                continue
            sns.lineplot(data=source, x="round", y=column, hue="method", palette=palette, errorbar=("ci", 95),
                         ax=ax, legend=not labels)
            ax.set_ylabel("")
            if not labels and ax.get_legend() is not None:
                handles, labels = ax.get_legend_handles_labels()
                ax.get_legend().remove()
    fig.tight_layout(rect=(0, 0, 1, 0.95 if len(splits) == 1 else 0.97))
    if labels:
        fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 6), fontsize=9, frameon=False,
                   title="mean over seeds with 95% confidence band", title_fontsize=9)
    return _png(fig)


def _nan_to_none(record: dict) -> dict:
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in record.items()}


def paper_comparisons(manifest: dict, runs_dir: Path) -> list[dict]:
    """The papers' tables whose experiments this params file runs, cell by cell beside ours.

    A table ``T`` of params/paper_results.yaml takes its runs from the experiments named ``T`` or
    ``T_*`` (e.g. ``ima_table1`` from ``ima_table1_fmnist``), so ablation runs that happen to share
    a cell's settings never leak into it.
    """
    from fedrepro import claims, paper

    tables = paper.load_results()
    out = []
    for name, table in tables.items():
        experiments = [e for e in manifest["experiments"] if e == name or e.startswith(name + "_")]
        if not experiments:
            continue
        ids = {r["id"] for e in experiments for r in manifest["experiments"][e]["runs"]}
        joined = paper.join({name: table}, paper.load_runs(runs_dir, ids))
        metric = table["metric"]["kind"]
        tolerance = table.get("tolerance", 20.0 if metric == "rounds_to_target" else 1.0)
        frame = paper.table_frame(joined, name, tolerance)
        columns = [c["label"] for c in table["columns"]]
        rows = []
        for label in dict.fromkeys(frame["row"]):
            cells = frame[frame["row"] == label].set_index("column")
            rows.append({"label": label, "cells": [_nan_to_none(cells.loc[c].to_dict()) for c in columns]})
        compared = frame.dropna(subset=["paper", "ours"])
        verdict = f"Δ within ±{tolerance:g}: {int(compared['within'].sum())}/{len(compared)} cells reproduced so far"
        out.append({"name": name, "title": table["title"], "claim": table.get("claim", ""), "columns": columns,
                    "rows": rows, "verdict": verdict, "claims": claims.evaluate_table(name, table, joined),
                    "experiments": experiments, "tolerance": tolerance,
                    "unit": "rounds" if metric == "rounds_to_target" else "%"})
    return out


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
        frame = done.assign(value=variants[axis], acc=done["final_acc"] * 100, line=lines)
        sns.lineplot(data=frame, x="value", y="acc", hue="line", marker="o", errorbar=("ci", 95), ax=ax)
        ax.set_xlabel(axis)
        ax.set_ylabel("final accuracy % (last 10 rounds)")
        ax.set_title(f"ablation over {axis} (95% band over seeds)", fontsize=10)
        if frame["value"].min() > 0 and frame["value"].max() / frame["value"].min() >= 20:
            ax.set_xscale("log")
        ax.legend(fontsize=7, title=None)
    fig.tight_layout()
    return _png(fig)


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


def build(manifest_path: str | Path, runs_dir: str | Path, partitions_dir: str | Path, out: str | Path,
          figures_dir: str | Path | None = None, paper_figures_dir: str | Path | None = None) -> Path:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    manifest = json.loads(Path(manifest_path).read_text())
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
            partitions.append({"id": pid, "png": _file_png(partitions_dir / pid / "heatmap.png"),
                               "hash": info.get("content_hash", "missing"), "sizes": info.get("sizes", {})})
        done = exp_runs[exp_runs["status"] != "missing"] if len(exp_runs) else exp_runs
        sections.append({
            "name": exp_name, "title": exp["title"], "description": exp["description"],
            "grid": exp["grid"], "table": summary_table(exp_runs) if len(exp_runs) else [],
            "curves": curves_figure(exp_curve), "ablation": ablation_figure(exp_runs) if len(exp_runs) else None,
            "partitions": partitions,
            "missing": [r for r in exp_runs.to_dict("records") if r["status"] == "missing"],
            "diverged": [r["run"] for r in exp_runs.to_dict("records") if r["status"] == "diverged"],
            "runtime_total": float(done["runtime_s"].sum()) if "runtime_s" in done else 0.0,
        })
    finished = runs[runs["status"] != "missing"] if len(runs) else runs
    provenance = {
        "command": manifest.get("command", ""),
        "configfiles": ", ".join(manifest.get("configfiles", [])),
        "params_hash": stable_hash(manifest["experiments"]),
        "git_commits": sorted(set(finished.get("git_commit", pd.Series(dtype=str)).dropna())),
        "devices": sorted(set(finished.get("device", pd.Series(dtype=str)).dropna())),
        "versions": finished["versions"].iloc[0] if "versions" in finished and len(finished) else {},
        "runtime_total_s": float(finished["runtime_s"].sum()) if "runtime_s" in finished else 0.0,
        "runs_done": int(len(finished)), "runs_total": int(len(runs)),
    }
    others = sorted(p.name for p in out.parent.glob("*.html") if p.name != out.name)
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]))
    env.filters["num"] = lambda v: "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"
    comparisons = paper_comparisons(manifest, runs_dir)
    html = env.get_template("report.html.j2").render(manifest=manifest, sections=sections, provenance=provenance,
                                                     comparisons=comparisons,
                                                     paper_figures=paper_figures(paper_figures_dir, figures_dir),
                                                     others=others, page=out.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html)
    if figures_dir:
        write_figures(sections, Path(figures_dir))
    return out





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
    """Two small files for `dvc metrics` and `dvc plots`: per-variant summary numbers and all curves."""
    manifest = json.loads(Path(manifest_path).read_text())
    runs, curve = load_runs(manifest, Path(runs_dir))
    metrics: dict = {}
    done = runs[runs["status"] == "finished"] if len(runs) else runs
    for (experiment, label), group in done.groupby(["experiment", "label"], sort=False):
        metrics.setdefault(experiment, {})[label] = {
            "final_acc": round(float(group["final_acc"].mean()), 6),
            "final_acc_std": round(float(group["final_acc"].std(ddof=1)), 6) if len(group) > 1 else 0.0,
            "e_ludd": round(float(group["e_ludd"].mean()), 6), "seeds": int(len(group))}
    Path(metrics_out).parent.mkdir(parents=True, exist_ok=True)
    Path(metrics_out).write_text(json.dumps(metrics, indent=1, sort_keys=True))
    columns = ["experiment", "label", "seed", "round", "test_acc", "test_loss", "train_loss", "e_lud"]
    frame = curve[[c for c in columns if c in curve]] if len(curve) else pd.DataFrame(columns=columns)
    Path(curves_out).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(curves_out, index=False)
