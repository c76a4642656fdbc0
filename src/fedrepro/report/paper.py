"""The papers' published numbers (params/paper_results.yaml) joined to our runs, cell by cell.

A cell of a paper table names the runs it compares with by a partial setting (row.match merged
with column.match, or the row's own column_match); every run whose resolved setting agrees on
those keys is a seed of that cell. Our number is computed from each run the way the paper defines
its metric (specs: IMA and FedLAW the last 10 rounds, FedAWARE the last 10% of rounds, IMA
Table 2 the first round reaching a target), then averaged over seeds.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fedrepro.configure.paramsfile import ROOT, read_shipped_yaml
from fedrepro.records import CorruptFileError
from fedrepro.report import collapses
from fedrepro.run import rundir

RESULTS_FILE = ROOT / "params" / "paper_results.yaml"


@dataclass
class Cell:
    table: str
    paper: str
    row: str
    column: str
    match: dict
    metric: dict
    value: float | None          # the paper's number (None: the paper leaves the cell empty)
    std: float | None = None
    ours: list[float] = field(default_factory=list)  # one number per matching run (seed)
    runs: list[str] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)  # matching runs whose loss became NaN/inf
    in_scope: bool = True  # False: the params file (e.g. a subset) declares no run for this cell
    # run id -> its collapse record (fedrepro.report.collapses), flagged runs
    collapses: dict = field(default_factory=dict)

    @property
    def ours_mean(self) -> float | None:
        return sum(self.ours) / len(self.ours) if self.ours else None

    @property
    def ours_std(self) -> float | None:
        if len(self.ours) < 2:
            return None
        m = self.ours_mean
        return math.sqrt(sum((x - m) ** 2 for x in self.ours) / (len(self.ours) - 1))

    @property
    def delta(self) -> float | None:
        if self.value is None or self.ours_mean is None:
            return None
        return self.ours_mean - self.value


def table_experiments(name: str, table: dict, experiments) -> list[str]:
    """The experiments a table takes its runs from: those it names under ``experiments``, else those named
    as the table or starting with its name and "_" (``ima_table1`` from ``ima_table1_fmnist``), so ablation
    runs that happen to share a cell's settings never leak into it."""
    named = table.get("experiments")
    return [e for e in experiments if (e in named if named else e == name or e.startswith(name + "_"))]


def load_results(path: str | Path = RESULTS_FILE) -> dict:
    return read_shipped_yaml(path)["tables"]


def cells(tables: dict, names: list[str] | None = None) -> list[Cell]:
    out = []
    for name, table in tables.items():
        if names and name not in names:
            continue
        columns = table["columns"]
        for row in table["rows"]:
            row = {"values": [None] * len(columns), **row}  # no values: the paper prints none (a figure)
            if len(row["values"]) != len(columns):
                raise ValueError(f"{name}, row '{row['label']}': {len(row['values'])} values "
                                 f"for {len(columns)} columns")
            column_match = row.get("column_match") or [c["match"] for c in columns]
            for col, col_match, value in zip(columns, column_match, row["values"]):
                mean, std = (value.get("mean"), value.get("std")) if isinstance(value, dict) else (value, None)
                # a row's metric (FedLAW Table 2's learned gamma row) wins over its column's and the table's
                metric = row.get("metric") or col.get("metric", table["metric"])
                out.append(Cell(name, table["paper"], row["label"], col["label"], {**row["match"], **col_match},
                                metric, mean, std))
    return out


def _get(setting: dict, dotted: str):
    value = setting
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


_MISSING = object()


