"""The HTML report: one self-contained page per params file (figures embedded), opened from disk.

Per experiment: a table of mean +- std over seeds, accuracy and loss curves (the band: lowest to
highest seed), partition heatmaps, and provenance; the papers' tables cell by cell beside ours. Missing runs are
listed, not fatal: a partial grid still gives a report.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import pandas as pd

from fedrepro import records
from fedrepro.identity import stable_hash
from fedrepro.partitions import records as partition_records
from fedrepro.report import tables, versus
from fedrepro.report.frames import load_runs, summary_table, switch_effects
from fedrepro.report.plots import (
    ablation_figure,
    coincide_note,
    coinciding,
    collapse_points,
    curves_figure,
    tuning_figure,
)

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def _file_png(path: Path) -> str | None:
    return base64.b64encode(path.read_bytes()).decode() if path.exists() else None


def _nan_to_none(record: dict) -> dict:
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in record.items()}


def paper_comparisons(manifest: dict, runs_dir: Path) -> list[dict]:
    """The papers' tables whose experiments this params file runs, cell by cell beside ours.

    A table ``T`` of params/paper_results.yaml takes its runs from the experiments it lists under
    ``experiments``, or else from those named ``T`` or ``T_*`` (e.g. ``ima_table1`` from
    ``ima_table1_fmnist``), so ablation runs that happen to share a cell's settings never leak into it.
    """
    from fedrepro.configure import tuning
    from fedrepro.report import claims, compute, paper

    tables = paper.load_results()
    out = []
    for name, table in tables.items():
        experiments = paper.table_experiments(name, table, manifest["experiments"])
        if not experiments:
            continue
        declared = [r for e in experiments for r in manifest["experiments"][e]["runs"]]
        joined = paper.join({name: table}, paper.load_runs(runs_dir, {r["id"] for r in declared}))
        # a tuned experiment's final runs are in its scope before their tuning chose (fedrepro.configure.tuning)
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
        spread = compared[compared["verdict"] == "through our spread"]  # counted apart (paper.through_spread)
        with_interval = compared["consistent"].notna()
        verdict = (
            f"{int(compared['within'].sum())}/{len(compared) + all_diverged} cells run so far are reproduced"
            f" (|Δ| ≤ {tolerance:g} {table.get('unit', 'rounds' if metric == 'rounds_to_target' else 'points')})"
            f"{f'; {all_diverged} diverged at every seed' if all_diverged else ''}. Separately, "
            f"{int(compared.loc[with_interval, 'consistent'].astype(bool).sum()) - len(spread)}/"
            f"{int(with_interval.sum())} with two or more seeds are consistent within seed noise (the paper's "
            f"value inside the {paper.CONFIDENCE:.0%} t interval)"
            f"{f', {len(noise)} of them only so' if len(noise) else ''}"
            f"{f'; counted apart, {len(spread)} more only through our spread' if len(spread) else ''}"
            f"{f' ({paper.THROUGH_SPREAD})' if len(spread) else ''}. "
            f"{int(in_scope.sum())} of the paper's {len(in_scope)} cells are in this params file's scope."
        )
        counted = dict.fromkeys(runs_dir / r for cell in joined for r in cell.runs + cell.diverged)
        out.append(
            {
                "name": name,
                "title": table["title"],
                "claim": table.get("claim", ""),
                "columns": columns,
                "compute": compute.text(compute.of_runs(list(counted))),
                "rows": rows,
                "verdict": verdict,
                "claims": claims.evaluate_table(name, table, joined),
                "experiments": experiments,
                "tolerance": tolerance,
                "best_among": table.get("best_among", "rows"),
                "unit": table.get("unit", "rounds" if metric == "rounds_to_target" else "%"),
            }
        )
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


def tuning_sections(manifest: dict, experiment: str) -> list[dict]:
    """The tunings (fedrepro.configure.tuning) whose final runs are this experiment's: per candidate the criterion on
    the validation split (the tuning curve), and the chosen value; a tuning not chosen yet says so."""
    out = []
    for tid, entry in manifest.get("tunings", {}).items():
        if experiment not in entry["experiments"]:
            continue
        choice = entry.get("choice")
        candidates = choice["candidates"] if choice else entry["selection"]["candidates"]
        text = lambda v: "—" if v is None else f"{v:.4f}"
        rows = [
            {
                "label": c["label"],
                "value": text(c.get("value")),
                "per_seed": [text(v) for v in c.get("values", [])],
                "statuses": c.get("statuses", []),
                "chosen": bool(choice) and i == choice["chosen_index"],
            }
            for i, c in enumerate(candidates)
        ]
        out.append(
            {
                "id": tid,
                "label": entry["label"],
                "criterion": entry["criterion"],
                "seeds": entry["seeds"],
                "validation": entry["validation"],
                "without": entry["without"],
                "chosen": choice["chosen_label"] if choice else None,
                "rows": rows,
                "png": tuning_figure(entry, choice) if choice else None,
            }
        )
    return out


def plain(value) -> str:
    """A grid value or setting as text a person reads: ``kind=dirichlet, alpha=0.1``, lists joined by
    ``; ``, never a Python repr."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={plain(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return (
            "; ".join(plain(v) for v in value)
            if any(isinstance(v, dict) for v in value)
            else ", ".join(plain(v) for v in value)
        )
    return str(value)


