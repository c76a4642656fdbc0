"""A run folder, ``results/runs/<run id>/``: the one owner of its layout, of writing its result files
and of reading them back, and of the run's state.

    summary.json    the run's result and provenance; written last, so it marks a finished run
    metrics.csv     one row per round
    model.pt        the final model (plain ``torch.load``)
    checkpoint.pt   the state of an unfinished run; removed once the summary is written
    cosines.npz     client-update cosine matrices (figures)
    snapshots.npz   models of the rounds the setting lists (figures)
    mlflow.json     which MLflow store holds the run, and whether its record is complete
    fork/kept-<t>.pt   the run's state after t rounds, kept while it trains for a run that forks from it there
    fork/<t>.pt        that state as the workflow's output (the fork rule moves it there); a temporary
                       output, removed once every run that forks from it is done

A run is ``done`` (a summary, finished), ``diverged`` (a summary, its loss became NaN/inf),
``interrupted`` (a checkpoint and no summary: it resumes where it stopped) or ``missing``.
Reading imports neither torch nor pandas up front: the planner and the index read run folders too.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from fedrepro.records import CorruptFileError, read_json

STATES = ("done", "diverged", "interrupted", "missing")
SUMMARY, METRICS, MODEL, CHECKPOINT = "summary.json", "metrics.csv", "model.pt", "checkpoint.pt"
COSINES, SNAPSHOTS, MLFLOW = "cosines.npz", "snapshots.npz", "mlflow.json"
# what a report page is built from (evidence keeps them in git): a few KB a run
RECORD_FILES = (SUMMARY, METRICS)


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all: a kill mid-write leaves the old file (or none)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class RunDir:
    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    @property
    def id(self) -> str:
        return self.root.name

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def model(self) -> Path:
        return self.root / MODEL

    @property
    def checkpoint(self) -> Path:
        return self.root / CHECKPOINT

    @property
    def cosines(self) -> Path:
        return self.root / COSINES

    @property
    def snapshots(self) -> Path:
        return self.root / SNAPSHOTS

    @property
    def mlflow(self) -> Path:
        return self.root / MLFLOW

    def kept_fork(self, round_: int) -> Path:
        return self.root / "fork" / f"kept-{round_}.pt"

    def fork(self, round_: int) -> Path:
        return self.root / "fork" / f"{round_}.pt"

    def artifacts(self) -> list[Path]:
        """The files of a finished run its MLflow record carries, those that exist."""
        return [p for p in (self.summary, self.metrics, self.model, self.cosines) if p.exists()]

    # ------------------------------------------------------------------ state

    def finished(self) -> bool:
        """It has a summary: trained to the end or stopped by divergence, either way not to be trained again."""
        return self.summary.exists()

    def state(self) -> str:
        """done, diverged, interrupted or missing; a corrupt summary is a CorruptFileError naming it."""
        if self.finished():
            return "diverged" if self.read_summary().get("status") == "diverged" else "done"
        return "interrupted" if self.checkpoint.exists() else "missing"

    # ------------------------------------------------------------------ reading

    def read_summary(self) -> dict:
        summary = read_json(self.summary)
        if not isinstance(summary, dict):
            raise CorruptFileError(f"{self.summary}: holds a {type(summary).__name__}, not a run's summary")
        return summary

    def read_metrics(self):
        """metrics.csv as a DataFrame; an unreadable or truncated file is a CorruptFileError naming it."""
        import pandas as pd

        try:
            return pd.read_csv(self.metrics)
        except (OSError, ValueError, pd.errors.ParserError) as err:
            raise CorruptFileError(f"{self.metrics}: cannot be read as CSV ({type(err).__name__}: {err})") from None

    # ------------------------------------------------------------------ writing

    def write_metrics(self, frame) -> None:
        write_atomic(self.metrics, frame.to_csv(index=False))

    def write_summary(self, summary: dict) -> None:
        """Last of a run's files: its presence says the others are complete."""
        write_atomic(self.summary, json.dumps(summary, indent=2, default=float))


def finished_runs(runs_dir: str | Path) -> Iterator[RunDir]:
    """Every run folder under ``runs_dir`` with a summary, in the order of their ids."""
    runs_dir = Path(runs_dir)
    folders = sorted(p for p in runs_dir.iterdir() if p.is_dir()) if runs_dir.is_dir() else []
    yield from (run for run in map(RunDir, folders) if run.finished())
