"""One run's MLflow record: its parameters, tags, round metrics, inputs and artifacts, and the marker in the
run folder (``mlflow.json``) that says which store holds it and whether it is complete."""

from __future__ import annotations

import contextlib
import functools
import getpass
import json
import math
import tempfile
import time
from pathlib import Path

from fedrepro import records
from fedrepro.run import rundir

BATCH = 1000  # MLflow's limit of metric values per log_batch
MARKER = rundir.MLFLOW  # in the run folder: which store holds the run, and whether it is complete
MLFLOW_STATUS = {"finished": "FINISHED", "diverged": "FAILED", "failed": "FAILED", "interrupted": "KILLED"}
SUMMARY_METRICS = ("final_acc", "best_acc", "final_loss", "e_ludd", "runtime_s")
NOT_METRICS = ("round", "wall_time")


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


def read_marker(run_dir: Path) -> dict:
    try:
        return json.loads(rundir.RunDir(run_dir).mlflow.read_text())
    except (OSError, ValueError):
        return {}


def write_marker(run_dir: Path, **fields) -> None:
    marker = {**read_marker(run_dir), **fields}
    rundir.write_atomic(rundir.RunDir(run_dir).mlflow, json.dumps(marker, indent=2))


ENTRY_POINT = "fedrepro train"


def source_name(manifest: dict | None) -> str:
    """The runs table's Source column: the entry point and the params file(s) that asked for the run
    (MLflow's UI shows a JOB source's name whole; a LOCAL one only after its last '/')."""
    files = (manifest or {}).get("configfiles") or []
    return f"{ENTRY_POINT} · {' '.join(map(str, files))}" if files else ENTRY_POINT


def system_tags(summary_or_setting: dict, run_name: str, parent_id: str | None, source: str = ENTRY_POINT) -> dict:
    commit = str(summary_or_setting.get("git_commit", ""))
    tags = {"fedrepro.run": run_name, "mlflow.source.name": source, "mlflow.source.type": "JOB", "mlflow.user": _user()}
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
    return [
        Metric(k, float(v), stamp, step)
        for k, v in row.items()
        if k not in NOT_METRICS and isinstance(v, (int, float)) and math.isfinite(v)
    ]


def log_metrics(client, run_id: str, metrics: list) -> None:
    for start in range(0, len(metrics), BATCH):
        client.log_batch(run_id, metrics=metrics[start : start + BATCH])


def rows_with_times(run_dir: Path) -> list[dict]:
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
    data = Dataset(
        name=name,
        digest=stable_hash({"dataset": name, **declared}),
        source_type="fedrepro",
        source=json.dumps({"dataset": name}),
        profile=json.dumps(declared),
    )
    profile = {"num_clients": setting.get("num_clients"), "content_hash": partition_hash}
    if partition_dir is not None and (partition_dir / "partition.json").is_file():
        with contextlib.suppress(OSError, ValueError, KeyError):  # a damaged record: the hash alone
            info = records.read_json(partition_dir / "partition.json")
            profile.update(content_hash=info["content_hash"], num_samples=info.get("num_samples"))
            import pandas as pd

            counts = pd.read_csv(partition_dir / "counts.csv", index_col="client")
            profile.update(num_clients=len(counts), client_sizes=[int(n) for n in counts.sum(axis=1)])
    source = {"uri": str(partition_dir.resolve())} if partition_dir is not None else {"partition": partition}
    split = Dataset(
        name=partition,
        digest=profile["content_hash"] or "unknown",
        source_type="local",
        source=json.dumps(source),
        profile=json.dumps(profile),
    )
    return [
        DatasetInput(data, [InputTag("mlflow.data.context", "training")]),
        DatasetInput(split, [InputTag("mlflow.data.context", "partition")]),
    ]


def _partition_dir(run_dir: Path, partition: str, given: Path | None) -> Path:
    # results/runs/<run> -> results/partitions/<partition>, where the workflow keeps the partition of a run
    return given or run_dir.parent.parent / "partitions" / partition


def log_inputs(client, run_id: str, inputs: list) -> None:
    """Each input once: a resumed or reconciled run does not list its data twice."""
    have = {(d.dataset.name, d.dataset.digest) for d in client.get_run(run_id).inputs.dataset_inputs}
    new = [i for i in inputs if (i.dataset.name, i.dataset.digest) not in have]
    if new:
        client.log_inputs(run_id, datasets=new)


def complete_run(
    client, run_id: str, run_dir: Path, summary: dict, rows: list[dict], partition_dir: Path | None = None
) -> None:
    """Everything a finished run's record holds beyond its round metrics; then mark it complete and
    terminate it with its real end time. Safe to repeat."""
    from mlflow.entities import Metric

    end_ms = int(float(rows[-1]["wall_time"]) * 1000) if rows else int(time.time() * 1000)
    summary_metrics = [
        Metric(f"summary.{k}", float(summary[k]), end_ms, 0)
        for k in SUMMARY_METRICS
        if isinstance(summary.get(k), (int, float)) and math.isfinite(summary[k])
    ]
    log_metrics(client, run_id, summary_metrics)
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
        log_inputs(
            client,
            run_id,
            dataset_inputs(
                summary["setting"], summary.get("partition", "-"), partition_dir, summary.get("partition_hash", "")
            ),
        )
    client.set_tag(run_id, "fedrepro.status", summary["status"])
    client.set_tag(run_id, "fedrepro.logged", "complete")
    client.set_terminated(run_id, MLFLOW_STATUS.get(summary["status"], "FAILED"), end_time=end_ms)


def open_run(client, experiment_id: str, run_name: str, tags: dict, params: dict, start_ms: int) -> str:
    from mlflow.entities import Param

    run = client.create_run(experiment_id, start_time=start_ms, tags=tags, run_name=run_name)
    items = [Param(k, v[:6000]) for k, v in params.items()]
    for start in range(0, len(items), 100):  # MLflow's limit of params per log_batch
        client.log_batch(run.info.run_id, params=items[start : start + 100])
    return run.info.run_id


def run_tags(summary: dict) -> dict:
    return {
        "fedrepro.setting_hash": summary["setting_hash"],
        "fedrepro.partition": summary["partition"],
        "fedrepro.partition_hash": summary.get("partition_hash", ""),
        "fedrepro.code_hash": summary.get("code_hash", ""),
        "fedrepro.device": summary.get("device", ""),
        "fedrepro.host": summary.get("host", ""),
    }


def add_membership(client, run, membership: str) -> None:
    have = run.data.tags.get("fedrepro.experiments", "")
    members = [m for m in have.split(",") if m]
    if membership not in members:
        client.set_tag(run.info.run_id, "fedrepro.experiments", ",".join(members + [membership])[:5000])
