"""MLflow: a training job logs its run live (and a resume continues it); the track step reconciles
after a failed run, a dead server and a killed registration; a killed schema creation leaves a usable
store; concurrent registering processes lose no run and no metric, into one sqlite store and into an
``mlflow server`` the test starts on 127.0.0.1. A tracking failure never raises."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import BIN, file_size_limit, free_port, make_partition, subprocess_env
from fedrepro import cli
from fedrepro.tracking import live, reconcile, record, store

WORKERS = 8
ROUNDS = 25
METRICS = ["test_acc", "test_loss", "train_loss", "e_lud", "global_norm", "lr"]


@pytest.fixture(scope="module")
def store_template(tmp_path_factory) -> Path:
    """An empty sqlite store, made once: MLflow's schema migrations take seconds to minutes."""
    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    store.open_store(f"sqlite:///{db}")
    return db


@pytest.fixture
def sqlite_uri(tmp_path, store_template) -> str:
    """A private copy of the empty store."""
    shutil.copy(store_template, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _fake_run(runs_dir: Path, name: str, status: str = "finished") -> dict:
    """A finished run's files, as the engine writes them."""
    folder = runs_dir / name
    folder.mkdir(parents=True)
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # the same data in every process
    frame = pd.DataFrame({"round": np.arange(1, ROUNDS + 1), **{m: rng.random(ROUNDS) for m in METRICS}})
    frame.loc[3, "test_acc"] = float("nan")  # not evaluated that round: not logged
    frame.to_csv(folder / "metrics.csv", index=False)
    setting = {"algorithm": "fedavg", "plugins": [], "num_clients": 10, "client": {"lr": 0.1}}
    summary = {
        "run": name,
        "status": status,
        "setting": setting,
        "setting_hash": "h" + name,
        "partition": "p",
        "partition_hash": "ph",
        "git_commit": "abc",
        "device": "cpu",
        "final_acc": 0.5,
        "best_acc": 0.6,
        "final_loss": 1.0,
        "e_ludd": 0.1,
        "runtime_s": 1.0,
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    return {"id": name, "variant": {}, "label": name, "seed": 1, "partition": "p", "setting": setting}


def _manifest(runs: list[dict]) -> dict:
    return {
        "name": "load",
        "title": "load",
        "tracking": {"experiment_prefix": "fedrepro"},
        "experiments": {"load": {"title": "load", "description": "", "grid": {}, "runs": runs}},
    }


WORKER = textwrap.dedent("""
    import json, sys
    from fedrepro.tracking import reconcile
    manifest, runs_dir, uri, out = sys.argv[1:5]
    result = reconcile.track(json.load(open(manifest)), runs_dir, uri)
    json.dump(result, open(out, "w"))
""")


def _expected_metric_counts(run_dir: Path) -> dict[str, int]:
    frame = pd.read_csv(run_dir / "metrics.csv")
    return {m: int(frame[m].map(math.isfinite).sum()) for m in METRICS}


def _register_concurrently(tmp_path: Path, uri: str, shared: bool) -> list[dict]:
    runs_dir = tmp_path / "runs"
    common = _fake_run(runs_dir, "shared-run") if shared else None
    procs = []
    for i in range(WORKERS):
        runs = [_fake_run(runs_dir, f"run-{i}")] + ([common] if common else [])
        manifest = tmp_path / f"manifest-{i}.json"
        manifest.write_text(json.dumps(_manifest(runs)))
        out = tmp_path / f"result-{i}.json"
        procs.append(
            (
                subprocess.Popen(
                    [sys.executable, "-c", WORKER, str(manifest), str(runs_dir), uri, str(out)],
                    env=subprocess_env(),
                    stderr=subprocess.PIPE,
                    text=True,
                ),
                out,
            )
        )
    results = []
    for proc, out in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.read_text()))
    return results