def matches(setting: dict, match: dict) -> bool:
    for key, want in match.items():
        have = _get(setting, key)
        if key == "plugins":
            if sorted(have if have is not _MISSING else []) != sorted(want):
                return False
        elif want is None:  # null: the key is unset (a method's default that runs never write)
            if have is not _MISSING and have is not None:
                return False
        elif have is _MISSING or (have != want and not (_is_num(have) and _is_num(want)
                                                         and math.isclose(have, want))):
            return False
    return True


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def run_metric(metric: dict, summary: dict, frame) -> float | None:
    """The paper's metric for one finished run; ``frame`` is its metrics.csv as a DataFrame."""
    if summary.get("status") != "finished" or frame is None or not len(frame):
        return None
    scale = metric.get("scale", 1)
    kind = metric["kind"]
    acc = frame["test_acc"].dropna() if "test_acc" in frame else None
    if kind == "mean_last_rounds":
        return float(acc.tail(metric["rounds"]).mean()) * scale
    if kind == "mean_last_fraction":
        rounds = max(1, math.ceil(metric["fraction"] * len(frame)))
        last = frame.tail(rounds)["test_acc"].dropna()
        return float(last.mean()) * scale
    if kind == "mean_over_rounds":
        return float(frame[metric["column"]].mean()) * scale
    if kind == "mean_last_logged":  # a column logged every k rounds (global_train_loss): its last values
        return float(frame[metric["column"]].dropna().tail(metric.get("rounds", 1)).mean()) * scale
    if kind == "mean_round_range":  # FedLAW's section 4 indicators: the mean over rounds 90-110 (App. D.5)
        window = frame[(frame["round"] >= metric["first"]) & (frame["round"] <= metric["last"])]
        if metric["column"] not in window or (metric.get("divide_by") and metric["divide_by"] not in window):
            return None  # the run does not log it (a method without the indicator)
        inside = window[metric["column"]]
        if metric.get("divide_by"):  # a per-round ratio (FedLAW's r = ||gamma eta_g g_g|| / ||(1 - gamma) w_g||)
            inside = inside / window[metric["divide_by"]]
        inside = inside[inside.abs() != math.inf].dropna()
        return float(inside.mean()) * scale if len(inside) else None
    if kind == "critical_round":  # FedLAW section 5: the first round the coherence's moving average is <= 0
        return _run_critical_round(metric, frame)
    if kind == "gain_after_critical":  # FedLAW section 5: the share of the accuracy gain made after the critical point
        critical = _run_critical_round(metric, frame)
        if critical is None or acc is None:
            return None
        return gain_share_after(frame[["round", "test_acc"]].dropna(), critical, metric.get("last_rounds", 10))
    if kind == "weight_correlation":
        return weight_correlation(summary, frame, metric["factor"])
    if kind == "rounds_to_target":
        hit = frame[frame["test_acc"] >= metric["target"]]
        return float(hit["round"].iloc[0]) if len(hit) else math.inf
    raise ValueError(f"unknown metric kind '{kind}'")


def critical_round(rounds, values, window: int = 5) -> float:
    """The first round at which the ``window``-round moving average of ``values`` is <= 0 (FedLAW's critical
    point of the coherence, as its figure marks it); inf when it never is within the run."""
    import numpy as np

    if len(values) < window:
        return math.inf
    smooth = np.convolve(values, np.ones(window) / window, mode="valid")
    below = np.flatnonzero(smooth <= 0)
    return float(rounds[below[0] + window - 1]) if len(below) else math.inf


def _run_critical_round(metric: dict, frame) -> float | None:
    """A run's critical round of ``metric["column"]``, or None where the run does not log that column."""
    if metric["column"] not in frame:
        return None
    logged = frame[["round", metric["column"]]].dropna()
    return critical_round(logged["round"].to_numpy(), logged[metric["column"]].to_numpy(), metric.get("window", 5))


def gain_share_after(accuracy, critical: float, last_rounds: int = 10) -> float | None:
    """Of a run's accuracy gain, from its first logged round to the mean of its last ``last_rounds`` logged rounds,
    the share made after round ``critical`` (its accuracy at the first logged round from there on). None where
    there is no critical point or no gain to share."""
    rounds, values = accuracy["round"].to_numpy(), accuracy["test_acc"].to_numpy()
    at = rounds >= critical
    if critical == math.inf or not at.any():
        return None
    first, end, then = values[0], float(values[-last_rounds:].mean()), values[at.argmax()]
    if end <= first:
        return None
    return float((end - then) / (end - first))


def client_factors(class_counts) -> dict:
    """FedLAW Table 11's client properties: dataset size (DS), heterogeneity degree HD = 1 / the variance
    of the client's class distribution (over classes), and DS x HD."""
    import numpy as np

    counts = np.asarray(class_counts, dtype=float)
    sizes = counts.sum(1)
    # a perfectly uniform client has variance 0: its HD is the largest finite one rather than inf
    hd = 1.0 / (counts / sizes[:, None].clip(min=1)).var(1).clip(min=1e-12)
    return {"ds": sizes, "hd": hd, "ds_hd": sizes * hd}


