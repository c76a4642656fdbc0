"""The verification matrix: which of the papers' numbers the kept evidence reproduces, and how closely.

Built from ``evidence/`` and ``params/paper_results.yaml`` alone (never typed by hand): one row per paper
table, with the cells the paper reports, those runnable on a machine without internet, those run at the
paper's settings (kept as evidence), the seeds per cell, and two verdicts that are counted apart and never
merged: *reproduced*, |ours − paper| <= 1.5 points (the table's tolerance; our spread never widens it), and
*consistent within seed noise*, the paper's value inside the 95% t interval of our mean (of the difference of
means where the paper prints a std; paper.noise_interval). Then the largest gap with its explanation, the runs
that collapsed (fedrepro.report.collapses), and the table's claim checks evaluated on our runs (for a figure the paper
prints no numbers for, they are the whole verification: its cells count as runnable and run, none as
reported). Below the table: every cell not reproduced, with its explanation, and how many misses seed noise
alone would give at this number of cells. fedrepro.report.matrix_text writes the rows as docs/verification.md's
matrix and the README's summary; fedrepro.report.cites checks the numbers the explanations state.

Only evidence kept under the paper's protocol counts: a folder kept from params files that include an
``*_official_protocol`` subset is the authors' code's protocol (docs/parity.md compares those). A run counts
for a table when its folder's manifest declares it under one of the table's experiments (paper.table_experiments,
the report's rule), so ablation runs that share a cell's settings never leak into it. A cell counts one run
per seed: where folders hold two runs of one seed (a run kept again after a code change gave it a new id),
the most recently kept counts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from fedrepro import catalog
from fedrepro.configure.paramsfile import ROOT, read_shipped_yaml
from fedrepro.configure.schema import ConfigError
from fedrepro.report import claims, computed, paper

EVIDENCE = ROOT / "evidence"
EXPLANATIONS = "explanations.yaml"
# Datasets a machine without internet has: those whose fragment names where they come from offline (Debian's
# dataset-fashion-mnist holds the real Fashion-MNIST; Synthetic(a, b) is generated)
OFFLINE_DATASETS = {name: facts["offline"] for name, facts in catalog.DATASETS.items() if facts.get("offline")}


def protocol(manifest: dict) -> str:
    """'official' for evidence kept with an official-protocol subset, else 'paper'."""
    stated = manifest.get("evidence", {}).get("protocol")
    if stated:
        return stated
    files = [Path(f).stem for f in manifest.get("configfiles", [])]
    return "official" if any(f.endswith("_official_protocol") for f in files) else "paper"


@dataclass
class Row:
    table: str
    title: str
    paper_key: str = ""  # the table's paper (params/paper_results.yaml: ``paper``)
    figure_only: bool = False  # the paper prints no numbers: only its claims can be checked
    reported: int = 0
    runnable: int = 0
    run: int = 0
    seeds: list[int] = field(default_factory=list)
    within: int = 0  # reproduced: |delta| <= the table's tolerance (strict)
    tolerance: float = paper.MIN_GAP
    with_interval: int = 0  # cells run at two or more seeds: a t interval exists
    consistent: int = 0  # of those, the paper's value inside the interval
    noise_only: int = 0  # not reproduced, but inside the interval: our spread alone admits it
    through_spread: int = 0  # of those, inside only through our own spread (paper.through_spread)
    typical: float | None = None  # the median half-width of the table's intervals (paper.typical_half_width)
    diverged: int = 0
    largest: dict | None = None  # {row, column, delta, allowed, explanation}
    outside: list[dict] = field(default_factory=list)  # every cell not reproduced
    collapsed: list[dict] = field(default_factory=list)  # {row, column, seed, record} per flagged run
    noise: list[dict] = field(default_factory=list)  # per cell with an interval: {n, sd, tolerance, consistent}
    folders: list[str] = field(default_factory=list)
    checks: list[claims.Verdict] = field(default_factory=list)
    deltas: list[float] = field(default_factory=list)  # ours − paper of every cell run with a number
    cells: list[dict] = field(default_factory=list)  # every cell run: ours beside the paper's, and the verdict
    run_dirs: list[Path] = field(default_factory=list)  # the kept runs the cells count
    computed: str = ""  # a closed-form figure's source ("params/fednova.yaml: fig"), no runs

    @property
    def checks_evaluated(self) -> list[claims.Verdict]:
        return [v for v in self.checks if v.ours.total]

    @property
    def checks_failing(self) -> list[claims.Verdict]:
        return [v for v in self.checks_evaluated if v.ours.holds < v.ours.total]


def _explanations(root: Path, tables: dict) -> dict:
    """(table, row, column) -> entry; an entry naming no cell of the papers' tables (a typo would leave its
    cell "unexplained" unnoticed) or without a text is refused, naming the file and the entry."""
    path = root / EXPLANATIONS
    if not path.is_file():
        return {}
    data = read_shipped_yaml(path) or {}
    known = {(c.table, c.row, c.column) for c in paper.cells(tables)}
    out = {}
    for table, entries in data.items():
        for e in entries:
            key = (table, e.get("row"), e.get("column"))
            if key not in known:
                raise ConfigError(
                    f"{path}: {table} / {key[1]} / {key[2]} names no cell of the papers' tables "
                    "(allowed: a table's key, then one of its row labels and column labels)"
                )
            if not isinstance(e.get("text"), str) or "\n" in str(e.get("summary", "")):
                raise ConfigError(f"{path}: {table} / {key[1]} / {key[2]} needs a text, and its summary one line")
            out[key] = e
    return out


def _explained(explain: dict, key: tuple) -> dict:
    """The cell's explanation (the list below the matrix) and its one-line summary (the matrix's own cell;
    an entry without ``summary`` shows its whole text there)."""
    entry = explain.get(key, {"text": "unexplained"})
    return {"explanation": entry["text"], "summary": entry.get("summary", entry["text"])}


def _folders(root: Path) -> list[tuple[Path, dict]]:
    """The paper-protocol evidence folders, oldest keep first."""
    out = []
    for manifest in sorted(root.glob("*/manifest.json")):
        data = json.loads(manifest.read_text())
        if protocol(data) == "paper":
            out.append((manifest.parent, data))
    return sorted(out, key=lambda f: (f[1].get("evidence", {}).get("kept", ""), f[0].name))


def _one_per_seed(cell: paper.Cell, runs: dict[str, dict]) -> None:
    """Keep one run per seed in the cell, the one of the most recently kept folder (runs is in keep order),
    whether it diverged or not: an older run of another draw or code never stands in for a newer one."""
    order = {run_id: i for i, run_id in enumerate(runs)}
    value = dict(zip(cell.runs, cell.ours))
    latest: dict = {}
    for run_id in sorted(cell.runs + cell.diverged, key=order.get):
        latest[runs[run_id]["setting"]["seed"]] = run_id
    kept = sorted(latest.values(), key=order.get)
    cell.runs = [r for r in kept if r in value]
    cell.ours = [value[r] for r in cell.runs]
    cell.diverged = [r for r in kept if r not in value]


def matrix(root: str | Path = EVIDENCE, results: str | Path = paper.RESULTS_FILE) -> list[Row]:
    root = Path(root)
    tables = paper.load_results(results)
    explain = _explanations(root, tables)
    folders = _folders(root)
    rows = []
    for name, table in tables.items():
        runs: dict[str, dict] = {}
        used: set[str] = set()
        for folder, manifest in folders:
            declared = {
                r["id"]
                for e in paper.table_experiments(name, table, manifest["experiments"])
                for r in manifest["experiments"][e]["runs"]
            }
            for run in paper.load_runs(folder / "runs", declared):
                runs.pop(run["id"], None)  # kept again later: it counts as of its latest keep
                runs[run["id"]] = {**run, "folder": folder.name}
        joined = paper.join({name: table}, list(runs.values()))
        row = Row(
            name,
            table["title"],
            paper_key=table.get("paper", name.split("_")[0]),
            figure_only=all(cell.value is None for cell in joined),
            tolerance=paper.tolerance(table),
        )
        if table.get("computed"):  # a closed-form figure: its cells are computed, its claims checked on them
            computed.fill(table, joined)
            row.computed = f"{table['computed']['params']}: {table['computed']['figure']}"
            row.runnable = row.run = len(joined)
            row.seeds = [1] * len(joined)
            row.checks = claims.evaluate_table(name, table, joined)
            rows.append(row)
            continue
        for cell in joined:
            if cell.ours or cell.diverged:
                _one_per_seed(cell, runs)
                used.update(runs[r]["folder"] for r in cell.runs + cell.diverged)
        row.typical = paper.typical_half_width(
            paper.noise_interval(c.ours, c.std, table.get("paper_seeds"))
            for c in joined
            if c.value is not None and c.ours
        )
        for cell in joined:
            if cell.value is None and not row.figure_only:
                continue
            row.reported += not row.figure_only
            row.runnable += cell.match.get("dataset") in OFFLINE_DATASETS
            if not cell.ours and not cell.diverged:
                continue
            row.run += 1
            row.seeds.append(len(cell.ours) + len(cell.diverged))
            row.run_dirs.extend(root / runs[r]["folder"] / "runs" / r for r in cell.runs + cell.diverged)
            key = (name, cell.row, cell.column)
            flagged = sorted(
                (
                    {
                        "row": cell.row,
                        "column": cell.column,
                        "seed": runs[r]["setting"]["seed"],
                        "run": r,
                        "record": cell.collapses[r],
                        **_explained(explain, key),
                    }
                    for r in cell.runs + cell.diverged
                    if r in cell.collapses
                ),
                key=lambda f: f["seed"],
            )
            listed = {f["run"] for f in row.collapsed}  # a run two rows read (two metrics of one figure) once
            row.collapsed.extend(f for f in flagged if f["run"] not in listed)
            shown = {
                "row": cell.row,
                "column": cell.column,
                "ours": cell.ours_mean,
                "ours_std": cell.ours_std,
                "seeds": len(cell.ours),
                "diverged": len(cell.diverged),
                "paper": cell.value,
                "paper_std": cell.std,
                "delta": cell.delta,
                "allowed": None,
                "verdict": "figure",
                "summary": "",
                "interval": None,
                "consistent": None,
                "noise_only": False,
                "through_spread": False,
            }
            row.cells.append(shown)
            if not cell.ours:  # every seed diverged
                row.diverged += 1
                row.outside.append(
                    {
                        "row": cell.row,
                        "column": cell.column,
                        "delta": None,
                        "allowed": None,
                        "interval": None,
                        "verdict": "diverged",
                        "collapsed": flagged,
                        **_explained(explain, key),
                    }
                )
                shown.update(verdict="diverged", summary=row.outside[-1]["summary"])
                continue
            if row.figure_only:  # no number to be near; the claims below judge it
                continue
            allowed = cell.metric.get("tolerance", row.tolerance)
            interval = paper.noise_interval(cell.ours, cell.std, table.get("paper_seeds"))
            entry = {
                "row": cell.row,
                "column": cell.column,
                "delta": cell.delta,
                "allowed": allowed,
                "interval": interval,
                "verdict": paper.verdict(cell.delta, allowed, interval, row.typical, bool(flagged)),
                "collapsed": flagged,
                **_explained(explain, key),
            }
            shown.update(interval=interval)
            if interval is not None:
                row.with_interval += 1
                inside = paper.consistent(cell.delta, interval)
                shown.update(consistent=inside)
                row.consistent += inside
                row.noise.append(
                    {
                        "n": len(cell.ours),
                        "sd": cell.ours_std,
                        "tolerance": allowed,
                        "paper_std": cell.std,
                        "paper_seeds": table.get("paper_seeds"),
                        "consistent": inside,
                        "draws": sorted({str(runs[r]["summary"].get("partition")) for r in cell.runs}),
                    }
                )
            row.deltas.append(cell.delta)
            if paper.reproduced(cell.delta, allowed):
                row.within += 1
                shown.update(allowed=allowed, verdict="within")
            else:
                row.outside.append(entry)
                row.noise_only += entry["verdict"] in ("seed noise only", "through our spread")
                row.through_spread += entry["verdict"] == "through our spread"
                shown.update(
                    allowed=allowed,
                    verdict="outside",
                    summary=entry["summary"],
                    noise_only=entry["verdict"] == "seed noise only",
                    through_spread=entry["verdict"] == "through our spread",
                )
            if row.largest is None or abs(cell.delta) > abs(row.largest["delta"]):
                row.largest = entry
        row.run_dirs = list(dict.fromkeys(row.run_dirs))  # a run two cells count is one run's compute
        row.checks = claims.evaluate_table(name, table, joined)
        row.folders = sorted(used)
        rows.append(row)
    return rows


def unnamed_collapses(rows: list[Row]) -> list[str]:
    """The flagged runs whose cell's explanation does not name their deepest fall ('10.01%'), one line each."""
    out = []
    for r in rows:
        for f in r.collapsed:
            deepest = min(f["record"]["episodes"], key=lambda e: e["low_acc"])
            if f"{deepest['low_acc']:.2f}%" not in f["explanation"]:
                out.append(
                    f"{r.table}, {f['row']} / {f['column']}, seed {f['seed']}: its explanation does not name "
                    f"its fall to {deepest['low_acc']:.2f}% at round {deepest['low_round']}"
                )
    return out