def _check_store(uri: str, runs_dir: Path, expected_runs: set[str]) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("fedrepro/load")
    assert exp is not None
    found = client.search_runs([exp.experiment_id], "tags.`fedrepro.run` != ''", max_results=1000)
    names = [r.data.tags["fedrepro.run"] for r in found]
    assert sorted(names) == sorted(expected_runs), "every run exactly once"
    for mlrun in found:
        assert mlrun.info.status == "FINISHED"
        expected = _expected_metric_counts(runs_dir / mlrun.data.tags["fedrepro.run"])
        for key, count in expected.items():
            history = client.get_metric_history(mlrun.info.run_id, key)
            assert len(history) == count, (mlrun.data.tags["fedrepro.run"], key)
            assert sorted(m.step for m in history) == sorted(set(m.step for m in history))
        assert mlrun.data.metrics["summary.final_acc"] == 0.5
        assert mlrun.data.params["client.lr"] == "0.1"
        artifacts = {a.path for a in client.list_artifacts(mlrun.info.run_id)}
        assert {"summary.json", "metrics.csv", "figures"} <= artifacts


@pytest.mark.slow
def test_concurrent_registration_into_one_sqlite_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    results = _register_concurrently(tmp_path, uri, shared=True)
    assert sum(r["failed"] for r in results) == 0, [r["errors"] for r in results]
    assert sum(r["registered"] for r in results) == WORKERS + 1, "the shared run is registered once"
    assert sum(r["already"] for r in results) == WORKERS - 1
    assert sum(r["repaired"] for r in results) == 0
    _check_store(uri, tmp_path / "runs", {f"run-{i}" for i in range(WORKERS)} | {"shared-run"})


