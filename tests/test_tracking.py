"""MLflow under load: concurrent registering processes lose no run and no metric, into one sqlite
store and into an ``mlflow server`` the test starts on 127.0.0.1. A tracking failure never raises."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import BIN, free_port, subprocess_env
from fedrepro import tracking

WORKERS = 8
ROUNDS = 25
METRICS = ["test_acc", "test_loss", "train_loss", "e_lud", "global_norm", "lr"]


def _fake_run(runs_dir: Path, name: str, status: str = "finished") -> dict:
    """A finished run's files, as the engine writes them."""
    folder = runs_dir / name
    folder.mkdir(parents=True)
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    frame = pd.DataFrame({"round": np.arange(1, ROUNDS + 1), **{m: rng.random(ROUNDS) for m in METRICS}})
    frame.loc[3, "test_acc"] = float("nan")  # not evaluated that round: not logged
    frame.to_csv(folder / "metrics.csv", index=False)
    setting = {"algorithm": "fedavg", "plugins": [], "num_clients": 10, "client": {"lr": 0.1}}
    summary = {"run": name, "status": status, "setting": setting, "setting_hash": "h" + name,
               "partition": "p", "partition_hash": "ph", "git_commit": "abc", "device": "cpu",
               "final_acc": 0.5, "best_acc": 0.6, "final_loss": 1.0, "e_ludd": 0.1, "runtime_s": 1.0}
    (folder / "summary.json").write_text(json.dumps(summary))
    return {"id": name, "variant": {}, "label": name, "seed": 1, "partition": "p", "setting": setting}


def _manifest(runs: list[dict]) -> dict:
    return {"name": "load", "title": "load", "tracking": {"experiment_prefix": "fedrepro"},
            "experiments": {"load": {"title": "load", "description": "", "grid": {}, "runs": runs}}}


WORKER = textwrap.dedent("""
    import json, sys
    from fedrepro import tracking
    manifest, runs_dir, uri, out = sys.argv[1:5]
    result = tracking.track(json.load(open(manifest)), runs_dir, uri)
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
        procs.append((subprocess.Popen([sys.executable, "-c", WORKER, str(manifest), str(runs_dir), uri, str(out)],
                                       env=subprocess_env(), stderr=subprocess.PIPE, text=True), out))
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
    found = client.search_runs([exp.experiment_id], max_results=1000)
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
        assert {"summary.json", "metrics.csv"} <= artifacts


@pytest.mark.slow
def test_concurrent_registration_into_one_sqlite_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    results = _register_concurrently(tmp_path, uri, shared=True)
    assert sum(r["failed"] for r in results) == 0, [r["errors"] for r in results]
    assert sum(r["registered"] for r in results) == WORKERS + 1, "the shared run is registered once"
    assert sum(r["already"] for r in results) == WORKERS - 1
    _check_store(uri, tmp_path / "runs", {f"run-{i}" for i in range(WORKERS)} | {"shared-run"})


@pytest.fixture
def mlflow_server(tmp_path):
    """An ``mlflow server`` on 127.0.0.1 (a free port), stopped by its PID after the test."""
    port = free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
                             "--artifacts-destination", str(tmp_path / "artifacts"), "--workers", "1"],
                            env=subprocess_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail("mlflow server did not start:\n" + (tmp_path / "server.log").read_text()[-3000:])
            time.sleep(0.5)
        yield url
    finally:
        # the server and the workers it forked share the session we gave it: stop exactly that group
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        log.close()


@pytest.mark.slow
def test_concurrent_registration_into_an_mlflow_server(tmp_path, mlflow_server):
    results = _register_concurrently(tmp_path, mlflow_server, shared=False)
    assert sum(r["failed"] for r in results) == 0, [r["errors"] for r in results]
    assert sum(r["registered"] for r in results) == WORKERS
    _check_store(mlflow_server, tmp_path / "runs", {f"run-{i}" for i in range(WORKERS)})
    # registering again adds nothing
    again = tracking.register_manifest(_manifest([_fake_run(tmp_path / "runs2", "run-0")]), tmp_path / "runs",
                                       mlflow_server)
    assert again["already"] == 1 and again["registered"] == 0


def test_register_is_idempotent_and_keeps_diverged_runs(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runs = [_fake_run(tmp_path / "runs", "ok"), _fake_run(tmp_path / "runs", "bad", status="diverged")]
    first = tracking.register_manifest(_manifest(runs), tmp_path / "runs", uri)
    second = tracking.register_manifest(_manifest(runs), tmp_path / "runs", uri)
    assert (first["registered"], second["registered"], second["already"]) == (2, 0, 2)
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=uri)
    found = client.search_runs([client.get_experiment_by_name("fedrepro/load").experiment_id])
    assert sorted(r.data.tags["fedrepro.status"] for r in found) == ["diverged", "finished"]


def test_tracking_failure_never_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    runs = [_fake_run(tmp_path / "runs", "ok")]
    # nothing listens on port 9: every call fails; the result says so and nothing raises
    result = tracking.register_manifest(_manifest(runs), tmp_path / "runs", "http://127.0.0.1:9")
    assert result["failed"] == 1 and result["registered"] == 0 and result["errors"]
    missing = tracking.register_manifest(_manifest([{"id": "absent"}]), tmp_path / "runs",
                                         f"sqlite:///{tmp_path / 'm.db'}")
    assert missing["missing"] == 1 and missing["failed"] == 0