def weight_correlation(summary: dict, frame, factor: str) -> float | None:
    """Pearson correlation over the clients of the run's accumulated aggregation weights (the sum over rounds
    of lambda_client_<id>, 0 in rounds the client was not sampled) with one of ``client_factors``."""
    import numpy as np

    counts = summary.get("client_class_counts")
    columns = [f"lambda_client_{i}" for i in range(len(counts or []))]
    if not counts or not any(c in frame for c in columns):
        return None  # the run logged no weights (fedlaw.log_client_weights off)
    accumulated = frame.reindex(columns=columns).fillna(0.0).sum().to_numpy()  # never sampled: no column, 0
    return float(np.corrcoef(accumulated, client_factors(counts)[factor])[0, 1])


def load_runs(runs_dir: str | Path, ids: set[str] | None = None) -> list[dict]:
    """Every run folder with a summary (or only those named in ``ids``): setting, summary, metrics, and its
    collapse record computed from the metrics (``fedrepro.report.collapses``; a kept summary's own record is the
    same)."""
    runs = []
    for run_dir in rundir.finished_runs(runs_dir):
        if ids is not None and run_dir.id not in ids:
            continue
        try:
            summary = run_dir.read_summary()
            metrics = run_dir.read_metrics() if run_dir.metrics.exists() else None
        except CorruptFileError as err:  # one damaged run must not hide the others' numbers
            print(f"warning: skipped: {err}", file=sys.stderr)
            continue
        runs.append({"id": run_dir.id, "setting": summary["setting"], "summary": summary, "metrics": metrics,
                     "collapse": collapses.of_run(summary, metrics)})
    return runs


def join(tables: dict, runs: list[dict], names: list[str] | None = None) -> list[Cell]:
    """Every cell of the named tables with our numbers from the matching runs."""
    out = cells(tables, names)
    for cell in out:
        for run in runs:
            if matches(run["setting"], cell.match):
                if run["summary"].get("status") == "diverged":
                    cell.diverged.append(run["id"])
                if (run.get("collapse") or {}).get("collapsed"):
                    cell.collapses[run["id"]] = run["collapse"]
                value = run_metric(cell.metric, run["summary"], run["metrics"])
                if value is not None:
                    cell.ours.append(value)
                    cell.runs.append(run["id"])
    return out


MIN_GAP = 1.5  # points of accuracy: the largest distance from the paper's mean that counts as reproduced
CONFIDENCE = 0.95  # of the t interval that says whether our seeds' spread alone admits the paper's value


def tolerance(table: dict) -> float:
    """The strict verdict's gap: a table's own ``tolerance``, else 1.5 points (20 rounds for a rounds-to-target
    table, IMA Table 2). Our spread never widens it: a noisy cell is judged by ``noise_interval`` instead."""
    return table.get("tolerance", 20.0 if table["metric"]["kind"] == "rounds_to_target" else MIN_GAP)


def reproduced(delta: float | None, tolerance: float) -> bool | None:
    """The strict verdict: |ours − paper| <= tolerance (1.5 points); None where a side is missing."""
    return None if delta is None else abs(delta) <= tolerance


def noise_interval(ours: list[float], paper_std: float | None = None, paper_seeds: int | None = None,
                   confidence: float = CONFIDENCE) -> float | None:
    """Half the width of the t-based ``confidence`` interval that decides "consistent within seed noise".

    Without the paper's std: the interval of our mean, t(n−1) · s / sqrt(n) over our n seeds; the paper's
    value is consistent with our runs when it lies inside it. Where the paper prints a std over
    ``paper_seeds`` runs: the interval of the difference of the two means (Welch), t(ν) · sqrt(s²/n + s_p²/n_p)
    with Welch–Satterthwaite's ν. None with fewer than two seeds of ours (no spread to judge by), or a
    finite-valued spread that is missing (a rounds-to-target cell one seed never reached)."""
    from scipy import stats

    values = [v for v in ours if v is not None]
    n = len(values)
    if n < 2 or not all(math.isfinite(v) for v in values):
        return None
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    q = 0.5 + confidence / 2
    if paper_std is None or not paper_seeds or paper_seeds < 2:
        return float(stats.t.ppf(q, n - 1) * math.sqrt(var / n))
    a, b = var / n, paper_std ** 2 / paper_seeds
    if a + b == 0:
        return 0.0
    dof = (a + b) ** 2 / (a ** 2 / (n - 1) + b ** 2 / (paper_seeds - 1))
    return float(stats.t.ppf(q, dof) * math.sqrt(a + b))