def _start_mlflow_server(tmp_path: Path, port: int, log) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(BIN / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{tmp_path / 'server.db'}",
            "--artifacts-destination",
            str(tmp_path / "artifacts"),
            "--workers",
            "1",
        ],
        env=subprocess_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    """The server and the workers it forked share the session we gave it: stop exactly that group."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.fixture
def mlflow_server(tmp_path):
    """An ``mlflow server`` on 127.0.0.1, stopped by its PID after the test. The port is free when chosen,
    but another process may bind it before the server does: then the server exits, and it starts again
    on another port (three tries)."""
    log_path = tmp_path / "server.log"
    proc = None
    try:
        for _ in range(3):
            port = free_port()
            with open(log_path, "w") as log:
                proc = _start_mlflow_server(tmp_path, port, log)
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 180
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    pass
                time.sleep(0.5)
            else:
                text = log_path.read_text()
                _stop(proc)
                if "already in use" in text or "Address in use" in text:
                    continue
                pytest.fail("mlflow server did not start:\n" + text[-3000:])
            break
        else:
            pytest.fail("mlflow server found no free port in three tries:\n" + log_path.read_text()[-3000:])
        yield url
    finally:
        if proc is not None:
            _stop(proc)


@pytest.mark.slow
def test_concurrent_registration_into_an_mlflow_server(tmp_path, mlflow_server):
    results = _register_concurrently(tmp_path, mlflow_server, shared=False)
    assert sum(r["failed"] for r in results) == 0, [r["errors"] for r in results]
    assert sum(r["registered"] for r in results) == WORKERS
    _check_store(mlflow_server, tmp_path / "runs", {f"run-{i}" for i in range(WORKERS)})
    # registering again adds nothing
    again = reconcile.track(_manifest([_fake_run(tmp_path / "runs2", "run-0")]), tmp_path / "runs", mlflow_server)
    assert again["already"] == 1 and again["registered"] == 0


def test_register_is_idempotent_and_keeps_diverged_runs(tmp_path, sqlite_uri):
    uri = sqlite_uri
    runs = [_fake_run(tmp_path / "runs", "ok"), _fake_run(tmp_path / "runs", "bad", status="diverged")]
    first = reconcile.track(_manifest(runs), tmp_path / "runs", uri)
    second = reconcile.track(_manifest(runs), tmp_path / "runs", uri)
    assert (first["registered"], second["registered"], second["already"]) == (2, 0, 2)
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.search_runs(
        [client.get_experiment_by_name("fedrepro/load").experiment_id], "tags.`fedrepro.run` != ''"
    )
    assert sorted(r.data.tags["fedrepro.status"] for r in found) == ["diverged", "finished"]
    assert sorted(r.info.status for r in found) == ["FAILED", "FINISHED"]


def test_tracking_failure_never_raises(tmp_path, sqlite_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    runs = [_fake_run(tmp_path / "runs", "ok")]
    # nothing listens on port 9: every call fails; the result says so and nothing raises
    result = reconcile.track(_manifest(runs), tmp_path / "runs", "http://127.0.0.1:9")
    assert result["failed"] == 1 and result["registered"] == 0 and result["errors"]
    missing = reconcile.track(_manifest([{"id": "absent"}]), tmp_path / "runs", sqlite_uri)
    assert missing["missing"] == 1 and missing["failed"] == 0


# --------------------------------------------------------------------------- live logging, real runs

TINY = {
    "dataset": "fmnist",
    "model": "mlp",
    "num_clients": 4,
    "participation": 0.5,
    "rounds": 6,
    "batch_size": 50,
    "device": "cpu",
    "eval_every": 1,
    "client": {"lr": 0.05},
    "partition": {"kind": "iid", "seed": 1},
}


@pytest.fixture(scope="module")
def partition_dir(tiny_data_root, tmp_path_factory):
    return make_partition(tiny_data_root, tmp_path_factory.mktemp("part"), num_clients=4)


def _tiny_manifest(tmp_path: Path, run_ids: list[str], name: str = "tinyfile") -> Path:
    runs = [{"id": r, "variant": {}, "label": r, "seed": 1, "partition": "p", "setting": TINY} for r in run_ids]
    manifest = {
        "name": name,
        "title": name,
        "tracking": {"experiment_prefix": "fedrepro"},
        "experiments": {"table1": {"title": "Table 1", "description": "", "grid": {}, "runs": runs}},
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(manifest))
    return path


def _train(
    out: Path, partition: Path, data_root: Path, uri: str, manifest: Path | None, *extra: str, setting: dict = TINY
) -> None:
    args = [
        "train",
        "--setting",
        json.dumps(setting),
        "--partition",
        str(partition),
        "--data-root",
        str(data_root),
        "--out",
        str(out),
        "--no-progress",
        "--threads",
        "1",
        "--mlflow-experiment",
        "fedrepro/tinyfile",
        "--tracking-uri",
        uri,
        *extra,
    ]
    cli.main(args + (["--mlflow-manifest", str(manifest)] if manifest else []))


def _records(client, name: str) -> list:
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids, f"tags.`fedrepro.run` = '{name}'")


def test_a_training_job_logs_its_run_live_and_a_resume_continues_it(
    tmp_path, sqlite_uri, partition_dir, tiny_data_root
):
    from mlflow import MlflowClient

    uri = sqlite_uri
    out = tmp_path / "runs" / "tiny-run"
    manifest = _tiny_manifest(tmp_path, ["tiny-run"])
    _train(out, partition_dir, tiny_data_root, uri, manifest, "--stop-after", "3")
    client = MlflowClient(tracking_uri=uri)
    (during,) = _records(client, "tiny-run")
    # while the run is cut off after 3 rounds, MLflow already holds those rounds, stamped when they ended
    history = client.get_metric_history(during.info.run_id, "test_acc")
    assert sorted(m.step for m in history) == [1, 2, 3]
    assert during.data.tags["fedrepro.status"] == "interrupted" and during.info.status == "KILLED"
    assert during.info.start_time <= min(m.timestamp for m in history)

    _train(out, partition_dir, tiny_data_root, uri, manifest)
    (run,) = _records(client, "tiny-run")
    assert run.info.run_id == during.info.run_id, "the resume continued the same MLflow run"
    assert run.info.status == "FINISHED" and run.data.tags["fedrepro.status"] == "finished"
    frame = pd.read_csv(out / "metrics.csv")
    for key in ("test_acc", "train_loss", "e_lud"):
        history = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(frame["round"]), key
        assert [m.timestamp for m in sorted(history, key=lambda m: m.step)] == [
            int(t * 1000) for t in frame["wall_time"]
        ], "each round's real wall-clock time"
    assert run.info.start_time < run.info.end_time == int(frame["wall_time"].iloc[-1] * 1000)
    tags = run.data.tags
    assert tags["mlflow.source.git.commit"] and tags["mlflow.source.name"] == "fedrepro train"
    assert tags["mlflow.runName"] == "tiny-run" and tags["fedrepro.experiments"] == "tinyfile/table1"
    parent = client.get_run(tags["mlflow.parentRunId"])
    assert parent.data.tags["fedrepro.parent"] == "table1"
    assert client.get_experiment(run.info.experiment_id).name == "fedrepro/tinyfile"
    assert "None" not in run.data.params.values(), "unset settings are not logged"
    assert "ima.start_round" not in run.data.params
    assert run.data.params["client.lr"] == "0.05" and run.data.metrics["summary.final_acc"] >= 0
    assert {"model.pt", "summary.json", "metrics.csv", "figures"} <= {
        a.path for a in client.list_artifacts(run.info.run_id)
    }
    assert {"figures/curves.png", "figures/heatmap.png"} <= {
        a.path for a in client.list_artifacts(run.info.run_id, "figures")
    }
    marker = json.loads((out / record.MARKER).read_text())
    assert marker["complete"] and marker["run_id"] == run.info.run_id and marker["members"] == ["tinyfile/table1"]

    _train(out, partition_dir, tiny_data_root, uri, manifest)  # trained again from round 0 (snakemake --forcerun)
    (again,) = _records(client, "tiny-run")
    assert again.info.run_id != run.info.run_id, "a new record, not a second value for every step"
    assert sorted(m.step for m in client.get_metric_history(again.info.run_id, "test_acc")) == list(frame["round"])


def _full_store(db: Path):
    """A child process for which ``db``, the sqlite store, cannot grow by a byte: a full disk under the store
    (EFBIG past the size limit, which sqlite reports as a disk I/O error as it reports ENOSPC as a full disk)."""
    return file_size_limit(db.stat().st_size)


def test_only_a_sqlite_stores_own_files_count_as_an_unwritable_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in ("mlflow.db.lock", ".mlflow.db.x1.tmp", "mlartifacts/1/abc/artifacts/summary.json"):
        err = PermissionError(13, "Permission denied", str(tmp_path / name))
        assert store.unwritable(uri, err).startswith(
            f"the MLflow store {tmp_path / name} cannot be written (Permission denied): free space there"
        ), name
    full = RuntimeError("(sqlite3.OperationalError) database or disk is full")
    assert f"{tmp_path / 'mlflow.db'} cannot be written (database or disk is full)" in store.unwritable(uri, full)
    # a run's own files, another failure, a server: not the store's disk
    assert (
        store.unwritable(uri, PermissionError(13, "Permission denied", str(tmp_path / "runs" / "x" / "mlflow.json")))
        is None
    )
    assert store.unwritable(uri, RuntimeError("no such table: runs")) is None
    assert store.unwritable("http://127.0.0.1:9", OSError(28, "No space left on device", "/x/mlflow.db")) is None


def test_track_into_a_full_store_ends_in_one_line_naming_it(tmp_path, sqlite_uri):
    db = Path(sqlite_uri[len("sqlite:///") :])
    runs = [_fake_run(tmp_path / "runs", "ok")]
    (tmp_path / "m.json").write_text(json.dumps(_manifest(runs)))
    out = tmp_path / "tracked.json"
    args = [
        "fedrepro",
        "track",
        "--manifest",
        str(tmp_path / "m.json"),
        "--runs-dir",
        str(tmp_path / "runs"),
        "--tracking-uri",
        sqlite_uri,
        "--out",
        str(out),
    ]
    full = subprocess.run(
        args, env=subprocess_env(), capture_output=True, text=True, timeout=300, preexec_fn=_full_store(db)
    )
    assert full.returncode == 2, full.stderr[-2000:]
    assert "Traceback" not in full.stderr, full.stderr[-3000:]
    (line,) = full.stderr.strip().splitlines()
    assert line.startswith(f"fedrepro track: the MLflow store {db} cannot be written (disk I/O error): free space"), (
        line
    )
    assert not out.exists(), "not done: Snakemake runs it again"
    assert json.loads((tmp_path / "runs" / "ok" / "summary.json").read_text())["run"] == "ok", "the run's folder stands"
    done = subprocess.run(args, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]  # space freed: the store took the run, intact
    result = json.loads(out.read_text())  # the record the full store cut short is finished, not doubled
    assert (result["registered"] + result["repaired"], result["failed"]) == (1, 0), result


def test_a_training_run_into_a_full_store_says_so_in_one_line_and_finishes(
    tmp_path, sqlite_uri, partition_dir, tiny_data_root
):
    db = Path(sqlite_uri[len("sqlite:///") :])
    out = tmp_path / "runs" / "full-store-run"
    args = [
        "fedrepro",
        "train",
        "--setting",
        json.dumps(TINY),
        "--partition",
        str(partition_dir),
        "--data-root",
        str(tiny_data_root),
        "--out",
        str(out),
        "--no-progress",
        "--threads",
        "1",
        "--mlflow-experiment",
        "fedrepro/tinyfile",
        "--tracking-uri",
        sqlite_uri,
    ]
    # the run's own files (the model is the largest) stay below the store's size, so only the store is full
    full = subprocess.run(
        args, env=subprocess_env(), capture_output=True, text=True, timeout=300, preexec_fn=_full_store(db)
    )
    assert full.returncode == 0, full.stderr[-2000:]
    assert "Traceback" not in full.stderr + full.stdout, (full.stdout + full.stderr)[-3000:]
    said = [line for line in full.stdout.splitlines() if "MLflow store" in line]
    assert said == [
        f"tracking off for this run: the MLflow store {db} cannot be written (disk I/O error): free "
        f"space there or make it writable (or name another store with --tracking-uri), then `fedrepro "
        f"track` brings it in line with the runs' folders, which are untouched"
    ], full.stdout[-3000:]
    assert json.loads((out / "summary.json").read_text())["status"] == "finished", "training went on"
    assert json.loads((out / record.MARKER).read_text())["complete"] is False, "left for the track step"


class Blackhole:
    """A server that accepts connections and never answers: a hung tracking server. Counts connections."""

    def __init__(self):
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self):
        self.sock.close()
        for conn in self.accepted:
            conn.close()


def test_a_dead_server_costs_one_failed_call_and_the_run_goes_on(tmp_path, partition_dir, tiny_data_root, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")  # the test's patience; the retry count stays ours
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    server = Blackhole()
    try:
        out = tmp_path / "runs" / "dead-run"
        _train(out, partition_dir, tiny_data_root, server.url, None)
        assert json.loads((out / "summary.json").read_text())["status"] == "finished", "training went on"
        # MLflow's default (7 retries with backoff, ~4 minutes per call) would hold every call; ours
        # tries once more and then switches tracking off for the rest of the run
        assert 1 <= len(server.accepted) <= 1 + int(store.FAIL_FAST_ENV["MLFLOW_HTTP_REQUEST_MAX_RETRIES"])
        marker = json.loads((out / record.MARKER).read_text())
        assert marker["complete"] is False and marker["error"]
    finally:
        server.close()


def test_track_reconciles_after_a_failed_run_and_a_dead_server(
    tmp_path, sqlite_uri, partition_dir, tiny_data_root, monkeypatch, down_server
):
    """Issue #15: a track step that met a dead server wrote its output and was never retried."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    runs_dir = tmp_path / "runs"
    dead = down_server
    _train(runs_dir / "ok-run", partition_dir, tiny_data_root, dead, None)
    manifest = _tiny_manifest(tmp_path, ["ok-run", "crashed-run"])  # crashed-run never wrote a summary
    out = tmp_path / "tracked.json"

    def track(uri) -> int:
        try:
            cli.main(
                [
                    "track",
                    "--manifest",
                    str(manifest),
                    "--runs-dir",
                    str(runs_dir),
                    "--tracking-uri",
                    uri,
                    "--out",
                    str(out),
                ]
            )
        except SystemExit as exit_:
            return exit_.code
        return 0

    assert track(dead) == 1 and not out.exists(), "not done: Snakemake runs it again"
    uri = sqlite_uri
    assert track(uri) == 0
    result = json.loads(out.read_text())
    assert (result["registered"], result["missing"], result["failed"]) == (1, 1, 0), "the failed run blocks nothing"
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (run,) = _records(client, "ok-run")
    frame = pd.read_csv(runs_dir / "ok-run" / "metrics.csv")
    history = sorted(client.get_metric_history(run.info.run_id, "test_acc"), key=lambda m: m.step)
    assert [m.timestamp for m in history] == [int(t * 1000) for t in frame["wall_time"]]
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"]
    assert json.loads((runs_dir / "ok-run" / record.MARKER).read_text())["complete"]


