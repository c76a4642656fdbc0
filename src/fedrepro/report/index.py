"""reports/index.html: the verified results first, then every experiment of every params file with its state.

The verified results are built from ``evidence/`` alone (no training, nothing in results/): per paper table the
verification matrix's verdicts (fedrepro.report.verification), each cell run beside the paper's number, the compute the
table's runs took with the plan's estimate (fedrepro.report.compute), and a link to each evidence folder's page
(``reports/evidence/<folder>.html``, ``fedrepro evidence report``), or the command that builds it.

A run's state (done, diverged, interrupted, missing) is rundir's. An experiment is done when all its
runs have a summary. Each params file links to its report page when one exists, and says how to make
it otherwise, so a partial grid is one command from a report.
"""

from __future__ import annotations

import datetime
import json
import os
from collections import Counter
from pathlib import Path

from fedrepro.configure import expansion, paramsfile, schema
from fedrepro.run.rundir import STATES, RunDir


def params_files(params_dir: Path) -> list[Path]:
    """The runnable params files (not the papers' numbers, not the subset overlays)."""
    return sorted(p for p in params_dir.glob("*.yaml") if p.name != "paper_results.yaml")


def survey(params_path: Path, runs_dir: Path, reports_dir: Path) -> dict:
    try:
        params = paramsfile.load_params(params_path)
        runs = expansion.expand(params)
        # a corrupt summary.json is named in this file's entry and stops no other
        state_of = {run_id: RunDir(runs_dir / run_id).state() for run_id in expansion.unique_runs(runs)}
    except (schema.ConfigError, OSError, ValueError) as err:  # one broken file must not hide the others
        return {
            "name": params_path.stem,
            "path": str(params_path),
            "title": params_path.stem,
            "error": str(err),
            "run_ids": set(),
            "experiments": [],
            "runs": 0,
            **{s: 0 for s in STATES},
            "report": None,
            "quick": False,
            "report_command": "",
        }
    experiments = []
    for name, exp in paramsfile.selected_experiments(params).items():
        counts = Counter(state_of[r.id] for r in runs if r.experiment == name)
        total = sum(counts.values())
        finished = counts["done"] + counts["diverged"]
        experiments.append(
            {
                "name": name,
                "title": exp.get("title", name),
                "runs": total,
                **{s: counts[s] for s in STATES},
                "state": "done"
                if finished == total
                else ("partial" if finished or counts["interrupted"] else "missing"),
            }
        )
    report = reports_dir / f"{params_path.stem}.html"
    totals = Counter(state_of.values())
    shown = params_path.resolve()
    shown = shown.relative_to(paramsfile.ROOT) if shown.is_relative_to(paramsfile.ROOT) else shown
    return {
        "name": params_path.stem,
        "path": str(shown),
        "run_ids": set(state_of),
        "title": params.get("title", params_path.stem),
        "quick": params.get("quick", False),
        "experiments": experiments,
        "runs": len(state_of),
        **{s: totals[s] for s in STATES},
        "report": report.name if report.exists() else None,
        "report_command": f"fedrepro report --configfile {shown} --out {report}",
    }


def unlisted_runs(runs_dir: Path, listed: set[str]) -> list[str]:
    """Run folders no surveyed params file names: runs of edited code or settings (a run's folder
    name hashes both), or of params files not surveyed. Kept, never deleted; listed so they can be."""
    if not runs_dir.is_dir():
        return []
    return sorted(p.name for p in runs_dir.iterdir() if p.is_dir() and p.name not in listed)


EVIDENCE_PAGES = "evidence"  # reports/evidence/<folder>.html


def evidence_folders(root: str | Path) -> list[Path]:
    """The evidence folders (each with its manifest.json), by name."""
    return sorted(p.parent for p in Path(root).glob("*/manifest.json"))


def evidence_page(name: str) -> str:
    """An evidence folder's page, relative to reports/."""
    return f"{EVIDENCE_PAGES}/{name}.html"


