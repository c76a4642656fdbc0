"""reports/index.html: every experiment of every params file with its state, whatever has run.

A run's state (done, diverged, interrupted, missing) is rundir's. An experiment is done when all its
runs have a summary. Each params file links to its report page when one exists, and says how to make
it otherwise, so a partial grid is one command from a report.
"""
from __future__ import annotations

import datetime
import os
from collections import Counter
from pathlib import Path

from fedrepro import config
from fedrepro.rundir import STATES, RunDir


def params_files(params_dir: Path) -> list[Path]:
    """The runnable params files (not the papers' numbers, not the subset overlays)."""
    return sorted(p for p in params_dir.glob("*.yaml") if p.name != "paper_results.yaml")


def survey(params_path: Path, runs_dir: Path, reports_dir: Path) -> dict:
    try:
        params = config.load_params(params_path)
        runs = config.expand(params)
        # a corrupt summary.json is named in this file's entry and stops no other
        state_of = {run_id: RunDir(runs_dir / run_id).state() for run_id in config.unique_runs(runs)}
    except (config.ConfigError, OSError, ValueError) as err:  # one broken file must not hide the others
        return {"name": params_path.stem, "path": str(params_path), "title": params_path.stem, "error": str(err),
                "run_ids": set(), "experiments": [], "runs": 0, **{s: 0 for s in STATES}, "report": None,
                "quick": False, "report_command": ""}
    experiments = []
    for name, exp in config.selected_experiments(params).items():
        counts = Counter(state_of[r.id] for r in runs if r.experiment == name)
        total = sum(counts.values())
        finished = counts["done"] + counts["diverged"]
        experiments.append({"name": name, "title": exp.get("title", name), "runs": total,
                            **{s: counts[s] for s in STATES},
                            "state": "done" if finished == total else ("partial" if finished or counts["interrupted"]
                                                                       else "missing")})
    report = reports_dir / f"{params_path.stem}.html"
    totals = Counter(state_of.values())
    shown = params_path.resolve()
    shown = shown.relative_to(config.ROOT) if shown.is_relative_to(config.ROOT) else shown
    return {"name": params_path.stem, "path": str(shown), "run_ids": set(state_of), "title": params.get("title", params_path.stem),
            "quick": params.get("quick", False), "experiments": experiments, "runs": len(state_of),
            **{s: totals[s] for s in STATES},
            "report": report.name if report.exists() else None,
            "report_command": f"fedrepro report --configfile {shown} --out {report}"}


def unlisted_runs(runs_dir: Path, listed: set[str]) -> list[str]:
    """Run folders no surveyed params file names: runs of edited code or settings (a run's folder
    name hashes both), or of params files not surveyed. Kept, never deleted; listed so they can be."""
    if not runs_dir.is_dir():
        return []
    return sorted(p.name for p in runs_dir.iterdir() if p.is_dir() and p.name not in listed)


def build(out: str | Path, params: list[str | Path] | None = None, runs_dir: str | Path = "results/runs",
          reports_dir: str | Path | None = None) -> Path:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    from fedrepro.report import TEMPLATES

    out = Path(out)
    reports_dir = Path(reports_dir) if reports_dir else out.parent
    paths = [Path(p) for p in params] if params else params_files(config.ROOT / "params")
    files = [survey(p, Path(runs_dir), reports_dir) for p in paths]
    unlisted = unlisted_runs(Path(runs_dir), set().union(*(f["run_ids"] for f in files)))
    listed = {f"{f['name']}.html" for f in files} | {out.name}
    others = sorted(p.name for p in reports_dir.glob("*.html") if p.name not in listed)
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]))
    html = env.get_template("index.html.j2").render(
        files=files, others=others, unlisted=unlisted, runs_dir=str(runs_dir),
        generated=datetime.datetime.now().isoformat(timespec="seconds"))
    out.parent.mkdir(parents=True, exist_ok=True)
    # several params files' workflows write this page: each replaces it whole, never half-written
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    partial.write_text(html)
    os.replace(partial, out)
    return out
