"""MLflow as a live index of runs. The run's files are the truth; tracking only mirrors them.

Two writers, one MLflow run per run folder (found again by its tag ``fedrepro.run``):

- ``LiveRun``, the training job's observer, opens the run when training starts (or continues it on a
  resume), buffers each round's metrics with the round as step and its real wall-clock time, sends
  them in one ``log_batch`` every ``FLUSH_SECONDS``, and at the end logs the summary, the model and
  the figures and sets the real end time and status. Its first failure (a dead server, a locked
  sqlite) switches it off for the rest of the run and leaves ``mlflow.json`` in the run folder
  saying so; it never raises into the training loop.
- ``reconcile_run`` (the ``track`` step) brings a run's MLflow record in line with its files: it
  creates it, finishes a run that a fault left half logged (metrics are re-sent with the same
  timestamps, which MLflow deduplicates), deletes duplicates a killed registration left, and records
  the run's membership in params files and experiments.

Grouping: an MLflow experiment per params file (``<prefix>/<params name>``) and a parent run per
experiment of that file, the runs nested under it. A run folder is content-addressed and may belong
to several params files; its MLflow run lives where it was first logged, and every experiment it
belongs to is listed in its tag ``fedrepro.experiments`` (filter with ``tags.`fedrepro.experiments`
LIKE '%name%'``). Unset settings (None) are not logged as parameters at all.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import getpass
import json
import math
import os
import sqlite3
import tempfile
import time
from pathlib import Path

from fedrepro import records, rundir
from fedrepro.errors import SetupError
from fedrepro.provenance import git_commit
from fedrepro.spec.paramsfile import ROOT

BATCH = 1000  # MLflow's limit of metric values per log_batch
FLUSH_SECONDS = 10.0
MARKER = rundir.MLFLOW  # in the run folder: which store holds the run, and whether it is complete
# A dead server must cost seconds, not MLflow's default of 7 retries with exponential backoff (~4 min).
FAIL_FAST_ENV = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
MLFLOW_STATUS = {"finished": "FINISHED", "diverged": "FAILED", "failed": "FAILED", "interrupted": "KILLED"}
SUMMARY_METRICS = ("final_acc", "best_acc", "final_loss", "e_ludd", "runtime_s")
NOT_METRICS = ("round", "wall_time")


def default_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ROOT / 'mlflow.db'}"


def experiment_name(manifest: dict) -> str:
    return f"{manifest.get('tracking', {}).get('experiment_prefix', 'fedrepro')}/{manifest['name']}"


def flatten(prefix: str, value, out: dict) -> dict:
    """Nested settings as dotted parameter names; unset values (None) are left out."""
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else k, v, out)
    elif isinstance(value, list):
        out[prefix] = ",".join(map(str, value)) if value else "[]"
    elif value is not None:
        out[prefix] = str(value)
    return out


# ------------------------------------------------------------------ the store


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


@contextlib.contextmanager
def _lock(uri: str):
    """One process at a time creates a sqlite store or a run in it (a server needs no lock)."""
    db = _sqlite_path(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(str(db) + ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _prepare_sqlite(db: Path) -> None:
    """Make a killed schema creation harmless (call under the lock).

    A new store's schema is created in a temporary file beside it and moved into place once complete,
    so a kill midway leaves only a temporary file, removed here next time. A store whose creation was
    killed by an older, non-atomic version (``_alembic_tmp_*`` tables, a schema short of MLflow's head:
    MLflow's migrations are not transactional on sqlite) holds no run yet: it is moved aside and made
    anew. Such a store that does hold runs is left alone with a clear error.
    """
    for stale in db.parent.glob(f".{db.name}.*.tmp*"):
        stale.unlink(missing_ok=True)
    if db.exists():
        state = _sqlite_state(db)
        if state["complete"]:
            return
        if state["runs"]:
            raise SetupError(f"the MLflow store {db} was left half-migrated (schema {state['revision']}, tables "
                               f"{', '.join(state['leftovers']) or '-'}) and holds {state['runs']} runs: back it up "
                               f"and repair it with `mlflow db upgrade sqlite:///{db}`")
        aside = db.with_name(f"{db.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(db, aside)
        print(f"tracking: {db} was an interrupted, empty schema creation; moved to {aside.name}, creating anew")
    from mlflow import MlflowClient
    fd, tmp = tempfile.mkstemp(prefix=f".{db.name}.", suffix=".tmp", dir=db.parent)
    os.close(fd)
    os.unlink(tmp)  # MLflow creates the file itself
    MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments(max_results=1)
    os.replace(tmp, db)


def _sqlite_state(db: Path) -> dict:
    from mlflow.store.db.utils import _get_latest_schema_revision
    with contextlib.closing(sqlite3.connect(db, timeout=20)) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        revision = (con.execute("SELECT version_num FROM alembic_version").fetchone() or [None])[0] \
            if "alembic_version" in tables else None
        runs = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] if "runs" in tables else 0
    leftovers = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    return {"complete": not leftovers and revision == _get_latest_schema_revision(), "revision": revision,
            "leftovers": leftovers, "runs": runs}


def open_store(uri: str):
    """A client whose store answered once: a dead server or a broken store fails here, fast."""
    for key, value in FAIL_FAST_ENV.items():
        os.environ.setdefault(key, value)
    from mlflow import MlflowClient
    db = _sqlite_path(uri)
    if db is not None:
        with _lock(uri):
            _prepare_sqlite(db)
    client = MlflowClient(tracking_uri=uri)
    client.search_experiments(max_results=1)
    return client


# MLflow 3's UI opens an experiment on its GenAI (traces) page unless the experiment says it holds model runs
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


def _experiment_id(client, name: str, uri: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    db = _sqlite_path(uri)
    # next to a sqlite store; a server keeps (and serves) the artifacts itself
    location = (db.parent / "mlartifacts").resolve().as_uri() if db is not None else None
    try:
        return client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_TAGS)
    except Exception:  # noqa: BLE001 - another job created it first
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def _prefix_experiments(client, prefix: str) -> list[str]:
    return [e.experiment_id for e in client.search_experiments(filter_string=f"name LIKE '{prefix}/%'")]


def find_runs(client, experiment_ids: list[str], tag: str, value: str) -> list:
    """Runs carrying ``tag = value``, oldest first (the oldest is the one to keep)."""
    if not experiment_ids:
        return []
    found = client.search_runs(experiment_ids, filter_string=f"tags.`{tag}` = '{value}'", max_results=50)
    return sorted(found, key=lambda r: (r.info.start_time or 0, r.info.run_id))


def parent_run(client, experiment_id: str, experiment: str, title: str = "") -> str:
    """The run that groups one experiment's runs; concurrent creators keep the oldest."""
    found = find_runs(client, [experiment_id], "fedrepro.parent", experiment)
    if not found:
        client.create_run(experiment_id, run_name=experiment,
                          tags={"fedrepro.parent": experiment, "mlflow.note.content": title or experiment})
        found = find_runs(client, [experiment_id], "fedrepro.parent", experiment)
        for extra in found[1:]:
            client.delete_run(extra.info.run_id)
    return found[0].info.run_id


# ------------------------------------------------------------------ one run's record


def _marker(run_dir: Path) -> dict:
    try:
        return json.loads(rundir.RunDir(run_dir).mlflow.read_text())
    except (OSError, ValueError):
        return {}


def _write_marker(run_dir: Path, **fields) -> None:
    marker = {**_marker(run_dir), **fields}
    rundir.write_atomic(rundir.RunDir(run_dir).mlflow, json.dumps(marker, indent=2))


ENTRY_POINT = "fedrepro train"


def source_name(manifest: dict | None) -> str:
    """The runs table's Source column: the entry point and the params file(s) that asked for the run
    (MLflow's UI shows a JOB source's name whole; a LOCAL one only after its last '/')."""
    files = (manifest or {}).get("configfiles") or []
    return f"{ENTRY_POINT} · {' '.join(map(str, files))}" if files else ENTRY_POINT


def system_tags(summary_or_setting: dict, run_name: str, parent_id: str | None, source: str = ENTRY_POINT) -> dict:
    commit = str(summary_or_setting.get("git_commit", ""))
    tags = {"fedrepro.run": run_name, "mlflow.source.name": source, "mlflow.source.type": "JOB",
            "mlflow.user": _user()}
    if commit and commit != "unknown":
        tags["mlflow.source.git.commit"] = commit.removesuffix("-dirty")
        tags["fedrepro.git_dirty"] = str(commit.endswith("-dirty")).lower()
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
    return tags


@functools.cache
def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def round_metrics(row: dict) -> list:
    """One metrics.csv row as MLflow metrics: step = round, timestamp = when the round ended."""
    from mlflow.entities import Metric
    stamp = int(float(row["wall_time"]) * 1000)
    step = int(row["round"])
    return [Metric(k, float(v), stamp, step) for k, v in row.items()
            if k not in NOT_METRICS and isinstance(v, (int, float)) and math.isfinite(v)]


def _log_metrics(client, run_id: str, metrics: list) -> None:
    for start in range(0, len(metrics), BATCH):
        client.log_batch(run_id, metrics=metrics[start:start + BATCH])


def _rows_with_times(run_dir: Path) -> list[dict]:
    """metrics.csv rows; a run written before rows carried ``wall_time`` gets it back from the
    summary's modification time and the rounds' durations."""
    import pandas as pd
    run = rundir.RunDir(run_dir)
    frame = run.read_metrics()
    if "wall_time" not in frame or frame["wall_time"].isna().any():
        end = run.summary.stat().st_mtime
        seconds = frame["seconds"].fillna(0.0) if "seconds" in frame else pd.Series(0.0, index=frame.index)
        frame["wall_time"] = end - seconds[::-1].cumsum()[::-1] + seconds
    return frame.to_dict("records")


def _curves_figure(rows: list[dict], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rounds = [r["round"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for key, ax in (("test_acc", axes[0]), ("train_loss", axes[1])):
        points = [(t, r[key]) for t, r in zip(rounds, rows) if isinstance(r.get(key), float) and math.isfinite(r[key])]
        if points:
            ax.plot(*zip(*points), marker="." if len(points) < 30 else None)
        ax.set_xlabel("round")
        ax.set_title(key)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def dataset_inputs(setting: dict, partition: str, partition_dir: Path | None, partition_hash: str = "") -> list:
    """The run's data as MLflow dataset inputs, for the runs table's Dataset column and for filtering
    (``dataset.name``, ``dataset.digest``): the dataset (digest: its declared sizes, the files themselves
    are checksum-verified at download) and the partition (digest: its content hash; profile: the client
    counts), read from the partition folder when it is there."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    from fedrepro.catalog import DATASETS
    from fedrepro.identity import stable_hash
    name = setting["dataset"]
    declared = {k: DATASETS[name][k] for k in ("train_size", "test_size", "num_classes") if k in DATASETS[name]}
    data = Dataset(name=name, digest=stable_hash({"dataset": name, **declared}), source_type="fedrepro",
                   source=json.dumps({"dataset": name}), profile=json.dumps(declared))
    profile = {"num_clients": setting.get("num_clients"), "content_hash": partition_hash}
    if partition_dir is not None and (partition_dir / "partition.json").is_file():
        with contextlib.suppress(OSError, ValueError, KeyError):  # a damaged record: the hash alone
            info = records.read_json(partition_dir / "partition.json")
            profile.update(content_hash=info["content_hash"], num_samples=info.get("num_samples"))
            import pandas as pd
            counts = pd.read_csv(partition_dir / "counts.csv", index_col="client")
            profile.update(num_clients=len(counts), client_sizes=[int(n) for n in counts.sum(axis=1)])
    source = {"uri": str(partition_dir.resolve())} if partition_dir is not None else {"partition": partition}
    split = Dataset(name=partition, digest=profile["content_hash"] or "unknown", source_type="local",
                    source=json.dumps(source), profile=json.dumps(profile))
    return [DatasetInput(data, [InputTag("mlflow.data.context", "training")]),
            DatasetInput(split, [InputTag("mlflow.data.context", "partition")])]


def _partition_dir(run_dir: Path, partition: str, given: Path | None) -> Path:
    # results/runs/<run> -> results/partitions/<partition>, where the workflow keeps the partition of a run
    return given or run_dir.parent.parent / "partitions" / partition


def _log_inputs(client, run_id: str, inputs: list) -> None:
    """Each input once: a resumed or reconciled run does not list its data twice."""
    have = {(d.dataset.name, d.dataset.digest) for d in client.get_run(run_id).inputs.dataset_inputs}
    new = [i for i in inputs if (i.dataset.name, i.dataset.digest) not in have]
    if new:
        client.log_inputs(run_id, datasets=new)


def complete_run(client, run_id: str, run_dir: Path, summary: dict, rows: list[dict],
                 partition_dir: Path | None = None) -> None:
    """Everything a finished run's record holds beyond its round metrics; then mark it complete and
    terminate it with its real end time. Safe to repeat."""
    from mlflow.entities import Metric
    end_ms = int(float(rows[-1]["wall_time"]) * 1000) if rows else int(time.time() * 1000)
    summary_metrics = [Metric(f"summary.{k}", float(summary[k]), end_ms, 0) for k in SUMMARY_METRICS
                       if isinstance(summary.get(k), (int, float)) and math.isfinite(summary[k])]
    _log_metrics(client, run_id, summary_metrics)
    for path in rundir.RunDir(run_dir).artifacts():
        client.log_artifact(run_id, str(path))
    with tempfile.TemporaryDirectory() as tmp:
        if rows:
            client.log_artifact(run_id, str(_curves_figure(rows, Path(tmp) / "curves.png")), "figures")
    partition_dir = _partition_dir(run_dir, summary.get("partition", "-"), partition_dir)
    heatmap = partition_dir / "heatmap.png"
    if heatmap.exists():
        client.log_artifact(run_id, str(heatmap), "figures")
    if "dataset" in summary.get("setting", {}):
        _log_inputs(client, run_id, dataset_inputs(summary["setting"], summary.get("partition", "-"), partition_dir,
                                                    summary.get("partition_hash", "")))
    client.set_tag(run_id, "fedrepro.status", summary["status"])
    client.set_tag(run_id, "fedrepro.logged", "complete")
    client.set_terminated(run_id, MLFLOW_STATUS.get(summary["status"], "FAILED"), end_time=end_ms)


def _open_run(client, experiment_id: str, run_name: str, tags: dict, params: dict, start_ms: int) -> str:
    from mlflow.entities import Param
    run = client.create_run(experiment_id, start_time=start_ms, tags=tags, run_name=run_name)
    items = [Param(k, v[:6000]) for k, v in params.items()]
    for start in range(0, len(items), 100):  # MLflow's limit of params per log_batch
        client.log_batch(run.info.run_id, params=items[start:start + 100])
    return run.info.run_id


def _run_tags(summary: dict) -> dict:
    return {"fedrepro.setting_hash": summary["setting_hash"], "fedrepro.partition": summary["partition"],
            "fedrepro.partition_hash": summary.get("partition_hash", ""),
            "fedrepro.code_hash": summary.get("code_hash", ""), "fedrepro.device": summary.get("device", ""),
            "fedrepro.host": summary.get("host", "")}


def _add_membership(client, run, membership: str) -> None:
    have = run.data.tags.get("fedrepro.experiments", "")
    members = [m for m in have.split(",") if m]
    if membership not in members:
        client.set_tag(run.info.run_id, "fedrepro.experiments", ",".join(members + [membership])[:5000])


def reconcile_run(client, uri: str, run_dir: Path, experiment: str, parent: str | None, membership: str,
                  prefix: str = "fedrepro", experiment_title: str = "", source: str = ENTRY_POINT) -> str:
    """Bring one finished run's MLflow record in line with its files. Returns what it did:
    "already" (complete, nothing to add), "repaired" (a half-logged run finished, duplicates deleted,
    grouping added) or "registered" (a new record)."""
    summary = rundir.RunDir(run_dir).read_summary()
    with _lock(uri):  # a sqlite store: one registration at a time, so that two steps never split a run
        outcome, run_id = _find_or_open(client, uri, run_dir, summary, experiment, parent, membership, prefix,
                                        experiment_title, source)
        if outcome != "already":
            rows = _rows_with_times(run_dir)
            _log_metrics(client, run_id, [m for row in rows for m in round_metrics(row)])
            complete_run(client, run_id, run_dir, summary, rows)
    _write_marker(run_dir, uri=uri, run_id=run_id, complete=True, error=None)
    return outcome


def _is_active_run(client, run_id: str | None) -> bool:
    if not run_id:
        return False
    try:
        return client.get_run(run_id).info.lifecycle_stage == "active"
    except Exception:  # noqa: BLE001 - gone for good
        return False


def _find_or_open(client, uri, run_dir, summary, experiment, parent, membership, prefix, experiment_title,
                  source=ENTRY_POINT):
    """The run's one record: the complete one, else the oldest (duplicates deleted), else a new one."""
    name = summary["run"]
    found = find_runs(client, _prefix_experiments(client, prefix), "fedrepro.run", name)
    complete = [r for r in found if r.data.tags.get("fedrepro.logged") == "complete"]
    keep = (complete or found or [None])[0]
    for extra in found:
        if extra is not keep:  # a registration killed midway left a second record
            client.delete_run(extra.info.run_id)
    if keep is None:
        rows = _rows_with_times(run_dir)
        experiment_id = _experiment_id(client, experiment, uri)
        parent_id = parent_run(client, experiment_id, parent, experiment_title) if parent else None
        start_ms = int((float(rows[0]["wall_time"]) - float(rows[0].get("seconds") or 0)) * 1000) if rows else None
        tags = {**system_tags(summary, name, parent_id, source), **_run_tags(summary),
                "fedrepro.experiments": membership}
        return "registered", _open_run(client, experiment_id, name, tags, flatten("", summary["setting"], {}), start_ms)
    _add_membership(client, keep, membership)
    if keep.data.tags.get("mlflow.source.name") == ENTRY_POINT != source:  # logged before its params file was known
        client.set_tag(keep.info.run_id, "mlflow.source.name", source)
    if parent and not _is_active_run(client, keep.data.tags.get("mlflow.parentRunId")):
        # unnested (the training job had no manifest yet), or nested under a parent that a concurrent
        # creator on a server deleted as a duplicate
        client.set_tag(keep.info.run_id, "mlflow.parentRunId",
                       parent_run(client, keep.info.experiment_id, parent, experiment_title))
    if keep.data.tags.get("fedrepro.logged") == "complete":
        return ("repaired" if len(found) > 1 else "already"), keep.info.run_id
    return "repaired", keep.info.run_id


# ------------------------------------------------------------------ live logging


def _guarded(method):
    """Tracking never raises into training: the first failure switches the run's tracking off and
    is written to the marker, for the track step to reconcile."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self.client is None and method.__name__ != "started":
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as err:  # noqa: BLE001
            self.client = None
            self.error = f"{method.__name__}: {type(err).__name__}: {str(err)[:500]}"
            print(f"tracking off for this run ({self.error}); `fedrepro track` reconciles it later", flush=True)
            with contextlib.suppress(OSError):
                _write_marker(self.run_dir, uri=self.uri, complete=False, error=self.error)
            return None
    return wrapper


class LiveRun:
    """The training job's observer (see ``engine.Trainer.run``): logs the run while it trains."""

    def __init__(self, run_dir: str | Path, uri: str | None = None, experiment: str = "fedrepro/runs",
                 parent: str | None = None, membership: str = "", prefix: str = "fedrepro",
                 partition_dir: str | Path | None = None, flush_seconds: float = FLUSH_SECONDS,
                 source: str = ENTRY_POINT):
        self.run_dir = Path(run_dir)
        self.uri = uri or default_uri()
        self.experiment, self.parent, self.prefix = experiment, parent, prefix
        self.membership = membership or experiment
        self.partition_dir = Path(partition_dir) if partition_dir else None
        self.flush_seconds = flush_seconds
        self.source = source
        self.client = None
        self.run_id: str | None = None
        self.error: str | None = None
        self.pending: list = []
        self.last_flush = 0.0

    @_guarded
    def started(self, trainer, resumed: bool) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _write_marker(self.run_dir, uri=self.uri, complete=False, error=None)
        self.client = open_store(self.uri)
        name = self.run_dir.name
        with _lock(self.uri):
            found = find_runs(self.client, _prefix_experiments(self.client, self.prefix), "fedrepro.run", name)
            if not resumed:  # trained from round 0 again: its record starts again too
                for stale in found:
                    self.client.delete_run(stale.info.run_id)
            if resumed and found:  # continue the record the interrupted job began
                run = found[0]
                self.run_id = run.info.run_id
                _add_membership(self.client, run, self.membership)
                self.client.update_run(self.run_id, status="RUNNING")
                self.client.set_tag(self.run_id, "fedrepro.logged", "live")
            else:
                experiment_id = _experiment_id(self.client, self.experiment, self.uri)
                parent_id = parent_run(self.client, experiment_id, self.parent) if self.parent else None
                setting = trainer.setting
                tags = {**system_tags({"git_commit": git_commit()}, name, parent_id, self.source),
                        "fedrepro.experiments": self.membership, "fedrepro.logged": "live",
                        "fedrepro.setting_hash": _setting_hash(setting), "fedrepro.partition": _partition(setting),
                        "fedrepro.device": str(trainer.device)}
                self.run_id = _open_run(self.client, experiment_id, name, tags, flatten("", setting, {}),
                                        int(time.time() * 1000))
        _write_marker(self.run_dir, run_id=self.run_id)
        setting = trainer.setting
        _log_inputs(self.client, self.run_id, dataset_inputs(setting, _partition(setting), self.partition_dir))
        if resumed and trainer.rows:  # rounds logged before the interruption are sent again: deduplicated
            self.pending += [m for row in trainer.rows if "wall_time" in row for m in round_metrics(row)]
        self.flush(force=True)

    @_guarded
    def round_done(self, trainer, row: dict) -> None:
        self.pending += round_metrics(row)
        self.flush()

    @_guarded
    def flush(self, force: bool = False) -> None:
        if not self.pending or (not force and time.monotonic() - self.last_flush < self.flush_seconds):
            return
        batch, self.pending = self.pending, []
        _log_metrics(self.client, self.run_id, batch)
        self.last_flush = time.monotonic()

    @_guarded
    def ended(self, trainer, status: str, summary: dict | None) -> None:
        self.flush(force=True)
        if self.client is None:
            return
        if summary is None:  # interrupted or failed: no summary; a resume continues this record
            self.client.set_tag(self.run_id, "fedrepro.status", status)
            self.client.set_terminated(self.run_id, MLFLOW_STATUS[status])
            return
        for key, value in _run_tags(summary).items():
            self.client.set_tag(self.run_id, key, value)
        complete_run(self.client, self.run_id, self.run_dir, summary, trainer.rows, self.partition_dir)
        members = sorted(set(_marker(self.run_dir).get("members", [])) | {self.membership})
        _write_marker(self.run_dir, complete=True, error=None, members=members)


def live_run(run_dir: str | Path, uri: str | None, experiment: str, manifest_path: str | None = None,
             partition_dir: str | Path | None = None) -> LiveRun:
    """The observer a training job gets: grouped by the params file's manifest when it is there yet
    (the job does not depend on it, so that a run shared by several params files is not rerun);
    otherwise unnested, and the track step nests it."""
    parent, membership, prefix = None, "", experiment.split("/")[0]
    try:
        manifest = records.read_json(manifest_path) if manifest_path else None
    except (OSError, ValueError):
        manifest = None
    if manifest:
        prefix = manifest.get("tracking", {}).get("experiment_prefix", prefix)
        holders = [name for name, exp in manifest["experiments"].items()
                   if any(r["id"] == Path(run_dir).name for r in exp["runs"])]
        if holders:
            parent, membership = holders[0], f"{manifest['name']}/{holders[0]}"
    return LiveRun(run_dir, uri, experiment, parent, membership, prefix, partition_dir, source=source_name(manifest))


def _setting_hash(setting: dict) -> str:
    from fedrepro.identity import stable_hash
    return stable_hash(setting)


def _partition(setting: dict) -> str:
    from fedrepro.identity import partition_id
    return partition_id(setting)


# ------------------------------------------------------------------ the track step


def is_tracked(run_dir: Path, uri: str, membership: str) -> bool:
    """The marker says this store holds the run complete, with this membership: nothing to do."""
    marker = _marker(run_dir)
    return bool(marker.get("complete") and marker.get("uri") == uri and membership in marker.get("members", []))


def track(manifest: dict, runs_dir: str | Path, uri: str | None = None, only: list[str] | None = None) -> dict:
    """Reconcile every run of the manifest that has a summary (or the runs ``only`` names), run by run;
    stop at the first failure to reach the store (the next call retries). Parents of experiments
    whose runs are all complete are terminated."""
    uri = uri or default_uri()
    result = {"uri": uri, "registered": 0, "already": 0, "repaired": 0, "failed": 0, "missing": 0, "errors": []}
    prefix = manifest.get("tracking", {}).get("experiment_prefix", "fedrepro")
    mlflow_experiment = experiment_name(manifest)
    todo = []
    for exp_name, exp in manifest["experiments"].items():
        for run in exp["runs"]:
            if only is None or run["id"] in only:
                todo.append((exp_name, exp, run["id"]))
    client = None
    complete_experiments = set(manifest["experiments"])
    for exp_name, exp, run_id in todo:
        run_dir = Path(runs_dir) / run_id
        membership = f"{manifest['name']}/{exp_name}"
        if not rundir.RunDir(run_dir).finished():
            result["missing"] += 1
            complete_experiments.discard(exp_name)
            continue
        if is_tracked(run_dir, uri, membership):  # the training job logged it completely: no store call
            result["already"] += 1
            continue
        try:
            client = client or open_store(uri)
            outcome = reconcile_run(client, uri, run_dir, mlflow_experiment, exp_name, membership, prefix,
                                    exp.get("title", ""), source_name(manifest))
            _write_marker(run_dir, members=sorted(set(_marker(run_dir).get("members", [])) | {membership}))
            result[outcome] += 1
        except Exception as err:  # noqa: BLE001 - reported; the step fails and is retried
            result["errors"].append(f"{run_id}: {type(err).__name__}: {str(err)[:500]}")
            complete_experiments.discard(exp_name)
            if client is None or _unreachable(err):  # the store is down: do not wait on it once per run
                result["failed"] = len(todo) - sum(result[k] for k in ("registered", "already", "repaired", "missing"))
                return result
            result["failed"] += 1
    if only is None:
        try:
            client = client or open_store(uri)
            _close_parents(client, mlflow_experiment, complete_experiments)
        except Exception as err:  # noqa: BLE001
            result["failed"] += 1
            result["errors"].append(f"parent runs: {type(err).__name__}: {str(err)[:500]}")
    return result


def _unreachable(err: Exception) -> bool:
    text = f"{type(err).__name__} {err}"
    return any(s in text for s in ("Connection", "Max retries", "timed out", "database is locked", "unable to open"))


def _close_parents(client, mlflow_experiment: str, experiments: set[str]) -> None:
    """A parent run ends, FINISHED, when every run of its experiment is complete."""
    exp = client.get_experiment_by_name(mlflow_experiment)
    if exp is None:
        return
    for name in sorted(experiments):
        for parent in find_runs(client, [exp.experiment_id], "fedrepro.parent", name)[:1]:
            children = client.search_runs([exp.experiment_id],
                                          filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
                                          max_results=5000)
            if parent.info.status == "RUNNING" and children:
                ends = [c.info.end_time for c in children if c.info.end_time]
                client.set_terminated(parent.info.run_id, "FINISHED", end_time=max(ends) if ends else None)
