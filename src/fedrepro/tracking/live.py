"""Live logging: the training job's observer opens the run's record when training starts (or continues it on
a resume), sends the round metrics in batches, and completes the record at the end. Its first failure switches
it off for the rest of the run and is written to the marker; it never raises into the training loop."""

from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path

from fedrepro import records
from fedrepro.run.provenance import git_commit
from fedrepro.tracking.record import (
    ENTRY_POINT,
    MLFLOW_STATUS,
    add_membership,
    complete_run,
    dataset_inputs,
    flatten,
    log_inputs,
    log_metrics,
    open_run,
    read_marker,
    round_metrics,
    run_tags,
    source_name,
    system_tags,
    write_marker,
)
from fedrepro.tracking.store import (
    default_uri,
    ensure_experiment,
    find_runs,
    lock,
    open_store,
    parent_run,
    prefix_experiments,
    unwritable,
)

FLUSH_SECONDS = 10.0


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
            full = unwritable(self.uri, err)  # a full or read-only store: the line names it and what to do
            print(
                f"tracking off for this run: {full}"
                if full
                else f"tracking off for this run ({self.error}); `fedrepro track` reconciles it later",
                flush=True,
            )
            with contextlib.suppress(OSError):
                write_marker(self.run_dir, uri=self.uri, complete=False, error=self.error)
            return None

    return wrapper


class LiveRun:
    """The training job's observer (see ``fedrepro.run.trainer.Trainer.run``): logs the run while it trains."""

    def __init__(
        self,
        run_dir: str | Path,
        uri: str | None = None,
        experiment: str = "fedrepro/runs",
        parent: str | None = None,
        membership: str = "",
        prefix: str = "fedrepro",
        partition_dir: str | Path | None = None,
        flush_seconds: float = FLUSH_SECONDS,
        source: str = ENTRY_POINT,
    ):
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
        write_marker(self.run_dir, uri=self.uri, complete=False, error=None)
        self.client = open_store(self.uri)
        name = self.run_dir.name
        with lock(self.uri):
            found = find_runs(self.client, prefix_experiments(self.client, self.prefix), "fedrepro.run", name)
            if not resumed:  # trained from round 0 again: its record starts again too
                for stale in found:
                    self.client.delete_run(stale.info.run_id)
            if resumed and found:  # continue the record the interrupted job began
                run = found[0]
                self.run_id = run.info.run_id
                add_membership(self.client, run, self.membership)
                self.client.update_run(self.run_id, status="RUNNING")
                self.client.set_tag(self.run_id, "fedrepro.logged", "live")
            else:
                experiment_id = ensure_experiment(self.client, self.experiment, self.uri)
                parent_id = parent_run(self.client, experiment_id, self.parent) if self.parent else None
                setting = trainer.setting
                tags = {
                    **system_tags({"git_commit": git_commit()}, name, parent_id, self.source),
                    "fedrepro.experiments": self.membership,
                    "fedrepro.logged": "live",
                    "fedrepro.setting_hash": _setting_hash(setting),
                    "fedrepro.partition": _partition(setting),
                    "fedrepro.device": str(trainer.device),
                }
                self.run_id = open_run(
                    self.client, experiment_id, name, tags, flatten("", setting, {}), int(time.time() * 1000)
                )
        write_marker(self.run_dir, run_id=self.run_id)
        setting = trainer.setting
        log_inputs(self.client, self.run_id, dataset_inputs(setting, _partition(setting), self.partition_dir))
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
        log_metrics(self.client, self.run_id, batch)
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
        for key, value in run_tags(summary).items():
            self.client.set_tag(self.run_id, key, value)
        complete_run(self.client, self.run_id, self.run_dir, summary, trainer.rows, self.partition_dir)
        members = sorted(set(read_marker(self.run_dir).get("members", [])) | {self.membership})
        write_marker(self.run_dir, complete=True, error=None, members=members)


def live_run(
    run_dir: str | Path,
    uri: str | None,
    experiment: str,
    manifest_path: str | None = None,
    partition_dir: str | Path | None = None,
) -> LiveRun:
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
        holders = [
            name
            for name, exp in manifest["experiments"].items()
            if any(r["id"] == Path(run_dir).name for r in exp["runs"])
        ]
        if holders:
            parent, membership = holders[0], f"{manifest['name']}/{holders[0]}"
    return LiveRun(run_dir, uri, experiment, parent, membership, prefix, partition_dir, source=source_name(manifest))


def _setting_hash(setting: dict) -> str:
    from fedrepro.identity import stable_hash

    return stable_hash(setting)


def _partition(setting: dict) -> str:
    from fedrepro.identity import partition_id

    return partition_id(setting)