def consistent(delta: float | None, interval: float | None) -> bool | None:
    """The second verdict: the paper's value lies inside our interval (|Δ| <= its half width); None where there
    is no interval (one seed) or no delta."""
    if delta is None or interval is None or not math.isfinite(delta):
        return None
    return abs(delta) <= interval


THROUGH_SPREAD = ("inside our interval but outside the strict gap, and either farther from our mean than the "
                  "table's median interval half-width or in a cell holding a run flagged as collapsed")


def typical_half_width(intervals) -> float | None:
    """The median half-width of a table's 95% t intervals (its cells with two or more seeds): the spread of a
    typical cell of the table, against which one cell's wide interval is judged. None without any interval."""
    widths = sorted(w for w in intervals if w is not None and math.isfinite(w))
    if not widths:
        return None
    mid = len(widths) // 2
    return widths[mid] if len(widths) % 2 else (widths[mid - 1] + widths[mid]) / 2


def through_spread(delta: float | None, tolerance: float, interval: float | None, typical: float | None,
                   collapsed: bool = False) -> bool:
    """Consistent within seed noise only through our own spread (THROUGH_SPREAD): the paper's value lies inside
    our interval and outside the strict gap, and either an interval of the table's typical (median) half-width
    would leave it outside, or a run of the cell collapsed (a collapse is what widens the interval)."""
    if not consistent(delta, interval) or reproduced(delta, tolerance):
        return False
    return collapsed or (typical is not None and abs(delta) > typical)


def verdict(delta: float | None, tolerance: float, interval: float | None, typical: float | None = None,
            collapsed: bool = False) -> str:
    """The cell's label: 'reproduced' (strict), 'through our spread' (inside our interval only through our own
    spread: through_spread, given the table's typical half width and whether a run of the cell collapsed),
    'seed noise only' (outside the strict gap, inside our interval: the spread of our seeds alone admits the
    paper's value), 'neither', 'no interval' (outside the strict gap, one seed: no spread to judge by), or ''
    where nothing is compared."""
    if delta is None:
        return ""
    if reproduced(delta, tolerance):
        return "reproduced"
    if through_spread(delta, tolerance, interval, typical, collapsed):
        return "through our spread"
    inside = consistent(delta, interval)
    return "no interval" if inside is None else ("seed noise only" if inside else "neither")


def table_frame(joined: list[Cell], table: str, tolerance: float = MIN_GAP, paper_seeds: int | None = None):
    """One paper table as rows x columns of 'paper ± std | ours ± std (n) | Δ', for the report page.

    Two verdicts, never merged: ``within`` is True where |Δ| <= ``allowed`` (the strict tolerance: points of
    accuracy, rounds for IMA Table 2, a metric's own ``tolerance`` where its unit is another, e.g. FedLAW's
    learned gamma); ``consistent`` where |Δ| <= ``interval`` (``noise_interval``: our seeds' t interval, and the
    paper's std over ``paper_seeds`` where it prints one). Each is None where it cannot be judged."""
    import pandas as pd

    mine = [c for c in joined if c.table == table]
    intervals = {id(c): noise_interval(c.ours, c.std, paper_seeds) for c in mine}
    typical = typical_half_width(intervals[id(c)] for c in mine if c.value is not None)
    records = []
    for c in mine:
        allowed = c.metric.get("tolerance", tolerance)
        interval = intervals[id(c)]
        records.append({"row": c.row, "column": c.column, "paper": c.value, "paper_std": c.std,
                        "ours": c.ours_mean, "ours_std": c.ours_std, "seeds": len(c.ours), "delta": c.delta,
                        "diverged": len(c.diverged), "in_scope": c.in_scope, "allowed": allowed,
                        "within": reproduced(c.delta, allowed), "interval": interval,
                        "consistent": consistent(c.delta, interval),
                        "verdict": verdict(c.delta, allowed, interval, typical, bool(c.collapses)),
                        "collapsed": len(c.collapses),
                        "collapse_text": "; ".join(collapses.describe(r) for r in c.collapses.values())})
    return pd.DataFrame.from_records(records)