def sizes_text(sizes: dict) -> str:
    """A partition's client sizes ({min, max, mean}) as a phrase."""
    if not sizes:
        return ""
    if sizes.get("min") == sizes.get("max"):
        return f"every client holds {sizes['min']:,} samples"
    return f"client sizes {sizes['min']:,} to {sizes['max']:,} samples (mean {sizes['mean']:,.0f})"


def provenance_rows(manifest: dict, finished: pd.DataFrame, total: int) -> list[tuple[str, str]]:
    """(what, value) rows of the provenance table, only those with a value."""
    column = lambda name: sorted(set(finished[name].dropna())) if name in finished else []
    versions = finished["versions"].iloc[0] if "versions" in finished and len(finished) else {}
    kept = manifest.get("evidence")
    rows = [
        ("command", manifest.get("command", "")),
        ("params files", ", ".join(manifest.get("configfiles", []))),
        ("params hash", stable_hash(manifest["experiments"])),
        (
            "records",
            f"evidence folder {kept['name']}: {kept['runs_kept']} of {kept['runs_declared']} runs kept on "
            f"{kept['kept']}; this page was rebuilt from it"
            if kept
            else "",
        ),
        ("git commit(s) of the runs", " ".join(column("git_commit"))),
        ("machine(s): host, device", ", ".join(column("device"))),
        ("package versions", ", ".join(f"{k} {v}" for k, v in versions.items())),
        ("GPU stack and determinism switches", " | ".join(column("accelerator"))),
        (
            "total training time",
            f"{finished['runtime_s'].sum():.0f} s over {len(finished)} of {total} runs"
            if "runtime_s" in finished and len(finished)
            else "",
        ),
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


def build(
    manifest_path: str | Path,
    runs_dir: str | Path,
    partitions_dir: str | Path,
    out: str | Path,
    figures_dir: str | Path | None = None,
    paper_figures_dir: str | Path | None = None,
) -> Path:
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
            partitions.append(
                {
                    "id": pid,
                    "png": _file_png(partitions_dir / pid / "heatmap.png"),
                    "hash": info.get("content_hash", "missing"),
                    "sizes": sizes_text(info.get("sizes", {})),
                    "heterogeneity": partition_records.caption(stat) if stat else "",
                }
            )
        done = exp_runs[exp_runs["status"] != "missing"] if len(exp_runs) else exp_runs
        variants = {r["label"]: r["variant"] for r in exp["runs"]}
        pairs = coinciding(exp_curve)
        same_as = {b: a for a, b in pairs}
        table = summary_table(exp_runs) if len(exp_runs) else []
        for row in table:
            row["same_as"] = same_as.get(row["label"])
        sections.append(
            {
                "name": exp_name,
                "title": exp["title"],
                "description": exp["description"],
                "grid": exp["grid"],
                "table": table,
                "curves": curves_figure(exp_curve, same_as),
                "ablation": ablation_figure(exp_runs) if len(exp_runs) else None,
                "coinciding": [coincide_note(a, b, variants) for a, b in pairs],
                "partitions": partitions,
                "tunings": tuning_sections(manifest, exp_name),
                "missing": [r for r in exp_runs.to_dict("records") if r["status"] == "missing"],
                "diverged": [r["run"] for r in exp_runs.to_dict("records") if r["status"] == "diverged"],
                "collapsed": _collapse_list(exp_curve),
                "runtime_total": float(done["runtime_s"].sum()) if "runtime_s" in done else 0.0,
                "switches": switch_effects(exp_runs, exp["switches"])
                if exp.get("switches") and len(exp_runs)
                else None,
            }
        )
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
    html = env.get_template("report.html.j2").render(
        manifest=manifest,
        sections=sections,
        provenance=provenance,
        runs_done=int(len(finished)),
        runs_total=int(len(runs)),
        comparisons=comparisons,
        versus=versus.comparisons(manifest, runs_dir),
        paper_figures=paper_figures(paper_figures_dir, figures_dir),
        others=others,
        page=out.name,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html)
    if figures_dir:
        write_figures(sections, Path(figures_dir))
    return out


def tables_folder(page: str | Path) -> Path:
    """Where the page's tables go: ``reports/<name>_tables`` beside ``reports/<name>.html``."""
    page = Path(page)
    return page.with_name(f"{page.stem}_tables")


def paper_figures(folder: str | Path | None, figures_dir: str | Path | None) -> list[dict]:
    """The papers' analysis figures (fedrepro.report.figures) with their captions, copied into the page's
    figures folder as ``paper.<name>.png`` so that `snakemake --report` packs them too."""
    if not folder or not Path(folder).exists():
        return []
    from fedrepro.report import figures

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
