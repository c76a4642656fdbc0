"""The Snakemake workflow: a dry run of the default DAG, and a tiny real end-to-end run.

Snakemake runs from a temporary working directory (``--directory``) on the project's Snakefile,
so the tests also check that the workflow does not depend on being started in the repository.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import BIN, ROOT, job_counts, run_snakemake, snakemake_cmd, subprocess_env, write_yaml
from fedrepro import identity
from fedrepro.configure import expansion, paramsfile


def _expected_counts(params_file: Path) -> dict[str, int]:
    runs = expansion.unique_runs(expansion.expand(paramsfile.load_params(params_file)))
    partitions = {run.partition for run in runs.values()}
    datasets = {run.setting["dataset"] for run in runs.values()}
    return {
        "download": len(datasets),
        "partition": len(partitions),
        "train": len(runs),
        "manifest": 1,
        "track_run": len(runs),
        "track": 1,
        "report": 1,
        "index": 1,
        "all": 1,
    }


def test_default_dag_dry_run_job_counts(tmp_path):
    default = ROOT / "params" / "default.yaml"
    proc = run_snakemake(tmp_path, "-n", "--configfile", str(default))
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = job_counts(proc.stdout + proc.stderr)
    expected = _expected_counts(default)
    for rule, count in expected.items():
        assert counts.get(rule) == count, (rule, counts)
    # the minimum for the quick default: FedAvg on Dir(0.1), Dir(0.5) and #C=2, two seeds
    assert counts["train"] >= 6 and counts["partition"] >= 3
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")
    assert not (tmp_path / "results").exists(), "a dry run writes nothing"
    # the index page every params file shares is no declared output: two params files run side by side
    outputs = re.findall(r"^\s+output: (.*)$", proc.stdout, flags=re.MULTILINE)
    assert outputs and not any("reports/index.html" in line for line in outputs), outputs


RULE = re.compile(r"^(?:local)?rule (\w+):\n((?:[ \t]+.*\n|\n)+)", flags=re.MULTILINE)


def test_every_rule_that_works_has_a_log_and_a_benchmark_and_a_shell_command():
    """No logic in rule bodies (no run:), and each step leaves its log and its benchmark/<rule>/ record."""
    rules = {}
    for path in [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]:
        rules.update({name: body for name, body in RULE.findall(path.read_text() + "\n")})
    assert {"download", "partition", "train", "manifest", "report", "index", "collect", "track"} <= set(rules)
    for name, body in rules.items():
        if name == "all":
            continue
        assert "    run:" not in body, name
        assert "    shell:" in body and "    log:" in body, name
        # the fedrepro of the environment Snakemake runs in (common.smk), not whichever PATH finds first
        shell = body.split("    shell:")[1]
        assert not re.search(r"(?<![\w{.-])fedrepro ", shell), (name, shell)
        assert "{FEDREPRO} " in shell, (name, shell)
        assert re.search(rf"benchmark:\n\s+f?\"benchmarks/{name}/", body), name


def test_the_workflow_and_fedrepro_manifest_agree_on_the_manifest(tmp_path):
    """The Snakefile names the manifest by a hash of its content; `fedrepro manifest` writes that content
    (one library function), also with --config values, and refuses a name its content does not hash to."""
    default = ROOT / "params" / "default.yaml"
    only = sorted(paramsfile.load_params(default)["experiments"])[0]
    proc = run_snakemake(tmp_path, "-n", "--configfile", str(default), "--config", f"only={only}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = re.search(r"results/manifests/default-\w+\.json", proc.stdout).group(0)
    out = tmp_path / path
    # as the manifest rule calls it: the params file as the Snakefile names it, relative to the workflow
    cli = [
        str(BIN / "fedrepro"),
        "manifest",
        "--configfile",
        "params/default.yaml",
        "--base",
        str(ROOT),
        "--overrides",
        json.dumps({"only": only}),
        "--command",
        "snakemake --configfile params/default.yaml",
        "--out",
        str(out),
        "--check-name",
    ]
    done = subprocess.run(cli, capture_output=True, text=True, env=subprocess_env())
    assert done.returncode == 0, done.stderr
    manifest = json.loads(out.read_text())
    assert list(manifest["experiments"]) == [only]
    assert expansion.manifest_path(manifest).endswith(path.split("/")[-1])
    cli[cli.index("--overrides") + 1] = "{}"  # the whole file: another content, so another name
    done = subprocess.run(cli, capture_output=True, text=True, env=subprocess_env())
    assert done.returncode != 0 and "hashes to" in done.stderr, done.stderr


# The workflow's .test config (Snakemake's convention), run here through Snakemake as CI runs it.
TEST_CONFIG = ROOT / ".test" / "config" / "tiny.yaml"
TINY = paramsfile.read_yaml(TEST_CONFIG)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, fmnist_data):
    """One real run of the whole pipeline on a tiny grid (Fashion-MNIST, 4 clients, 2 rounds)."""
    work = tmp_path_factory.mktemp("e2e")
    params = fmnist_data.params_file(TEST_CONFIG, tmp_path_factory.mktemp("params"))
    uri = f"sqlite:///{work / 'mlflow.db'}"
    env = subprocess_env(uri, fmnist=fmnist_data)
    proc = run_snakemake(
        work,
        "--configfile",
        str(params),
        "--workflow-profile",
        str(ROOT / "workflow/profiles/ci"),
        "--cores",
        "2",
        env=env,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    runs = expansion.unique_runs(expansion.expand(paramsfile.load_params(params)))
    return {"work": work, "params": params, "uri": uri, "env": env, "runs": runs, "fmnist": fmnist_data}


def _runs_of(tiny_run, experiment):
    return [r for r in tiny_run["runs"].values() if r.experiment == experiment]


@pytest.mark.slow
def test_e2e_metrics_and_summary(tiny_run):
    for run in _runs_of(tiny_run, "tiny_e2e"):
        folder = tiny_run["work"] / "results" / "runs" / run.id
        metrics = pd.read_csv(folder / "metrics.csv")
        assert list(metrics["round"]) == [1, 2]
        for column in ("test_acc", "test_loss", "train_loss", "e_lud", "global_norm", "lr", "seconds"):
            assert column in metrics and metrics[column].notna().all(), column
        assert metrics["test_acc"].between(0, 1).all()
        assert metrics["test_acc"].iloc[-1] > 0.3, "two rounds of FedAvg on Fashion-MNIST learn something"
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["status"] == "finished"
        assert summary["setting"] == run.setting
        assert summary["setting_hash"] == identity.stable_hash(run.setting)
        assert summary["run"] == run.id and summary["rounds_done"] == 2
        assert math.isclose(summary["final_acc"], metrics["test_acc"].tail(10).mean())
        assert summary["best_acc"] == metrics["test_acc"].max()
        for key in ("runtime_s", "device", "versions", "git_commit", "partition_hash"):
            assert summary[key] not in (None, ""), key
        assert summary["device"].startswith("cpu")
        # which kernels torch ran decides whether a rerun elsewhere can be bit for bit: recorded, as this
        # machine's torch reports them (the job inherits this process's environment)
        assert summary["cpu_kernels"] == torch.backends.cpu.get_cpu_capability() and summary["cpu"]
        assert (folder / "model.pt").stat().st_size > 0
        assert not (folder / "checkpoint.pt").exists(), "a finished run leaves no checkpoint"
    partitions = list((tiny_run["work"] / "results" / "partitions").iterdir())
    assert len(partitions) == 1, "both experiments share one partition"
    for name in ("clients.npz", "counts.csv", "heatmap.png", "partition.json"):
        assert (partitions[0] / name).exists()


@pytest.mark.slow
def test_e2e_diverged_run_is_recorded_and_the_grid_continues(tiny_run):
    (run,) = _runs_of(tiny_run, "tiny_diverge")
    summary = json.loads((tiny_run["work"] / "results" / "runs" / run.id / "summary.json").read_text())
    assert summary["status"] == "diverged"
    assert math.isnan(summary["final_acc"])
    html = (tiny_run["work"] / "reports" / "tiny.html").read_text()
    assert "diverged" in html


@pytest.mark.slow
def test_e2e_mlflow_holds_every_run_and_metric(tiny_run):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tiny_run["uri"])
    exp = client.get_experiment_by_name("fedrepro/tiny")  # one MLflow experiment per params file
    assert exp is not None
    for experiment in ("tiny_e2e", "tiny_diverge"):
        (parent,) = client.search_runs([exp.experiment_id], f"tags.`fedrepro.parent` = '{experiment}'")
        assert parent.info.status == "FINISHED"
        found = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
        expected = {r.id for r in _runs_of(tiny_run, experiment)}
        assert sorted(r.data.tags["fedrepro.run"] for r in found) == sorted(expected)
        for mlrun in found:
            tags = mlrun.data.tags
            for tag in (
                "fedrepro.setting_hash",
                "fedrepro.partition_hash",
                "mlflow.source.git.commit",
                "fedrepro.experiments",
            ):
                assert tags.get(tag), tag
            run_dir = tiny_run["work"] / "results" / "runs" / tags["fedrepro.run"]
            metrics = pd.read_csv(run_dir / "metrics.csv")
            history = client.get_metric_history(mlrun.info.run_id, "train_loss")
            finite = metrics["train_loss"].map(math.isfinite)
            assert len(history) == int(finite.sum())
            assert mlrun.data.params["num_clients"] == "4"
            if experiment == "tiny_e2e":
                assert len(client.get_metric_history(mlrun.info.run_id, "test_acc")) == 2
                assert tags["fedrepro.status"] == "finished"
            else:
                assert tags["fedrepro.status"] == "diverged"


@pytest.mark.slow
def test_e2e_tracking_twice_does_not_duplicate(tiny_run):
    from mlflow import MlflowClient

    work = tiny_run["work"]
    (manifest,) = (work / "results" / "manifests").glob("tiny-*.json")
    proc = subprocess.run(
        [
            "fedrepro",
            "track",
            "--manifest",
            str(manifest),
            "--runs-dir",
            str(work / "results/runs"),
            "--out",
            str(work / "track-again.json"),
        ],
        capture_output=True,
        text=True,
        env=tiny_run["env"],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((work / "track-again.json").read_text())
    assert result["registered"] == 0 and result["failed"] == 0
    assert result["already"] == len(tiny_run["runs"])
    client = MlflowClient(tracking_uri=tiny_run["uri"])
    total = sum(
        len(client.search_runs([e.experiment_id], "tags.`fedrepro.run` != ''", max_results=100))
        for e in client.search_experiments()
        if e.name.startswith("fedrepro/")
    )
    assert total == len(tiny_run["runs"])


@pytest.mark.slow
def test_e2e_report_shows_the_experiment(tiny_run):
    page = tiny_run["work"] / "reports" / "tiny.html"
    html = page.read_text()
    assert "Tiny FedAvg check" in html
    assert "data:image/png;base64," in html, "figures are embedded"
    assert '<script src="http' not in html
    index = (tiny_run["work"] / "reports" / "index.html").read_text()
    assert re.search(r'<a href="#tiny">tiny</a>.*?<td>3</td><td>2</td><td>1</td><td>0</td><td>0</td>', index, re.S), (
        "the index lists this params file's 3 runs: 2 done, 1 diverged"
    )


@pytest.mark.slow
def test_e2e_every_step_leaves_its_log_and_benchmark(tiny_run):
    work = tiny_run["work"]
    benchmarks = {p.relative_to(work / "benchmarks").parts[0] for p in (work / "benchmarks").rglob("*.tsv")}
    assert benchmarks == {
        "download",
        "partition",
        "train",
        "manifest",
        "track_run",
        "track",
        "report",
        "index",
        "collect",
    }, benchmarks
    assert (work / "results" / "index" / "tiny.done").exists(), "the marker DVC keeps with the results"
    assert (work / "logs" / "index" / "tiny.log").exists()
    assert "ready in" in (work / "logs" / "download" / "fmnist.log").read_text()
    assert not list((work / "reports").glob(".*partial")), "the index page was replaced whole"


@pytest.mark.slow
def test_e2e_snakemake_report_packs_the_figures_with_their_captions(tiny_run):
    figures = sorted(p.name for p in (tiny_run["work"] / "reports" / "tiny_figures").iterdir())
    assert "tiny_e2e.curves.png" in figures and any(f.startswith("tiny_e2e.partition-") for f in figures)
    out = tiny_run["work"] / "packed.zip"
    proc = run_snakemake(
        tiny_run["work"], "--report", str(out), "--configfile", str(tiny_run["params"]), env=tiny_run["env"]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    import zipfile

    with zipfile.ZipFile(out) as packed:
        names = packed.namelist()
        assert any(n.endswith("tiny_e2e.curves.png") for n in names), names
        text = "".join(packed.read(n).decode(errors="ignore") for n in names if n.endswith((".html", ".js")))
    assert "Test accuracy (%) and losses by round" in text, "the curves' caption"
    assert "Tiny FedAvg check" in text, "captions name the experiment"


@pytest.mark.slow
def test_e2e_nothing_to_do_afterwards_even_after_touching(tiny_run):
    args = ("-n", "--configfile", str(tiny_run["params"]), "--workflow-profile", str(ROOT / "workflow/profiles/ci"))
    proc = run_snakemake(tiny_run["work"], *args, env=tiny_run["env"])
    assert proc.returncode == 0
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    # new mtimes, same content (as after a copy or a dvc pull): still nothing to do
    later = time.time() + 5
    for path in (tiny_run["work"] / "data").rglob("*"):
        os.utime(path, (later, later))
    for path in (tiny_run["work"] / "results" / "partitions").rglob("*"):
        os.utime(path, (later + 5, later + 5))
    proc = run_snakemake(tiny_run["work"], *args, env=tiny_run["env"])
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]


@pytest.mark.slow
def test_e2e_changed_grid_and_mirrors_schedule_exactly_the_new_work(tiny_run, tmp_path):
    """A new seed and another mirror list in one edit: the new run, the new manifest and the leaf
    steps are scheduled in this very invocation (nothing upstream is recomputed in place, so no
    Snakemake job is masked behind one), and the finished runs are left alone."""
    changed = json.loads(json.dumps(TINY))
    changed["data"]["mirrors"]["fmnist"] = [str(tmp_path / "nowhere"), tiny_run["fmnist"].mirror]
    changed["experiments"]["tiny_e2e"]["grid"]["seed"] = [1, 2, 3]
    (tiny_run["work"] / "changed").mkdir()
    params = write_yaml(tiny_run["work"] / "changed" / "tiny.yaml", changed)  # same name: same report
    proc = run_snakemake(
        tiny_run["work"],
        "-n",
        "--configfile",
        str(params),
        "--workflow-profile",
        str(ROOT / "workflow/profiles/ci"),
        env=tiny_run["env"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    scheduled = re.findall(r"^(?:local)?rule (\w+):$", proc.stdout + proc.stderr, flags=re.MULTILINE)
    counts = dict(collections.Counter(scheduled))
    # a tracking job reads its own run's record: the new run is tracked, the finished runs' records are unchanged
    assert counts == {
        "train": 1,
        "manifest": 1,
        "track_run": 1,
        "report": 1,
        "track": 1,
        "collect": 1,
        "index": 1,
        "all": 1,
    }, proc.stdout[-3000:]


@pytest.mark.slow
def test_both_spellings_of_the_default_params_file_see_the_same_state(tmp_path):
    """`snakemake` (the Snakefile's `configfile:` directive) and `snakemake --configfile params/default.yaml`
    name one params file: a job done under one spelling is done under the other (the manifest rule's params
    once recorded the file's whole content as --config overrides under the second spelling only). Run with
    an absolute snakemake and a PATH without the environment's bin: the rules call that environment's
    fedrepro, not one found on PATH (once every job failed with exit 127)."""
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "default.yaml").write_text(TEST_CONFIG.read_text())
    env = subprocess_env(PATH="/usr/bin:/bin")
    assert not (Path("/usr/bin/fedrepro").exists() or Path("/bin/fedrepro").exists())

    def snakemake(*args):
        proc = subprocess.run(
            snakemake_cmd(tmp_path, "--cores", "1", *args),
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
        )
        return proc, proc.stdout + proc.stderr

    for first, second in ((["--configfile", "params/default.yaml"], []), ([], ["--configfile", "params/default.yaml"])):
        for folder in ("results", ".snakemake"):
            subprocess.run(["rm", "-rf", str(tmp_path / folder)], check=True)
        proc, out = snakemake("manifest", *first)
        assert proc.returncode == 0, out[-3000:]
        (manifest,) = (tmp_path / "results" / "manifests").glob("default-*.json")
        assert json.loads(manifest.read_text())["experiments"].keys() == TINY["experiments"].keys(), (
            "the directive's file is the working directory's params/default.yaml, as Snakemake reads it"
        )
        proc, out = snakemake("-n", "manifest", *second)
        assert proc.returncode == 0 and "Nothing to be done" in out, (first, out[-3000:])


# --------------------------------------------------------------------------- grids as trees

FORKS_CONFIG = ROOT / ".test" / "config" / "forks.yaml"
CI_PROFILE = ("--workflow-profile", str(ROOT / "workflow/profiles/ci"))
JOB = re.compile(r"^(?:local)?rule (\w+):\n((?:    .*\n)+)", flags=re.MULTILINE)


def _jobs(output: str) -> list[tuple[str, dict[str, str]]]:
    """(rule, {input, output, ...}) of each job a dry run prints."""
    return [
        (rule, dict(line.strip().split(": ", 1) for line in body.splitlines() if ": " in line))
        for rule, body in JOB.findall(output + "\n")
    ]


def _train_targets(runs) -> list[str]:
    return [f"results/runs/{run_id}/summary.json" for run_id in runs]


def _without_timings(path: Path) -> str:
    return pd.read_csv(path).drop(columns=["seconds", "wall_time"]).to_csv(index=False)


@pytest.fixture(scope="module")
def forked_grid(tmp_path_factory, fmnist_data):
    """.test/config/forks.yaml trained twice through Snakemake: sharing prefixes, and with share_prefixes=false."""
    from fedrepro.configure import forks

    params = fmnist_data.params_file(FORKS_CONFIG, tmp_path_factory.mktemp("params"))
    env = subprocess_env(fmnist=fmnist_data)
    runs = expansion.unique_runs(expansion.expand(paramsfile.load_params(params)))
    shared = forks.assign(list(runs.values()))
    grids = {}
    for name, extra in (("shared", ()), ("unshared", ("--config", "share_prefixes=false"))):
        work = tmp_path_factory.mktemp(name)
        # --config takes every word after it: the targets come first
        args = ("--configfile", str(params), *CI_PROFILE, *_train_targets(runs), *extra)
        dry = run_snakemake(work, "-n", "-p", *args, env=env)
        assert dry.returncode == 0, dry.stderr[-3000:]
        done = run_snakemake(work, "--cores", "2", *args, env=env)
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-5000:])
        grids[name] = {"work": work, "dry": dry.stdout + dry.stderr, "args": args}
    return {"runs": runs, "forks": shared, **grids}


def test_forks_each_job_asks_for_the_runtime_of_the_rounds_it_trains(tmp_path):
    """A child trains rounds t..R-1: its Slurm runtime request is that of a run of R - t rounds, not R; the
    fork step trains at most the parent's first t rounds; a parent, and every run with sharing off, asks for R.
    Step costs large enough that no request is the floor, so the counts show; measured on the CPU, the device
    these runs train on (a measurement of another device would not price them)."""
    from fedrepro.configure import forks
    from fedrepro.ops import plan

    costs = {"fmnist/mlp:256": 5.0}
    (tmp_path / "results" / "bench").mkdir(parents=True)
    (tmp_path / "results" / "bench" / "step_costs.json").write_text(
        json.dumps({"device": "cpu", "step_seconds": costs})
    )
    runs = expansion.unique_runs(expansion.expand(paramsfile.load_params(FORKS_CONFIG)))
    shared = forks.assign(list(runs.values()))
    minutes = lambda run_id, rounds: plan.run_minutes({**runs[run_id].setting, "rounds": rounds}, costs)  # noqa: E731
    rounds = {run_id: run.setting["rounds"] for run_id, run in runs.items()}
    for extra in ((), ("--config", "share_prefixes=false")):
        proc = run_snakemake(
            tmp_path, "-n", "--configfile", str(FORKS_CONFIG), *CI_PROFILE, *_train_targets(runs), *extra
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        asked = {}
        for rule, job in _jobs(proc.stdout + proc.stderr):
            if rule in ("train", "fork"):
                runtime = int(re.search(r"runtime=(\d+)", job["resources"]).group(1))
                first = job["output"].split(",")[0].split("/")  # results/runs/<run>/summary.json or fork/<t>.pt
                asked[(rule, first[2], first[-1])] = runtime
        expected = {}
        for run_id, n in rounds.items():
            fork = shared.get(run_id) if not extra else None
            expected[("train", run_id, "summary.json")] = minutes(run_id, n - (fork.round if fork else 0))
            if fork:
                expected[("fork", fork.parent, f"{fork.round}.pt")] = minutes(fork.parent, fork.round)
        assert asked == expected
        assert len(set(asked.values())) > 1 or extra, "the counts must differ to show anything"


@pytest.mark.slow
def test_forks_each_child_trains_after_its_parents_fork_state(forked_grid):
    shared = forked_grid["forks"]
    assert len(shared) == 2 and len({f.parent for f in shared.values()}) == 1
    jobs = _jobs(forked_grid["shared"]["dry"])
    trains = {j["output"].split(",")[0].split("/")[2]: j for rule, j in jobs if rule == "train"}
    made = {j["output"]: j for rule, j in jobs if rule == "fork"}
    assert len(made) == 2
    for child, fork in shared.items():
        state = f"results/runs/{fork.parent}/fork/{fork.round}.pt"
        assert state in trains[child]["input"].split(", "), trains[child]
        assert made[state]["input"] == f"results/runs/{fork.parent}/summary.json"
        assert "--keep-forks 2,3 --fork-history 1" in forked_grid["shared"]["dry"]
    unshared = _jobs(forked_grid["unshared"]["dry"])
    assert not any(rule == "fork" for rule, _ in unshared) and "--fork-from" not in forked_grid["unshared"]["dry"]


@pytest.mark.slow
def test_forks_sharing_or_not_gives_the_same_numbers_and_removes_the_states(forked_grid):
    a, b = forked_grid["shared"]["work"], forked_grid["unshared"]["work"]
    for run_id in forked_grid["runs"]:
        ra, rb = a / "results" / "runs" / run_id, b / "results" / "runs" / run_id
        assert _without_timings(ra / "metrics.csv") == _without_timings(rb / "metrics.csv"), run_id
        assert (ra / "model.pt").read_bytes() == (rb / "model.pt").read_bytes(), run_id
        sa, sb = (json.loads((r / "summary.json").read_text()) for r in (ra, rb))
        fork = forked_grid["forks"].get(run_id)
        assert sa["forked_from"] == (None if fork is None else {"run": fork.parent, "round": fork.round})
        assert sb["forked_from"] is None
        assert not list(ra.glob("fork/*.pt")), "fork states are temporary: removed once their children are done"
    logs = sorted((a / "logs" / "fork").iterdir())
    assert len(logs) == 2 and all("kept by the run" in log.read_text() for log in logs)


@pytest.mark.slow
def test_forks_reruns_follow_the_tree(forked_grid):
    """Turning sharing off reruns nothing; a child's post-fork setting reruns that child alone (its fork
    state, used and removed, is trained again by the fork step, not by its parent's job); a shared setting
    reruns parent and children."""
    work, args = forked_grid["shared"]["work"], forked_grid["shared"]["args"]
    runs = forked_grid["runs"]
    for toggle in ((), ("--config", "share_prefixes=false")):
        proc = run_snakemake(work, "-n", *args, *toggle)
        assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    params = paramsfile.read_yaml(FORKS_CONFIG)
    for edit, expected in (
        (
            lambda p: p["experiments"]["tiny_forks"]["grid"]["setting"][2]["ima"].update(lr_decay=0.7),
            {"train": 1, "fork": 1},
        ),
        (lambda p: p["experiments"]["tiny_forks"]["base"]["client"].update(lr=0.04), {"train": 4, "fork": 2}),
    ):
        changed = json.loads(json.dumps(params))
        edit(changed)
        folder = work / f"changed{expected['train']}"
        folder.mkdir()
        path = write_yaml(folder / "forks.yaml", changed)
        targets = _train_targets(expansion.unique_runs(expansion.expand(paramsfile.load_params(path))))
        proc = run_snakemake(work, "-n", "--configfile", str(path), *CI_PROFILE, *targets)
        assert proc.returncode == 0, proc.stderr[-3000:]
        counts = dict(collections.Counter(rule for rule, _ in _jobs(proc.stdout + proc.stderr)))
        assert counts == expected, proc.stdout[-3000:]
        assert len(set(targets) - set(_train_targets(runs))) == expected["train"]


def test_a_figure_waits_for_every_run_of_its_experiment_also_one_another_experiment_shares(tmp_path):
    """Two experiments listing the same setting share one run (trained once, kept under one experiment by
    unique_runs); each experiment's figure must still take that run as input, or it could be drawn before it."""
    base = {
        "dataset": "fmnist",
        "model": "mlp",
        "num_clients": 4,
        "participation": 0.5,
        "rounds": 2,
        "partition": {"kind": "iid", "seed": 1},
    }
    params = write_yaml(
        tmp_path / "shared.yaml",
        {
            "title": "shared",
            "experiments": {
                "first": {"base": base, "grid": {"algorithm": ["fedavg"]}},
                "second": {"base": base, "grid": {"algorithm": ["fedavg", "fedprox"]}},
            },
            "figures": {
                "fig_first": {"kind": "locality", "experiment": "first"},
                "fig_second": {"kind": "locality", "experiment": "second"},
            },
        },
    )
    runs = expansion.expand(paramsfile.load_params(params))
    shared = next(r.id for r in runs if r.experiment == "first")
    assert expansion.unique_runs(runs)[shared].experiment == "second"  # the run is listed under one experiment only
    assert expansion.runs_by_experiment(runs)["first"] == [shared]
    proc = run_snakemake(
        tmp_path,
        "-n",
        "results/figures/shared/fig_first.png",
        "results/figures/shared/fig_second.png",
        "--configfile",
        str(params),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = re.findall(r"^rule figure:\n((?:[ \t]+.*\n)+)", proc.stdout + proc.stderr, flags=re.MULTILINE)
    inputs = {
        re.search(r"output: \S+/(\w+)\.png", job).group(1): re.search(r"input: (.*)", job).group(1) for job in jobs
    }
    assert set(inputs) == {"fig_first", "fig_second"}, proc.stdout[-3000:]
    for figure, line in inputs.items():
        assert f"results/runs/{shared}/summary.json" in line, (figure, line)


DRY_JOB = re.compile(r"^(?:local)?rule (\w+):\n((?:    .*\n)+)Shell command: (.*)$", flags=re.MULTILINE)


def _job_inputs(work: Path, params: Path) -> dict[str, tuple]:
    """Every job of the params file's DAG by its output: (rule, inputs, shell command with its params filled in),
    what Snakemake's rerun triggers compare with the record of the job that made the output."""
    proc = run_snakemake(work, "-n", "-F", "-p", "--configfile", str(params))
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = {}
    for rule, body, shell in DRY_JOB.findall(proc.stdout + proc.stderr):
        fields = dict(line.strip().split(": ", 1) for line in body.splitlines() if ": " in line)
        # the live tracking's arguments are globals, not params (train.smk): no rerun trigger
        shell = re.sub(r" --mlflow-manifest \S+", "", shell)
        jobs[fields.get("output", rule)] = (rule, fields.get("input", ""), shell)
    return jobs


def test_a_method_added_to_one_experiment_reruns_its_runs_and_their_readers_only(tmp_path):
    """Adding a method to fmnist_quick of a copy of params/default.yaml changes the inputs (or params) of its
    new runs, their tracking, the figures of fmnist_quick and the steps that read every run, and of no other
    job: no figure of another experiment, no tracking job of an unchanged run (each would rerun, the manifest's
    new path an input of every downstream job). Read from two dry runs, so no training is needed."""
    default = paramsfile.read_yaml(ROOT / "params" / "default.yaml")
    (tmp_path / "params").mkdir()
    params = write_yaml(tmp_path / "params" / "default.yaml", default)
    before = _job_inputs(tmp_path / "work", params)
    runs = set(expansion.unique_runs(expansion.expand(paramsfile.load_params(params))))
    default["experiments"]["fmnist_quick"]["grid"]["algorithm"].append("fedprox")
    write_yaml(params, default)
    after = _job_inputs(tmp_path / "work", params)
    new = set(expansion.unique_runs(expansion.expand(paramsfile.load_params(params)))) - runs
    rerun = {out: job for out, job in after.items() if before.get(out) != job and job[0] != "all"}
    counts = dict(collections.Counter(rule for rule, _, _ in rerun.values()))
    quick_figures = [name for name, spec in default["figures"].items() if spec.get("experiment") == "fmnist_quick"]
    assert len(new) == 6 and quick_figures and len(quick_figures) < len(default["figures"])
    assert counts == {
        "train": 6,
        "track_run": 6,
        "manifest": 1,
        "manifest_slice": 1,
        "figure": len(quick_figures),
        "report": 1,
        "track": 1,
        "collect": 1,
        "index": 1,
    }, counts
    assert {out.split("/")[2] for out, job in rerun.items() if job[0] == "train"} == new
    assert {Path(out.split(", ")[0]).stem for out, job in rerun.items() if job[0] == "figure"} == set(quick_figures)