def test_a_killed_registration_is_repaired_not_duplicated(tmp_path, sqlite_uri):
    """Issue #15: a registration killed midway left one RUNNING orphan, and the next call added a second
    record. Here the store holds what such kills leave (a bare RUNNING record, a FAILED half-logged one)."""
    from mlflow import MlflowClient

    uri = sqlite_uri
    runs = [_fake_run(tmp_path / "runs", "half")]
    client = store.open_store(uri)
    exp_id = client.create_experiment("fedrepro/load")
    for status in ("RUNNING", "FAILED"):
        orphan = client.create_run(exp_id, run_name="half", tags={"fedrepro.run": "half"})
        if status == "FAILED":
            client.set_terminated(orphan.info.run_id, "FAILED")
    result = reconcile.track(_manifest(runs), tmp_path / "runs", uri)
    assert result["repaired"] == 1 and result["failed"] == 0
    (run,) = _records(MlflowClient(tracking_uri=uri), "half")
    assert run.info.status == "FINISHED" and run.data.tags["fedrepro.logged"] == "complete"
    assert len(client.get_metric_history(run.info.run_id, "train_loss")) == ROUNDS
    again = reconcile.track(_manifest(runs), tmp_path / "runs", uri)
    assert again["already"] == 1 and len(_records(client, "half")) == 1


