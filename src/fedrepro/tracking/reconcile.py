"""The track step: brings each run's MLflow record in line with its files. It creates a missing record, finishes
one a fault left half logged (metrics are re-sent with the same timestamps, which MLflow deduplicates), deletes
duplicates a killed registration left, records the run's membership in params files and experiments, and ends
an experiment's parent run when all its runs are complete."""

from __future__ import annotations

from pathlib import Path

from fedrepro.run import rundir
from fedrepro.tracking.record import (
    ENTRY_POINT,
    add_membership,
    complete_run,
    flatten,
    log_metrics,
    open_run,
    read_marker,
    round_metrics,
    rows_with_times,
    run_tags,
    source_name,
    system_tags,
    write_marker,
)
from fedrepro.tracking.store import (
    default_uri,
    ensure_experiment,
    experiment_name,
    find_runs,
    lock,
    open_store,
    parent_run,
    prefix_experiments,
    unwritable,
)


def reconcile_run(
    client,
    uri: str,
    run_dir: Path,
    experiment: str,
    parent: str | None,
    membership: str,
    prefix: str = "fedrepro",
    experiment_title: str = "",
    source: str = ENTRY_POINT,
) -> str:
    """Bring one finished run's MLflow record in line with its files. Returns what it did:
    "already" (complete, nothing to add), "repaired" (a half-logged run finished, duplicates deleted,
    grouping added) or "registered" (a new record)."""
    summary = rundir.RunDir(run_dir).read_summary()
    with lock(uri):  # a sqlite store: one registration at a time, so that two steps never split a run
        outcome, run_id = _find_or_open(
            client, uri, run_dir, summary, experiment, parent, membership, prefix, experiment_title, source
        )
        if outcome != "already":
            rows = rows_with_times(run_dir)
            log_metrics(client, run_id, [m for row in rows for m in round_metrics(row)])
            complete_run(client, run_id, run_dir, summary, rows)
    write_marker(run_dir, uri=uri, run_id=run_id, complete=True, error=None)
    return outcome


def _is_active_run(client, run_id: str | None) -> bool:
    if not run_id:
        return False
    try:
        return client.get_run(run_id).info.lifecycle_stage == "active"
    except Exception:  # noqa: BLE001 - gone for good
        return False


def _find_or_open(
    client, uri, run_dir, summary, experiment, parent, membership, prefix, experiment_title, source=ENTRY_POINT
):
    """The run's one record: the complete one, else the oldest (duplicates deleted), else a new one."""
    name = summary["run"]
    found = find_runs(client, prefix_experiments(client, prefix), "fedrepro.run", name)
    complete = [r for r in found if r.data.tags.get("fedrepro.logged") == "complete"]
    keep = (complete or found or [None])[0]
    for extra in found:
        if extra is not keep:  # a registration killed midway left a second record
            client.delete_run(extra.info.run_id)
    if keep is None:
        rows = rows_with_times(run_dir)
        experiment_id = ensure_experiment(client, experiment, uri)
        parent_id = parent_run(client, experiment_id, parent, experiment_title) if parent else None
        start_ms = int((float(rows[0]["wall_time"]) - float(rows[0].get("seconds") or 0)) * 1000) if rows else None
        tags = {
            **system_tags(summary, name, parent_id, source),
            **run_tags(summary),
            "fedrepro.experiments": membership,
        }
        return "registered", open_run(client, experiment_id, name, tags, flatten("", summary["setting"], {}), start_ms)
    add_membership(client, keep, membership)
    if keep.data.tags.get("mlflow.source.name") == ENTRY_POINT != source:  # logged before its params file was known
        client.set_tag(keep.info.run_id, "mlflow.source.name", source)
    if parent and not _is_active_run(client, keep.data.tags.get("mlflow.parentRunId")):
        # unnested (the training job had no manifest yet), or nested under a parent that a concurrent
        # creator on a server deleted as a duplicate
        client.set_tag(
            keep.info.run_id,
            "mlflow.parentRunId",
            parent_run(client, keep.info.experiment_id, parent, experiment_title),
        )
    if keep.data.tags.get("fedrepro.logged") == "complete":
        return ("repaired" if len(found) > 1 else "already"), keep.info.run_id
    return "repaired", keep.info.run_id


def is_tracked(run_dir: Path, uri: str, membership: str) -> bool:
    """The marker says this store holds the run complete, with this membership: nothing to do."""
    marker = read_marker(run_dir)
    return bool(marker.get("complete") and marker.get("uri") == uri and membership in marker.get("members", []))


def track(manifest: dict, runs_dir: str | Path, uri: str | None = None, only: list[str] | None = None) -> dict:
    """Reconcile every run of the manifest that has a summary (or the runs ``only`` names), run by run;
    stop at the first failure to reach or write the store (the next call retries; ``unwritable`` then holds
    the line naming a full or read-only store). Parents of experiments whose runs are all complete are
    terminated."""
    uri = uri or default_uri()
    result = {
        "uri": uri,
        "registered": 0,
        "already": 0,
        "repaired": 0,
        "failed": 0,
        "missing": 0,
        "errors": [],
        "unwritable": None,
    }
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
            outcome = reconcile_run(
                client,
                uri,
                run_dir,
                mlflow_experiment,
                exp_name,
                membership,
                prefix,
                exp.get("title", ""),
                source_name(manifest),
            )
            write_marker(run_dir, members=sorted(set(read_marker(run_dir).get("members", [])) | {membership}))
            result[outcome] += 1
        except Exception as err:  # noqa: BLE001 - reported; the step fails and is retried
            result["errors"].append(f"{run_id}: {type(err).__name__}: {str(err)[:500]}")
            complete_experiments.discard(exp_name)
            result["unwritable"] = unwritable(uri, err)  # a full or read-only store takes no further run either
            if (
                client is None or _unreachable(err) or result["unwritable"]
            ):  # the store is down: do not wait on it once per run
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
            result["unwritable"] = unwritable(uri, err)
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
            children = client.search_runs(
                [exp.experiment_id],
                filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
                max_results=5000,
            )
            if parent.info.status == "RUNNING" and children:
                ends = [c.info.end_time for c in children if c.info.end_time]
                client.set_terminated(parent.info.run_id, "FINISHED", end_time=max(ends) if ends else None)