def verified(root: str | Path, reports_dir: Path) -> dict:
    """The index's first section: the verification matrix's rows with their cells and compute, and the
    evidence folders with their pages."""
    from fedrepro.report import compute, verification

    root = Path(root)
    shown = root.resolve().relative_to(paramsfile.ROOT) if root.resolve().is_relative_to(paramsfile.ROOT) else root
    page = lambda name: evidence_page(name) if (reports_dir / evidence_page(name)).is_file() else None  # noqa: E731
    tables, rows = [], verification.matrix(root)
    for row in rows:
        if not row.run:
            continue
        cost = compute.of_runs(row.run_dirs)
        tables.append(
            {
                "name": row.table,
                "title": row.title,
                "figure_only": row.figure_only,
                "reported": row.reported,
                "run": row.run,
                "within": row.within,
                "diverged": row.diverged,
                "with_interval": row.with_interval,
                "through_spread": row.through_spread,
                "consistent": row.consistent - row.through_spread,  # counted apart from through_spread
                "seeds": sorted(set(row.seeds)),
                "cells": row.cells,
                "checks": [
                    {
                        "text": v.text,
                        "ours": str(v.ours),
                        "holds": v.ours.holds == v.ours.total,
                        "paper": str(v.paper_on_ours) if v.paper_on_ours.total else v.paper_side,
                    }
                    for v in row.checks_evaluated
                ],
                "compute": (
                    f"none: computed in closed form from {row.computed}" if row.computed else compute.text(cost)
                ),
                "estimate_source": cost["estimate_source"],
                "folders": [{"name": f, "page": page(f)} for f in row.folders],
            }
        )
    waiting = [row.title for row in rows if not row.run]
    folders = []
    for folder in evidence_folders(root):
        manifest = json.loads((folder / "manifest.json").read_text())
        kept = manifest.get("evidence", {})
        folders.append(
            {
                "name": folder.name,
                "page": page(folder.name),
                "protocol": verification.protocol(manifest),
                "runs": kept.get("runs_kept"),
                "declared": kept.get("runs_declared"),
                "titles": [e.get("title", n) for n, e in manifest.get("experiments", {}).items()],
                "command": f"fedrepro evidence report {shown / folder.name} "
                f"--out {reports_dir / evidence_page(folder.name)}",
            }
        )
    return {"tables": tables, "waiting": waiting, "folders": folders, "root": str(shown)}


def build(
    out: str | Path,
    params: list[str | Path] | None = None,
    runs_dir: str | Path = "results/runs",
    reports_dir: str | Path | None = None,
    evidence: str | Path | None = None,
) -> Path:
    """The index page; with ``evidence`` (an evidence root, e.g. evidence/), its verified results first."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    from fedrepro.report import tables
    from fedrepro.report.page import TEMPLATES

    out = Path(out)
    reports_dir = Path(reports_dir) if reports_dir else out.parent
    paths = [Path(p) for p in params] if params else params_files(paramsfile.ROOT / "params")
    files = [survey(p, Path(runs_dir), reports_dir) for p in paths]
    unlisted = unlisted_runs(Path(runs_dir), set().union(*(f["run_ids"] for f in files)))
    listed = {f"{f['name']}.html" for f in files} | {out.name}
    others = sorted(p.name for p in reports_dir.glob("*.html") if p.name not in listed)
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]))
    env.filters["num"] = tables.number
    html = env.get_template("index.html.j2").render(
        files=files,
        others=others,
        unlisted=unlisted,
        runs_dir=str(runs_dir),
        verified=verified(evidence, reports_dir) if evidence else None,
        generated=datetime.datetime.now().isoformat(timespec="seconds"),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    # several params files' workflows write this page: each replaces it whole, never half-written
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    partial.write_text(html)
    os.replace(partial, out)
    return out