KILL_CREATION = textwrap.dedent("""
    import glob, os, signal, sqlite3, sys
    import sqlalchemy
    from sqlalchemy import event
    how, uri, pattern = sys.argv[1:4]

    def half_migrated(path):
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.01) as con:
                return any(r[0].startswith("_alembic_tmp_") for r in con.execute("SELECT name FROM sqlite_master"))
        except sqlite3.Error:
            return False

    # after every SQL statement of the migration: once a file matching the pattern holds alembic's
    # temporary table on disk, the process kills itself, at that statement and no later, on any machine
    @event.listens_for(sqlalchemy.engine.Engine, "after_cursor_execute")
    def kill_when_half_migrated(*args):
        if any(half_migrated(p) for p in glob.glob(pattern)):
            os.kill(os.getpid(), signal.SIGKILL)

    from mlflow import MlflowClient
    from fedrepro.tracking import store
    store.open_store(uri) if how == "ours" else MlflowClient(tracking_uri=uri).search_experiments()
""")


def _kill_during_schema_creation(how: str, db: Path, pattern: str) -> bool:
    """Create the store at ``db`` in a process that SIGKILLs itself right after the first SQL statement
    that leaves alembic's ``_alembic_tmp_`` table in a file matching ``pattern`` (a glob): a kill at a
    fixed point of the migration, where polling from outside raced a table that lives milliseconds.
    True if the process died so; False if the migration finished without ever reaching that point."""
    proc = subprocess.run(
        [sys.executable, "-c", KILL_CREATION, how, f"sqlite:///{db}", pattern],
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=600,
    )
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr[-2000:]
    return proc.returncode == -signal.SIGKILL


