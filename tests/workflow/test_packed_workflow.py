"""Packed runs through Snakemake (workflow/rules/train.smk, config ``pack.packs``): the dry-run DAG with packing
on and off, and one real tiny pack on CPU whose grid then grows: the pack trains only the new runs, and the
finished runs' results stay untouched."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, job_counts, snakemake_cmd, subprocess_env, write_yaml
from fedrepro.configure import expansion, paramsfile
from fedrepro.configure.packs import WorkflowPacks, pack_of


def _snakemake(work: Path, *args, env=None):
    return subprocess.run(
        snakemake_cmd(work, *args), capture_output=True, text=True, env=env or subprocess_env(), timeout=900
    )


def test_packing_is_off_by_default_and_on_it_hands_runs_to_packs(tmp_path):
    default = paramsfile.read_yaml(ROOT / "params" / "default.yaml")
    off = _snakemake(tmp_path, "-n", "--configfile", str(ROOT / "params" / "default.yaml"))
    assert off.returncode == 0, off.stderr[-3000:]
    counts_off = job_counts(off.stdout + off.stderr)
    assert not any(rule.startswith("train_pack") for rule in counts_off) and "take_packed" not in counts_off
    packed = write_yaml(tmp_path / "default.yaml", {**default, "pack": {"packs": 2}})
    on = _snakemake(tmp_path, "-n", "--configfile", str(packed))
    assert on.returncode == 0, on.stderr[-3000:]
    counts = job_counts(on.stdout + on.stderr)
    # every run either trains alone (forks: +ima children and their hosts) or is taken from its pack
    assert counts["take_packed"] + counts["train"] == counts_off["train"]
    packs = sum(n for rule, n in counts.items() if rule.startswith("train_pack_"))
    assert counts["take_packed"] > 0 and 1 <= packs <= 2
    assert not (tmp_path / "results").exists()


def test_a_run_keeps_its_pack_however_the_grid_grows():
    settings = {
        f"run-{i}": {"dataset": "fmnist", "model": "mlp", "device": "cpu", "precision": "float32"} for i in range(20)
    }
    small = WorkflowPacks(dict(list(settings.items())[:10]), 3)
    large = WorkflowPacks(settings, 3)
    assert all(large.pack[run] == pack for run, pack in small.pack.items())
    assert pack_of("run-1", settings["run-1"], 3).startswith("fmnist-mlp-cpu-")
    # one process holds one arithmetic: a tf32 run never shares a pack with a float32 one
    tf32 = pack_of("run-1", {**settings["run-1"], "device": "cuda", "precision": "tf32"}, 3)
    assert tf32.startswith("fmnist-mlp-cuda-tf32-") and tf32 != pack_of(
        "run-1", {**settings["run-1"], "device": "cuda"}, 3
    )
    assert not WorkflowPacks(settings, 0) and WorkflowPacks(settings, 0).run_pattern() == "(?!)"


@pytest.mark.slow
def test_a_real_tiny_pack_trains_and_a_grown_grid_leaves_the_finished_runs_alone(tmp_path, fmnist_data):
    base = {
        "dataset": "fmnist",
        "model": "mlp",
        "num_clients": 4,
        "participation": 0.5,
        "rounds": 1,
        "batch_size": 500,
        "device": "cpu",
        "client": {"lr": 0.05},
        "partition": {"kind": "iid", "seed": 1},
    }
    params = {
        "title": "packed",
        "quick": True,
        "data": {"root": str(tmp_path / "data")},
        "pack": {"packs": 1},
        "tracking": {"enabled": False},
        "experiments": {"packed": {"base": base, "grid": {"algorithm": ["fedavg", "fedprox"], "seed": [1]}}},
    }
    work, env = tmp_path / "work", subprocess_env(fmnist=fmnist_data)
    work.mkdir()

    def train(params_content):
        path = write_yaml(tmp_path / "packed.yaml", fmnist_data.params(params_content))
        runs = sorted(expansion.unique_runs(expansion.expand(paramsfile.load_params(path))))
        proc = _snakemake(
            work,
            "--configfile",
            str(path),
            "--cores",
            "1",
            "-p",
            *[f"results/runs/{run}/summary.json" for run in runs],
            env=env,
        )
        assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
        out = proc.stdout + proc.stderr
        ran = {
            rule: len(re.findall(rf"^(?:local)?rule {rule}\w*:$", out, flags=re.MULTILINE))
            for rule in ("train", "train_pack", "take_packed")
        }
        ran["train"] = len(re.findall(r"^(?:local)?rule train:$", out, flags=re.MULTILINE))
        assert all((work / "results/runs" / run / "summary.json").exists() for run in runs)
        return runs, ran

    first, counts = train(params)
    assert counts == {"train": 0, "train_pack": 1, "take_packed": 2}, counts
    stamps = {run: (work / "results/runs" / run / "summary.json").stat().st_mtime_ns for run in first}
    params["experiments"]["packed"]["grid"]["seed"] = [1, 2]
    grown, counts = train(params)
    assert {run: (work / "results/runs" / run / "summary.json").stat().st_mtime_ns for run in first} == stamps
    assert counts == {"train": 0, "train_pack": 1, "take_packed": 2}, counts  # the two new runs only
    outcomes = (work / "logs/train_pack").glob("*.log")
    assert sum(p.read_text().count('"status": "done before"') for p in outcomes) == 2
