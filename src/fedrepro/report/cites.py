"""The numbers the explanations of evidence/explanations.yaml state, checked against their sources: every number
with two decimals an explanation states must be cited, and every cite must equal what its kept runs, the paper's
table or a kept file give (``check_cites``; tests/report/test_verification.py runs it on the real evidence)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fedrepro.configure.paramsfile import read_shipped_yaml
from fedrepro.report import paper
from fedrepro.report.verification import EVIDENCE, EXPLANATIONS

NUMBER = r"(?<![\d.])\d+\.\d{2}(?![\d])"  # a number with two decimals, as accuracies and std are written


def _cited_runs(root: Path, ref: str | list[str]) -> list[Path]:
    """'folder/run id pattern' (``*`` is a wildcard), or a list of them -> the kept run folders named, each once
    (a list names runs that no one pattern separates from their neighbours, e.g. one draw of a switches folder)."""
    found = set()
    for one in [ref] if isinstance(ref, str) else ref:
        folder, pattern = one.split("/", 1)
        found.update(p for p in (root / folder / "runs").glob(pattern) if p.is_dir())
    return sorted(found)


def _run_number(run: Path, cite: dict) -> float | None:
    """One kept run's number as a cite names it: ``of`` final (the summary's final accuracy), best, round (the
    test accuracy at ``round``), column (``column`` over ``rounds`` [first, last], reduced by ``stat``: median,
    mean, min, max), or setting (the dotted ``setting`` key of the resolved setting). Accuracies in points."""
    import pandas as pd

    summary = json.loads((run / "summary.json").read_text())
    of = cite.get("of", "final")
    if of == "final":
        return summary["final_acc"] * 100
    if of == "best":
        return summary["best_acc"] * 100
    if of == "setting":
        value = summary["setting"]
        for part in cite["setting"].split("."):
            value = value[part]
        return float(value)
    frame = pd.read_csv(run / "metrics.csv")
    if of == "round":
        return float(frame.loc[frame["round"] == cite["round"], "test_acc"].iloc[0]) * 100
    if of == "column":
        first, last = cite.get("rounds", [frame["round"].min(), frame["round"].max()])
        values = frame[(frame["round"] >= first) & (frame["round"] <= last)][cite["column"]].dropna()
        return float(getattr(values, cite.get("stat", "mean"))()) * cite.get("scale", 1)
    raise ValueError(f"unknown cite kind of: {of}")


def cited_value(cite: dict, root: Path = EVIDENCE, results: Path = paper.RESULTS_FILE) -> float:
    """The number a cite names, from the kept runs (``run``: one; ``runs``: their mean), the paper's table
    (``paper``: [table, row, column]), or a kept file whose text holds it (``file``; then the cited value itself
    when the file holds its text)."""
    if "paper" in cite:
        table, row, column = cite["paper"]
        (cell,) = [c for c in paper.cells(paper.load_results(results), [table]) if (c.row, c.column) == (row, column)]
        return cell.std if cite.get("of") == "std" else cell.value
    if "file" in cite:
        text = (root.parent / cite["file"]).read_text()
        if str(cite["value"]) not in text:
            raise ValueError(f"{cite['file']} does not hold {cite['value']}")
        return float(cite["value"])
    ref = cite.get("run") or cite.get("runs")
    runs = _cited_runs(root, ref)
    if not runs or ("run" in cite and len(runs) != 1):
        raise ValueError(f"{ref} names {len(runs)} kept runs, not {'one' if 'run' in cite else 'any'}")
    values = [_run_number(r, cite) for r in runs]
    return sum(values) / len(values)


def check_cites(root: str | Path = EVIDENCE, results: str | Path = paper.RESULTS_FILE) -> list[str]:
    """Every number with two decimals that an explanation states (its text and summary) must be among its
    ``cites``, and every cite must equal, at the decimals it is written with, the number its source gives.
    Returns the problems, one line each (none: every cited number comes from a kept run or the paper)."""
    root, results = Path(root), Path(results)
    data = read_shipped_yaml(root / EXPLANATIONS) or {}
    problems = []
    for table, entries in data.items():
        for e in entries:
            where = f"{table} / {e.get('row')} / {e.get('column')}"
            cites = e.get("cites", [])
            written = {str(c["value"]) for c in cites}
            for number in re.findall(NUMBER, e.get("text", "") + " " + e.get("summary", "")):
                if number not in written:
                    problems.append(f"{where}: {number} is stated and not cited")
            for c in cites:
                text = str(c["value"])
                decimals = len(text.split(".")[1]) if "." in text else 0
                try:
                    value = cited_value(c, root, results)
                except (ValueError, KeyError, IndexError, OSError) as err:
                    problems.append(f"{where}: {text}: {err}")
                    continue
                if value is None or abs(value - float(text)) > 0.5 * 10**-decimals + 1e-9:
                    given = "nothing" if value is None else f"{value:.{decimals}f}"
                    problems.append(f"{where}: states {text}, its source gives {given}")
    return problems