def _alembic_leftover(db: Path) -> bool:
    import sqlite3

    if not db.exists():
        return False
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.01) as con:
            return any(r[0].startswith("_alembic_tmp_") for r in con.execute("SELECT name FROM sqlite_master"))
    except sqlite3.Error:
        return False


@pytest.mark.slow
def test_a_killed_schema_creation_leaves_a_usable_store(tmp_path):
    """Issue #15: killing the first tracking call while MLflow created its schema broke the store for
    good (``_alembic_tmp_experiments already exists``). Real kills, mid-migration."""
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    # what MLflow alone leaves: a half-migrated file (the state earlier versions left behind)
    assert _kill_during_schema_creation("mlflow", db, str(db)), "MLflow's migration made no temporary table"
    assert _alembic_leftover(db)
    # ours builds the schema in a temporary file: killed midway, the store's own path is untouched
    db.rename(tmp_path / "legacy.db")
    assert _kill_during_schema_creation("ours", db, str(tmp_path / ".mlflow.db.*.tmp")), "no temporary store made"
    assert any(_alembic_leftover(p) for p in tmp_path.glob(".mlflow.db.*.tmp"))
    assert not db.exists()
    (tmp_path / "legacy.db").rename(db)
    client = store.open_store(uri)  # repairs: the half-made, empty store is moved aside and made anew
    client.create_experiment("after-the-kills")
    assert client.get_experiment_by_name("after-the-kills") is not None
    assert list(tmp_path.glob("mlflow.db.broken-*")) and not list(tmp_path.glob(".mlflow.db.*.tmp"))


# --------------------------------------------------------------------------- what the runs table shows


