"""DVC on top of Snakemake: push the artifacts to a local-directory remote, clone afresh, `dvc pull`,
and Snakemake in the clone has nothing to do (files restored with new mtimes rerun nothing)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, DEBIAN_FMNIST, ROOT, subprocess_env, write_yaml

pytestmark = pytest.mark.slow

TINY = {
    "title": "Tiny DVC check",
    "quick": True,
    "data": {"root": "data", "mirrors": {"fmnist": [str(DEBIAN_FMNIST) + "/"]}},
    "experiments": {
        "dvc_tiny": {
            "base": {
                "dataset": "fmnist",
                "model": "mlp",
                "num_clients": 4,
                "participation": 0.5,
                "rounds": 2,
                "batch_size": 256,
                "device": "cpu",
                "partition": {"kind": "iid", "seed": 1},
            },
            "grid": {"seed": [1]},
        }
    },
}


def _run(cmd, cwd, env, timeout=900):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def _project_copy(dst: Path, fmnist_data) -> Path:
    """The files a clone of the project holds, with the default params replaced by a tiny grid."""
    dst.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("Snakefile", "dvc.yaml"):
        shutil.copy(ROOT / name, dst / name)
    for name in ("workflow", "src", "params"):
        shutil.copytree(ROOT / name, dst / name, ignore=ignore)
    if (ROOT / ".dvcignore").exists():
        shutil.copy(ROOT / ".dvcignore", dst / ".dvcignore")
    write_yaml(dst / "params" / "default.yaml", fmnist_data.params(TINY))
    (dst / ".gitignore").write_text(".snakemake/\nlogs/\nmlflow.db*\nmlartifacts/\n")
    return dst


def test_push_clone_pull_then_nothing_to_do(tmp_path, fmnist_data):
    env = subprocess_env(
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        fmnist=fmnist_data,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
        DVC_NO_ANALYTICS="1",
    )
    dvc, git = str(BIN / "dvc"), "git"
    repo = _project_copy(tmp_path / "repo", fmnist_data)
    _run([git, "init", "-q", "-b", "main"], repo, env)
    _run([dvc, "init", "-q"], repo, env)
    _run([dvc, "config", "core.autostage", "true"], repo, env)
    _run([dvc, "remote", "add", "-d", "store", str(tmp_path / "remote")], repo, env)
    _run([git, "add", "-A"], repo, env)
    _run([git, "commit", "-q", "-m", "project"], repo, env)

    _run([dvc, "repro"], repo, env)
    summaries = list((repo / "results" / "runs").glob("*/summary.json"))
    assert len(summaries) == 1
    metrics = json.loads(_run([dvc, "metrics", "show", "--json"], repo, env).splitlines()[0])
    assert "final_acc" in json.dumps(metrics), "run summaries are DVC metrics"
    assert "num_clients" in _run([dvc, "params", "diff", "--all"], repo, env)
    _run([git, "add", "-A"], repo, env)
    _run([git, "commit", "-q", "-m", "results"], repo, env)
    _run([dvc, "push"], repo, env)

    clone = tmp_path / "clone"
    _run([git, "clone", "-q", str(repo), str(clone)], tmp_path, env)
    assert not (clone / "results" / "runs").exists()
    _run([dvc, "pull"], clone, env)
    assert (clone / "results" / "runs" / summaries[0].parent.name / "model.pt").exists()
    assert "up to date" in _run([dvc, "status"], clone, env).lower() or "nothing" in _run([dvc, "status"], clone, env)
    out = _run(
        [
            str(BIN / "snakemake"),
            "-n",
            "--workflow-profile",
            "workflow/profiles/local",
            "--configfile",
            "params/default.yaml",
        ],
        clone,
        env,
    )
    assert "Nothing to be done" in out, out[-3000:]


def test_metrics_plots_and_params_are_per_variant_and_per_params_file(tmp_path):
    """On the default grid's 30 runs (5 methods x 3 splits x 2 seeds, fabricated records): `dvc metrics
    show` has one short ASCII row per method and split, `dvc plots show` one plot per method and split
    whose line has one point per round (the mean over seeds, not one line through all runs), and
    `dvc params diff` sees an edit to a paper's params file, not only to the default one."""
    import re

    from conftest import fabricate
    from fedrepro.configure import expansion, paramsfile
    from fedrepro.report import frames

    env = subprocess_env(
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
        DVC_NO_ANALYTICS="1",
    )
    dvc, git = str(BIN / "dvc"), "git"
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(ROOT / "dvc.yaml", repo / "dvc.yaml")
    shutil.copytree(ROOT / "params", repo / "params")
    params = paramsfile.load_params(repo / "params" / "default.yaml")
    params["only"] = "fmnist_quick"  # the 30 runs of the method comparison (not the snapshot run for the figures)
    runs = expansion.expand(params)
    rounds = 12
    for run in runs:
        fabricate(run, repo / "results" / "runs", 0.5 + 0.01 * run.setting["seed"], rounds=rounds)
    manifest = repo / "manifest.json"
    manifest.write_text(json.dumps(expansion.manifest(params, runs, "default")))
    frames.collect(
        manifest,
        repo / "results" / "runs",
        repo / "results" / "metrics" / "default",
        repo / "results" / "curves" / "default",
    )
    variants = {run.label for run in runs}
    assert len(variants) == 15

    _run([git, "init", "-q", "-b", "main"], repo, env)
    _run([dvc, "init", "-q"], repo, env)
    _run([git, "add", "dvc.yaml", "params", ".dvc"], repo, env)
    _run([git, "commit", "-q", "-m", "project"], repo, env)

    stdout = lambda cmd: subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, check=True).stdout
    shown = json.loads(stdout([dvc, "metrics", "show", "--json"]))
    files = shown[""]["data"] if "" in shown else shown["workspace"]["data"]
    default = {path: data["data"] for path, data in files.items() if path.startswith("results/metrics/default/")}
    assert len(default) == 15, sorted(files)
    for path, data in default.items():
        assert re.fullmatch(r"results/metrics/default/fmnist_quick/[A-Za-z0-9_]+\.json", path), path
        assert set(data) == {"final_acc", "final_acc_std", "e_ludd", "seeds"} and data["seeds"] == 2
        assert data["final_acc"] == pytest.approx(0.515)  # seeds 1, 2 -> 0.51, 0.52
    assert "results/metrics/default/fmnist_quick/fedavg_ima_dir0_1.json" in default

    out = tmp_path / "plots"
    plots = json.loads(stdout([dvc, "plots", "show", "--json", "-o", str(out)]))
    per_variant = {name: p for name, p in plots["data"].items() if name.startswith("results/curves/default/")}
    assert len(per_variant) == 15, sorted(plots["data"])
    for name, (plot,) in per_variant.items():
        points = plot["content"]["data"]["values"]
        assert [int(p["round"]) for p in points] == list(range(1, rounds + 1)), f"{name}: one point per round"
        assert float(points[-1]["test_acc"]) == pytest.approx(0.515)

    params_file = repo / "params" / "fedlaw.yaml"
    params_file.write_text(params_file.read_text().replace("rounds: 200", "rounds: 150", 1))
    diff = _run([dvc, "params", "diff"], repo, env)
    assert "params/fedlaw.yaml" in diff and "rounds" in diff and "150" in diff, diff