def chance(rows: list[Row], confidence: float = paper.CONFIDENCE) -> dict:
    """How many misses seed noise alone would give at this number of cells, were each paper value the true mean
    of our runs. Interval: each of the n cells with a t interval misses with probability 1 − confidence, so
    (1 − confidence) n misses are expected. Strict gap: a cell of n seeds with spread s misses 1.5 points with
    probability P(|t(n−1)| > 1.5 / (s / sqrt(n))) (our s standing in for the true spread); their sum is the
    expected number of strict misses from noise. Expectations add up whatever the cells' dependence; the chance
    of at least so many misses does not: a table's methods at one setting train on the same partition draws
    (``draws``: the distinct partitions, ``draw_sets``: the distinct sets of them the cells rest on), so a hard
    draw moves them together and the cells are not independent trials; no such probability is given."""
    from scipy import stats

    cells = [c for r in rows for c in r.noise]
    n, misses = len(cells), sum(not c["consistent"] for c in cells)
    strict_expected = 0.0
    for c in cells:
        se = (c["sd"] or 0.0) / math.sqrt(c["n"])
        strict_expected += 2 * stats.t.sf(c["tolerance"] / se, c["n"] - 1) if se > 0 else 0.0
    sets = {tuple(c["draws"]) for c in cells if c.get("draws")}
    return {
        "cells": n,
        "misses": misses,
        "expected": (1 - confidence) * n,
        "strict_expected": strict_expected,
        "draws": len({d for s in sets for d in s}),
        "draw_sets": len(sets),
    }