def _inputs(run) -> dict:
    """context -> (name, digest, profile) of a run's dataset inputs."""
    out = {}
    for item in run.inputs.dataset_inputs:
        context = {t.key: t.value for t in item.tags}["mlflow.data.context"]
        assert context not in out, f"{context} listed twice"
        out[context] = (item.dataset.name, item.dataset.digest, json.loads(item.dataset.profile))
    return out


def test_a_run_shows_its_partition_and_dataset_as_inputs_and_its_params_file_as_source(
    tmp_path, sqlite_uri, partition_dir, tiny_data_root
):
    """The runs table's Dataset column: the dataset and the partition (content hash, client counts), by which
    runs are filtered; the Source column: the `fedrepro train` entry point and the params file. Through a
    real sqlite store, live (the training job, cut off and resumed) and by the track step."""
    from mlflow import MlflowClient

    from fedrepro.identity import partition_id

    uri = sqlite_uri
    manifest_path = _tiny_manifest(tmp_path, ["tiny-run"])
    manifest = json.loads(manifest_path.read_text())
    manifest["configfiles"] = ["params/tinyfile.yaml"]
    manifest_path.write_text(json.dumps(manifest))
    out = tmp_path / "runs" / "tiny-run"
    _train(out, partition_dir, tiny_data_root, uri, manifest_path, "--stop-after", "2")
    _train(out, partition_dir, tiny_data_root, uri, manifest_path)  # resumed: the same inputs, not twice
    client = MlflowClient(tracking_uri=uri)
    (run,) = _records(client, "tiny-run")
    info = json.loads((partition_dir / "partition.json").read_text())
    counts = pd.read_csv(partition_dir / "counts.csv", index_col="client").sum(axis=1).tolist()
    inputs = _inputs(run)
    assert inputs["partition"][:2] == (
        partition_id(json.loads((out / "summary.json").read_text())["setting"]),
        info["content_hash"],
    )
    assert inputs["partition"][2]["client_sizes"] == counts and inputs["partition"][2]["num_clients"] == 4
    assert inputs["training"][0] == "fmnist" and inputs["training"][2]["train_size"] == 60000
    assert run.data.tags["mlflow.source.name"] == "fedrepro train · params/tinyfile.yaml"
    assert run.data.tags["mlflow.source.type"] == "JOB"
    experiments = [e.experiment_id for e in client.search_experiments()]
    found = client.search_runs(experiments, f"dataset.digest = '{info['content_hash']}'")
    assert [r.info.run_id for r in found] == [run.info.run_id], "runs are filtered by their partition"
    assert not client.search_runs(experiments, "dataset.digest = 'another-partition'")

    # a run the track step registers (its training job logged nothing) gets the same
    runs_dir = tmp_path / "other" / "runs"
    fake = _fake_run(runs_dir, "late")
    summary = json.loads((runs_dir / "late" / "summary.json").read_text())
    summary["setting"] = {**summary["setting"], "dataset": "fmnist"}
    (runs_dir / "late" / "summary.json").write_text(json.dumps(summary))
    shutil.copytree(partition_dir, runs_dir.parent / "partitions" / summary["partition"])
    result = reconcile.track({**_manifest([fake]), "configfiles": ["params/load.yaml"]}, runs_dir, uri)
    assert result["registered"] == 1, result
    (late,) = _records(client, "late")
    assert _inputs(late)["partition"][:2] == ("p", info["content_hash"])
    assert late.data.tags["mlflow.source.name"] == "fedrepro train · params/load.yaml"


# --------------------------------------------------------------------------- what the README promises


class _StubClient:
    """Stands in for MlflowClient where a test watches only what LiveRun sends and when."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def test_live_metrics_are_sent_in_batches_at_most_every_10_seconds(monkeypatch):
    """Rounds are logged as they end, but sent together: the first at once, then one batch per 10 s of the
    job's clock, and the rest when the run ends (a round every second costs a call every 10 s)."""
    assert live.FLUSH_SECONDS == 10.0
    sent, clock = [], [1000.0]
    monkeypatch.setattr(live, "log_metrics", lambda client, run_id, batch: sent.append(sorted({m.step for m in batch})))
    monkeypatch.setattr(live.time, "monotonic", lambda: clock[0])
    observer = live.LiveRun("unused")
    observer.client, observer.run_id = _StubClient(), "run"
    for step, now in [(1, 1000.0), (2, 1004.0), (3, 1009.9), (4, 1010.1), (5, 1015.0)]:
        clock[0] = now
        observer.round_done(None, {"round": step, "wall_time": now, "test_acc": 0.5, "train_loss": 1.0})
    assert sent == [[1], [2, 3, 4]], "round 1 at once; rounds 2-4 together once 10 s had passed"
    observer.ended(None, "interrupted", None)
    assert sent == [[1], [2, 3, 4], [5]], "what is pending goes out when the run ends"


