"""The MLflow store: a sqlite file by default (made atomically, one creator at a time), a server when
``MLFLOW_TRACKING_URI`` names one; its experiments and the parent runs that group an experiment's runs."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import tempfile
import time
from pathlib import Path

from fedrepro.configure.paramsfile import ROOT
from fedrepro.errors import SetupError

# A dead server must cost seconds, not MLflow's default of 7 retries with exponential backoff (~4 min).
FAIL_FAST_ENV = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}


def default_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ROOT / 'mlflow.db'}"


def experiment_name(manifest: dict) -> str:
    return f"{manifest.get('tracking', {}).get('experiment_prefix', 'fedrepro')}/{manifest['name']}"


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


@contextlib.contextmanager
def lock(uri: str):
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
            raise SetupError(
                f"the MLflow store {db} was left half-migrated (schema {state['revision']}, tables "
                f"{', '.join(state['leftovers']) or '-'}) and holds {state['runs']} runs: back it up "
                f"and repair it with `mlflow db upgrade sqlite:///{db}`"
            )
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
        revision = (
            (con.execute("SELECT version_num FROM alembic_version").fetchone() or [None])[0]
            if "alembic_version" in tables
            else None
        )
        runs = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] if "runs" in tables else 0
    leftovers = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    return {
        "complete": not leftovers and revision == _get_latest_schema_revision(),
        "revision": revision,
        "leftovers": leftovers,
        "runs": runs,
    }


# What sqlite says when its file cannot take a write: a full disk (SQLITE_FULL), a write refused past a size
# limit or by the device (SQLITE_IOERR), a read-only file or folder
SQLITE_UNWRITABLE = ("database or disk is full", "disk I/O error", "readonly database", "unable to open database file")


def unwritable(uri: str, err: Exception) -> str | None:
    """One line naming the store's file and what to do, when ``err`` is a sqlite store's disk or folder refusing
    a write: sqlite's own report, or an OSError on one of the store's files (the database, its lock and
    temporary files, the artifacts beside it); None for any other failure, and for a server's store (its
    failures are the network's)."""
    db = _sqlite_path(uri)
    if db is None:
        return None
    if isinstance(err, OSError):
        where, why = Path(os.path.abspath(err.filename)) if err.filename else None, err.strerror or type(err).__name__
        home = Path(os.path.abspath(db.parent))
        if where is None or not (
            where.parent == home and where.name.lstrip(".").startswith(db.name) or home / "mlartifacts" in where.parents
        ):
            return None
    else:
        where, why = db, next((s for s in SQLITE_UNWRITABLE if s in str(err)), None)
        if why is None:
            return None
    return (
        f"the MLflow store {where} cannot be written ({why}): free space there or make it writable (or name "
        f"another store with --tracking-uri), then `fedrepro track` brings it in line with the runs' folders, "
        f"which are untouched"
    )


def open_store(uri: str):
    """A client whose store answered once: a dead server or a broken store fails here, fast."""
    for key, value in FAIL_FAST_ENV.items():
        os.environ.setdefault(key, value)
    # a failed write reaches fedrepro's callers, which name the store in one line: MLflow's own logged
    # traceback of it would bury that line
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    from mlflow import MlflowClient

    db = _sqlite_path(uri)
    if db is not None:
        with lock(uri):
            _prepare_sqlite(db)
    client = MlflowClient(tracking_uri=uri)
    client.search_experiments(max_results=1)
    return client


# MLflow 3's UI opens an experiment on its GenAI (traces) page unless the experiment says it holds model runs
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


def ensure_experiment(client, name: str, uri: str) -> str:
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


def prefix_experiments(client, prefix: str) -> list[str]:
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
        client.create_run(
            experiment_id,
            run_name=experiment,
            tags={"fedrepro.parent": experiment, "mlflow.note.content": title or experiment},
        )
        found = find_runs(client, [experiment_id], "fedrepro.parent", experiment)
        for extra in found[1:]:
            client.delete_run(extra.info.run_id)
    return found[0].info.run_id