def test_an_exception_mid_training_marks_the_run_failed(
    tmp_path, sqlite_uri, partition_dir, tiny_data_root, monkeypatch
):
    from mlflow import MlflowClient

    from fedrepro.run.trainer import Trainer

    round_ = Trainer.round

    def breaks_in_round_3(self, t):
        if t == 2:
            raise RuntimeError("a bug in round 3")
        return round_(self, t)

    monkeypatch.setattr(Trainer, "round", breaks_in_round_3)
    out = tmp_path / "runs" / "broken-run"
    with pytest.raises(RuntimeError, match="a bug in round 3"):
        _train(out, partition_dir, tiny_data_root, sqlite_uri, _tiny_manifest(tmp_path, ["broken-run"]))
    client = MlflowClient(tracking_uri=sqlite_uri)
    (run,) = _records(client, "broken-run")
    assert run.info.status == "FAILED" and run.data.tags["fedrepro.status"] == "failed"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "test_acc")) == [1, 2]


def test_a_locked_store_switches_tracking_off_and_the_run_goes_on(
    tmp_path, sqlite_uri, partition_dir, tiny_data_root, capsys
):
    """Another process holds the sqlite store's write lock for the whole run: the first call that needs
    it fails, tracking is off for this run (said once, written to the marker), and training finishes."""
    import sqlite3

    db = sqlite_uri[len("sqlite:///") :]
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        out = tmp_path / "runs" / "locked-run"
        _train(out, partition_dir, tiny_data_root, sqlite_uri, None)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert json.loads((out / "summary.json").read_text())["status"] == "finished", "training went on"
    printed = capsys.readouterr().out
    assert printed.count("tracking off for this run") == 1 and "locked" in printed
    marker = json.loads((out / record.MARKER).read_text())
    assert marker["complete"] is False and "locked" in marker["error"]


def test_a_run_in_two_params_files_lists_both_in_fedrepro_experiments(tmp_path, sqlite_uri):
    from mlflow import MlflowClient

    runs_dir = tmp_path / "runs"
    shared = _fake_run(runs_dir, "shared")
    first = {**_manifest([shared]), "name": "paper"}
    second = {
        **_manifest([shared]),
        "name": "ablation",
        "experiments": {"fig2": {"title": "fig2", "description": "", "grid": {}, "runs": [shared]}},
    }
    assert reconcile.track(first, runs_dir, sqlite_uri)["registered"] == 1
    assert reconcile.track(second, runs_dir, sqlite_uri)["registered"] == 0, "one record, not two"
    (run,) = _records(MlflowClient(tracking_uri=sqlite_uri), "shared")
    assert run.data.tags["fedrepro.experiments"] == "paper/load,ablation/fig2"
    assert json.loads((runs_dir / "shared" / record.MARKER).read_text())["members"] == ["ablation/fig2", "paper/load"]


@pytest.mark.parametrize("live", [True, False])
def test_tracking_live_false_leaves_the_training_jobs_untracked(live, tmp_path):
    """`tracking: {live: false}`: the train rule's command carries no MLflow options (the track step
    registers the runs afterwards); the default logs live."""
    from conftest import snakemake_cmd

    params = tmp_path / "p.yaml"
    params.write_text(
        "tracking: {live: %s}\nexperiments:\n  a: {base: {num_clients: 4, rounds: 2}, grid: {seed: [1]}}\n"
        % str(live).lower()
    )
    proc = subprocess.run(
        snakemake_cmd(tmp_path, "-n", "-p", "--configfile", str(params)),
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = [line for line in proc.stdout.splitlines() if "fedrepro train" in line]
    assert len(train) == 1, proc.stdout[-3000:]
    assert ("--mlflow-experiment fedrepro/p" in train[0]) is live, train[0]
