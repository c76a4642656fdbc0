"""fedrepro plan: runs per experiment, shared and finished runs, local steps and their cost."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from conftest import ROOT
from fedrepro import cli
from fedrepro.configure import expansion, paramsfile, schema, settings
from fedrepro.ops import plan, pricing


def _params(**base):
    return {
        "experiments": {
            "a": {
                "base": {
                    "dataset": "fmnist",
                    "model": "mlp",
                    "num_clients": 10,
                    "participation": 0.5,
                    "rounds": 4,
                    "local_epochs": 2,
                    "batch_size": 100,
                    **base,
                },
                "grid": {"seed": [1, 2]},
            },
            "b": {
                "base": {
                    "dataset": "fmnist",
                    "model": "mlp",
                    "num_clients": 10,
                    "participation": 0.5,
                    "rounds": 4,
                    "local_epochs": 2,
                    "batch_size": 100,
                    **base,
                },
                "grid": {"seed": [2, 3]},
            },
        }
    }


def test_local_steps_formula():
    setting = settings.resolve(
        {
            "dataset": "fmnist",
            "num_clients": 10,
            "participation": 0.5,
            "rounds": 4,
            "local_epochs": 2,
            "batch_size": 100,
        }
    )
    # 4 rounds x 5 clients x 2 epochs x ceil(6000 / 100)
    assert pricing.local_steps(setting) == 4 * 5 * 2 * 60


def test_random_epochs_count_their_mean():
    setting = {
        "dataset": "fmnist",
        "num_clients": 10,
        "participation": 0.5,
        "rounds": 1,
        "local_epochs": 9,
        "batch_size": 6000,
        "plugins": ["random_epochs"],
        "random_epochs": {"low": 2, "high": 5},
    }
    assert pricing.local_steps(setting) == 5 * 3.5


def test_plan_counts_shared_and_finished_runs_once(tmp_path):
    params = schema.validate(_params(), "params.schema.yaml", "test")
    runs = expansion.expand(params)
    done = next(r for r in runs if r.experiment == "a" and r.setting["seed"] == 1)
    (tmp_path / done.id).mkdir()
    (tmp_path / done.id / "summary.json").write_text("{}")
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"step_seconds": {"mlp": 0.5}}))
    result = plan.plan(params, bench, tmp_path)
    a, b = result["experiments"]["a"], result["experiments"]["b"]
    assert (a["runs"], a["done"], a["shared"]) == (2, 1, 0)
    assert (b["runs"], b["shared"]) == (2, 1), "seed 2 is the same run in both experiments"
    steps = 4 * 5 * 2 * 60
    assert a["steps"] == steps and b["steps"] == steps
    assert result["total"]["seconds"] == pytest.approx(2 * steps * 0.5)
    assert result["unique_runs"] == 3 and result["source"].startswith("measured on unknown device")


def test_plan_counts_the_rounds_a_forked_run_trains_itself_and_both_ways(tmp_path):
    """FedAvg, FedAvg+IMA from 0.75 R (= 15 of 20) and from round 8, FedProx+IMA with no FedProx run: the IMA
    runs with a host sibling train 5 and 12 rounds; without sharing every run trains 20."""
    base = {
        "dataset": "fmnist",
        "model": "mlp",
        "num_clients": 10,
        "participation": 0.5,
        "rounds": 20,
        "local_epochs": 1,
        "batch_size": 100,
    }
    points = [
        {"algorithm": "fedavg"},
        {"algorithm": "fedavg+ima"},
        {"algorithm": "fedavg+ima", "ima": {"start_round": 8}},
        {"algorithm": "fedprox+ima"},
    ]
    params = schema.validate(
        {"experiments": {"e": {"base": base, "grid": {"setting": points}}}}, "params.schema.yaml", "test"
    )
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"step_seconds": {"mlp": 0.5}}))
    result = plan.plan(params, bench, tmp_path)
    total, per_round = result["total"], 5 * 1 * 60 * 0.5  # cohort x epochs x steps per epoch x seconds
    assert (total["rounds"], total["rounds_unshared"]) == (20 + 5 + 12 + 20, 4 * 20)
    assert total["seconds"] == pytest.approx(57 * per_round) and total["seconds_unshared"] == pytest.approx(
        80 * per_round
    )
    assert result["forked_runs"] == 2
    assert (
        "rounds: 57 (80 without shared prefixes, 29% saved; 2 runs start from another run's state)"
        in plan.format_plan(result)
    )
    assert "tuning stage:" not in plan.format_plan(result), "no tuning stage, no line about it"
    off = plan.plan({**params, "share_prefixes": "false"}, bench, tmp_path)
    assert off["total"]["rounds"] == off["total"]["rounds_unshared"] == 80 and off["forked_runs"] == 0
    assert "share_prefixes: false" in plan.format_plan(off)


def test_plan_gives_the_rounds_saved_outside_the_tuning_stage(tmp_path):
    """FedAvg, FedProx and both +IMA from round 8 of 20, FedProx's mu tuned on two candidates (tuning runs of
    the bare method, sharing no prefix). Counted by hand: the IMA runs train 12 rounds each, everything else
    20; the tuning stage's 2 x 20 rounds dilute what sharing saves on the reported runs (20%) to 13%."""
    base = {
        "dataset": "fmnist",
        "model": "mlp",
        "num_clients": 10,
        "participation": 0.5,
        "rounds": 20,
        "local_epochs": 1,
        "batch_size": 100,
        "ima": {"start_round": 8},
    }
    params = schema.validate(
        {
            "experiments": {
                "e": {
                    "base": base,
                    "grid": {"algorithm": ["fedavg", "fedavg+ima", "fedprox", "fedprox+ima"]},
                    "tune": [
                        {
                            "when": {"algorithm": "fedprox"},
                            "without": ["ima"],
                            "grid": {"fedprox.mu": [0.1, 0.01]},
                            "seeds": [7],
                        }
                    ],
                }
            }
        },
        "params.schema.yaml",
        "test",
    )
    result = plan.plan(params, runs_dir=tmp_path / "runs")
    total = result["total"]
    assert (total["rounds"], total["rounds_unshared"]) == (20 + 12 + 20 + 12 + 2 * 20, 6 * 20)
    assert (total["rounds_tuning"], total["rounds_tuning_unshared"]) == (2 * 20, 2 * 20)
    text = plan.format_plan(result)
    assert "rounds: 104 (120 without shared prefixes, 13% saved; 2 runs start from another run's state)" in text
    assert "rounds outside the tuning stage: 64 (80 without shared prefixes, 20% saved); in it: 40 (40 " in text


def test_without_a_benchmark_the_estimate_says_it_is_a_guess(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no results/bench, no evidence/gpu
    params = schema.validate(_params(), "params.schema.yaml", "test")
    result = plan.plan(params, None, tmp_path)
    assert "rough guess" in result["source"] and result["total"]["seconds"] > 0
    assert result["experiments"]["a"]["priced_by"] == ["guess (rough table)"]
    assert "priced by: guess (rough table)" in plan.format_plan(result)
    with pytest.raises(pricing.PlanError, match="--bench .*absent.json: no step costs"):
        plan.plan(params, tmp_path / "absent.json", tmp_path)


def test_batch_size_scales_a_per_batch_measurement():
    costs = {"mlp": {"seconds": 1.0, "batch_size": 50}, "cnn/cifar10": 3.0}
    assert pricing.step_seconds(costs, {"model": "mlp", "dataset": "fmnist", "batch_size": 100}) == 2.0
    assert pricing.step_seconds(costs, {"model": "cnn", "dataset": "cifar10", "batch_size": 100}) == 3.0
    assert pricing.step_seconds(costs, {"model": "vgg11", "dataset": "cifar10", "batch_size": 100}) is None


def test_measured_keys_win_and_the_nearest_measured_batch_is_scaled():
    costs = {"fmnist/cnn:50": 0.02, "fmnist/cnn:200": 0.05, "cnn": {"seconds": 9.0, "batch_size": 64}}
    assert pricing.step_seconds(costs, {"model": "cnn", "dataset": "fmnist", "batch_size": 50}) == 0.02
    assert pricing.step_seconds(costs, {"model": "cnn", "dataset": "fmnist", "batch_size": 100}) == 0.04  # 50 is nearer
    assert pricing.step_seconds(costs, {"model": "cnn", "dataset": "fmnist", "batch_size": 25}) == 0.02  # not below


def test_the_benchmarks_table_of_the_planned_device_is_read(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"step_seconds": {"cpu": {"fmnist/mlp:64": 1.0}, "cuda:0": {"fmnist/mlp:64": 0.001}}}))
    gpu, cpu = pricing.step_costs("cuda", bench).tables[0], pricing.step_costs("cpu", bench).tables[0]
    assert gpu.costs == {"fmnist/mlp:64": 0.001} and gpu.description == f"measured on cuda:0 ({bench})"
    assert cpu.costs == {"fmnist/mlp:64": 1.0} and cpu.description == f"measured on cpu ({bench})"
    with pytest.raises(ValueError, match="not a step_costs file"):
        pricing.measure(schema.validate(_params(), "params.schema.yaml", "test"), "cpu", bench)


def test_measure_times_every_setting_of_the_params_file_and_plan_uses_it(tmp_path):
    params = schema.validate(_params(batch_size=8), "params.schema.yaml", "test")
    out = tmp_path / "step_costs.json"
    table = pricing.measure(params, "cpu", out, steps=2, log=lambda line: None)
    assert list(table["step_seconds"]) == ["fmnist/mlp:8"] and table["step_seconds"]["fmnist/mlp:8"] > 0
    assert table["device"] == "cpu" and json.loads(out.read_text()) == table
    result = plan.plan(params, out, tmp_path, device="cpu")
    steps = 4 * 5 * 2 * 750  # ceil(6000 / 8)
    assert result["total"]["seconds"] == pytest.approx(3 * steps * table["step_seconds"]["fmnist/mlp:8"])
    assert result["source"] == f"measured on cpu ({out})"
    with pytest.raises(pricing.PlanError, match="measured on cpu, none on cuda: plan with --device cpu"):
        plan.plan(params, out, tmp_path, device="cuda")  # a CPU measurement never prices a GPU plan


def test_pythia_is_timed_from_its_published_architecture_without_the_hub():
    setting = {"dataset": "agnews", "model": "pythia70m", "batch_size": 2, "pretrained": {"max_length": 8}}
    forward, module, inputs, labels = pricing._timed_model(setting, torch.device("cpu"))
    # Pythia-70M has 70,426,624 parameters with its 50304 x 512 output embedding; the classifier replaces
    # that by a 512 x 4 score head (no bias)
    assert sum(p.numel() for p in module.parameters()) == 70_426_624 - 50304 * 512 + 512 * 4
    assert forward(inputs).shape == (2, 4) and inputs.input_ids.shape == (2, 8)


def test_cli_plan_with_only(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    import yaml

    path.write_text(yaml.safe_dump(_params()))
    cli.main(["plan", "--configfile", str(path), "--only", "b", "--json", "--runs-dir", str(tmp_path)])
    out = json.loads(capsys.readouterr().out)
    assert list(out["experiments"]) == ["b"] and out["total"]["runs"] == 2
    # b alone trains both its runs in full (its seed-2 run is shared with a only when a is planned too):
    # 2 runs x 4 rounds x 5 clients x 2 epochs x 6000 / 100 steps, each at the rough table's MLP price
    # scaled from its batch to 100
    steps = 2 * 4 * 5 * 2 * 60
    assert out["total"]["steps"] == steps
    run = next(r for r in expansion.expand(_params()) if r.experiment == "b")
    price, _ = pricing.step_costs("cuda").price(run.setting)
    assert out["total"]["seconds"] == pytest.approx(steps * price, rel=1e-12)


def test_cli_plan_merges_a_subset_file_as_snakemake_does(tmp_path, capsys):
    import yaml

    base, subset = tmp_path / "p.yaml", tmp_path / "only_b_seed3.yaml"
    base.write_text(yaml.safe_dump(_params()))
    subset.write_text(yaml.safe_dump({"only": "b", "experiments": {"b": {"grid": {"seed": [3]}}}}))
    cli.main(["plan", "--configfile", str(base), str(subset), "--json", "--runs-dir", str(tmp_path)])
    out = json.loads(capsys.readouterr().out)
    assert list(out["experiments"]) == ["b"] and out["total"]["runs"] == 1, "lists replace, only applies"
    assert out["experiments"]["b"]["steps"] == 4 * 5 * 2 * 60, "the base's settings still hold"


# --------------------------------------------------------------------------- cluster requests


def test_run_minutes_is_steps_times_cost_times_margin():
    setting = settings.resolve(
        {
            "dataset": "fmnist",
            "model": "mlp",
            "num_clients": 10,
            "participation": 0.5,
            "rounds": 100,
            "local_epochs": 2,
            "batch_size": 100,
        }
    )
    costs = {"fmnist/mlp:100": 0.01}
    # 100 x 5 x 2 x 60 = 60,000 steps x 0.01 s = 600 s = 10 min, x3 margin = 30 min
    assert plan.run_minutes(setting, costs) == 30
    assert plan.run_minutes({**setting, "rounds": 1}, costs) == plan.RUNTIME_FLOOR_MIN
    assert plan.run_minutes({**setting, "model": "cnn"}, costs) == 120  # no cost known: the old request


def test_run_minutes_counts_the_rounds_the_job_trains():
    """A run started from another run's state at round t (a fork) trains rounds t..R-1; the fork step that
    trains a parent's prefix again, rounds 0..t-1: each asks for what a run of that many rounds asks for."""
    setting = settings.resolve(
        {
            "dataset": "fmnist",
            "model": "mlp",
            "num_clients": 10,
            "participation": 0.5,
            "rounds": 100,
            "local_epochs": 2,
            "batch_size": 100,
        }
    )
    costs = {"fmnist/mlp:100": 0.1}  # 60,000 steps x 0.1 s x 3 = 300 min for the 100 rounds, above the floor
    assert plan.run_minutes(setting, costs, start=75) == plan.run_minutes({**setting, "rounds": 25}, costs) == 75
    assert plan.run_minutes(setting, costs, stop=60) == plan.run_minutes({**setting, "rounds": 60}, costs) == 180
    assert pricing.local_steps(setting, 75) + pricing.local_steps(setting, stop=75) == pricing.local_steps(setting)


def test_cluster_requests_count_a_childs_rounds_from_its_fork(tmp_path):
    params = schema.validate(
        {
            "experiments": {
                "e": {
                    "base": {
                        "dataset": "fmnist",
                        "model": "mlp",
                        "num_clients": 10,
                        "participation": 0.5,
                        "rounds": 100,
                        "local_epochs": 2,
                        "batch_size": 100,
                        "ima": {"start_round": 75},
                    },
                    "grid": {"algorithm": ["fedavg", "fedavg+ima"]},
                }
            }
        },
        "params.schema.yaml",
        "test",
    )
    runs = expansion.unique_runs(expansion.expand(params))
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"device": "cuda", "step_seconds": {"fmnist/mlp:100": 0.1}}))
    by = {"child" if run.setting["plugins"] else "parent": run.id for run in runs.values()}
    # 100 x 5 x 2 x 60 steps x 0.1 s x 3 = 300 min; the child's last 25 rounds a quarter of it
    for share, child in ((True, 75), (False, 300)):
        asked = plan.cluster_requests({**params, "share_prefixes": share}, 600, bench=costs)["run_minutes"]
        assert asked == {by["parent"]: 300, by["child"]: child}


@pytest.mark.parametrize(
    "minutes,walltime,per_gpu,size",
    [
        ([30, 20, 30], 240, 4, 32),  # 8 layers of 30 min, 4 runs each
        ([30], 240, 1, 8),
        ([100], 240, 4, 8),  # 2 layers fit, the third would not
        ([240], 240, 2, 2),
        ([70, 50], 240, 3, 9),  # 3 layers of 70 min = 210 <= 240 < 280
    ],
)
def test_group_size_keeps_the_submission_within_walltime(minutes, walltime, per_gpu, size):
    assert plan.group_size(minutes, walltime, per_gpu) == size
    # what Snakemake asks for a group of n: ceil(n / per_gpu) layers of the longest run. The group fits,
    # its layers are full (a smaller group would waste GPU slots) and one more run, a new layer, would not fit
    asked = lambda n: math.ceil(n / per_gpu) * max(minutes)  # noqa: E731
    assert size % per_gpu == 0
    assert asked(size) <= walltime < asked(size + 1)


def test_group_size_names_a_run_longer_than_the_walltime():
    with pytest.raises(ValueError, match="more than the site's walltime of 60 min"):
        plan.group_size([90, 10], 60)


def test_plan_prints_group_size_for_a_walltime(tmp_path, capsys):
    import yaml

    params = tmp_path / "p.yaml"
    params.write_text(yaml.safe_dump(_params()))
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"device": "cuda", "step_seconds": {"fmnist/mlp:100": 1.0}}))
    cli.main(
        [
            "plan",
            "--configfile",
            str(params),
            "--bench",
            str(costs),
            "--walltime",
            "240",
            "--runs-per-gpu",
            "2",
            "--runs-dir",
            str(tmp_path / "none"),
        ]
    )
    out = capsys.readouterr().out
    # each run: 4 x 5 x 2 x 60 = 2,400 steps x 1 s x 3 = 120 min; 2 layers of 2 runs fit in 240 min
    assert "runs ask for 120-120 min" in out and "--group-components trainbatch=4" in out
    assert "(1 submissions)" in out  # 3 distinct runs


# --------------------------------------------------------------------------- what sbatch is asked for

FAKE_SBATCH = '#!/bin/bash\nprintf "%s\\n" "$*" >> "$SBATCH_RECORD"\nexit 1\n'


def _sbatch_lines(tmp_path, runs: int, *extra) -> list[str]:
    """Submit ``runs`` train jobs through the real slurm profile and executor plugin to an ``sbatch``
    that records its arguments (and refuses the job); return the recorded calls."""
    import os
    import signal
    import subprocess
    import time

    import yaml

    from conftest import snakemake_cmd, subprocess_env

    params = {
        "title": "t",
        "data": {"root": "data"},
        "experiments": {
            "tiny": {
                "base": {
                    "dataset": "fmnist",
                    "model": "mlp",
                    "num_clients": 4,
                    "participation": 0.5,
                    "rounds": 2,
                    "batch_size": 256,
                    "partition": {"kind": "iid", "seed": 1},
                },
                "grid": {"seed": list(range(1, runs + 1))},
            }
        },
    }
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(params))
    expanded = expansion.unique_runs(expansion.expand(params))
    for run in expanded.values():  # the train jobs' inputs exist: only train is submitted
        part = tmp_path / "results/partitions" / run.partition / "clients.npz"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_text("")
    (tmp_path / "data/fmnist").mkdir(parents=True)
    (tmp_path / "data/fmnist/download.json").write_text("{}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    for name in ("sacct", "sacctmgr", "sshare", "sinfo", "squeue", "scontrol"):  # site queries: nothing to say
        (bin_dir / name).write_text("#!/bin/bash\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    record = tmp_path / "sbatch.txt"
    env = subprocess_env(SBATCH_RECORD=str(record))
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    targets = [f"results/runs/{run_id}/summary.json" for run_id in expanded]
    cmd = snakemake_cmd(
        tmp_path,
        *targets,
        "--configfile",
        str(tmp_path / "tiny.yaml"),
        "--workflow-profile",
        str(ROOT / "workflow/profiles/slurm"),
        "--default-resources",
        "slurm_partition=debug",
        "slurm_account=acc",
        "mem_mb=500",
        "--retries",
        "0",
        *extra,
    )
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        for _ in range(600):  # the call is recorded at submission; the executor then waits on its status
            if record.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    assert record.exists(), out[-4000:]
    return record.read_text().splitlines()


@pytest.mark.slow
def test_sbatch_one_gpu_for_a_group_of_runs_with_runtime_from_step_costs(tmp_path):
    # the profile's default: one run at a time on the submission's one GPU (each job is its own srun step,
    # which the jobstep plugin gives --gpus=<int>; sharing one GPU between steps needs the site's GPU sharing)
    (call,) = _sbatch_lines(tmp_path, 5)
    # 5 runs one after another: five 10-minute floors (2 rounds of a tiny MLP), one CPU, one run's memory
    assert " --gpus=1 " in call and "--gres" not in call
    assert " -t 50 " in call and "--cpus-per-task=1" in call and " --mem 4000 " in call


@pytest.mark.slow
def test_sbatch_gres_recipe_of_the_docs(tmp_path):
    (call,) = _sbatch_lines(tmp_path, 2, "--set-resources", "train:gpu=0", "train:gres=gpu:1")
    assert " --gres=gpu:1 " in call and "--gpus" not in call


def test_runs_per_gpu_comes_from_a_gpu_throughput_measurement(tmp_path):
    check = tmp_path / "gpu_check.json"
    assert plan.measured_runs_per_gpu([check]) == (plan.RUNS_PER_GPU, "default (no GPU throughput measurement)")
    check.write_text(
        json.dumps(
            {
                "bench": {
                    "throughput": [
                        {"device": "cuda", "setting": "fmnist_cnn", "runs_per_device": 8},
                        {"device": "cuda", "setting": "fmnist_mlp", "runs_per_device": 6},
                        {"device": "cpu", "setting": "fmnist_mlp", "runs_per_device": 1},
                    ]
                }
            }
        )
    )
    assert plan.measured_runs_per_gpu([check]) == (6, f"measured ({check})")


def test_without_a_measurement_of_its_own_the_plan_uses_the_h200s(tmp_path, monkeypatch):
    """A checkout with no results/bench plans with the step costs and runs per GPU measured on the H200
    (evidence/gpu), not the rough guesses; a measurement of its own wins."""
    measured = json.loads((ROOT / pricing.H200_STEP_COSTS_FILE).read_text())
    monkeypatch.chdir(tmp_path)
    assert [t.label for t in pricing.step_costs().tables] == ["guess (rough table)"]
    _copy_evidence(tmp_path)
    first = pricing.step_costs().tables[0]
    assert first.costs == measured["step_seconds"] and "H200" in first.description
    assert plan.measured_runs_per_gpu() == (4, f"measured ({pricing.H200_BENCH_FILE})")
    own = tmp_path / pricing.STEP_COSTS_FILE
    own.parent.mkdir(parents=True)
    own.write_text(json.dumps({"device": "cuda", "step_seconds": {"fmnist/mlp:64": 0.5}}))
    first = pricing.step_costs().tables[0]
    assert (first.costs, first.description) == ({"fmnist/mlp:64": 0.5}, f"measured on cuda ({pricing.STEP_COSTS_FILE})")


def test_a_cpu_plan_reads_the_kept_cpu_table_before_guessing(tmp_path, monkeypatch):
    """Without a CPU measurement of its own, a CPU plan prices what evidence/bench measured on the project's CPU;
    only what that table lacks is the GPU's cost x ROUGH_CPU_OVER_GPU; a measurement of its own comes first."""
    kept = json.loads((ROOT / pricing.CPU_STEP_COSTS_FILE).read_text())
    monkeypatch.chdir(tmp_path)
    _copy_evidence(tmp_path)
    assert [t.label for t in pricing.step_costs("cpu").tables] == ["guess (GPU table x 50)", "guess (rough table x 50)"]
    (tmp_path / pricing.CPU_STEP_COSTS_FILE).parent.mkdir(parents=True)
    (tmp_path / pricing.CPU_STEP_COSTS_FILE).write_text((ROOT / pricing.CPU_STEP_COSTS_FILE).read_text())
    tables = pricing.step_costs("cpu").tables
    assert tables[0].costs == kept["step_seconds"] and not tables[0].guess
    assert tables[0].description == f"measured on cpu ({pricing.CPU_STEP_COSTS_FILE})"
    assert [t.label for t in pricing.step_costs("cuda").tables][0] == "GPU table"  # a GPU plan never reads it
    own = tmp_path / pricing.STEP_COSTS_FILE
    own.parent.mkdir(parents=True)
    own.write_text(json.dumps({"device": "cpu", "step_seconds": {"fmnist/lenet5:128": 0.5}}))
    assert pricing.step_costs("cpu").tables[0].costs == {"fmnist/lenet5:128": 0.5}


def test_the_kept_cpu_table_prices_every_model_of_the_cpu_reachable_experiments():
    """FedLAW Table 3's FMNIST columns (MLP and LeNet-5), IMA Table 1's FMNIST CNN, FedNova Fig. 5's logistic
    regression and the default file's MLP: each (dataset, model, batch) has a CPU measurement, none a guess."""
    costs = json.loads((ROOT / pricing.CPU_STEP_COSTS_FILE).read_text())
    assert costs["device"] == "cpu" and costs["machine"]["torch_threads"] == 1
    files = {
        "params/fedlaw.yaml": "fedlaw_table3_fmnist",
        "params/ima.yaml": "ima_table1_fmnist",
        "params/fednova.yaml": "fednova_fig5_synthetic",
        "params/default.yaml": None,
    }
    keys = set()
    for path, only in files.items():
        params = paramsfile.load_params_files([str(ROOT / path)])
        if only:
            params["only"] = only
        keys |= {pricing.step_key(r.setting) for r in expansion.expand(params)}
    assert {"fmnist/lenet5:128", "fmnist/mlp:128", "fmnist/cnn:50", "synthetic_1_1/logreg:20"} <= keys
    assert keys <= set(costs["step_seconds"]), sorted(keys - set(costs["step_seconds"]))
    assert all(v > 0 for v in costs["step_seconds"].values())


def test_a_cpu_step_is_timed_in_cpu_seconds_not_wall_seconds(monkeypatch):
    """A plan prices CPU-hours: time another process holds the core (wall clock only) is not the step's cost."""
    clocks = {"process_time": iter([10.0, 10.5]), "perf_counter": iter([0.0, 99.0])}
    monkeypatch.setattr(pricing.time, "process_time", lambda: next(clocks["process_time"]))
    monkeypatch.setattr(pricing.time, "perf_counter", lambda: next(clocks["perf_counter"]))
    setting = {"dataset": "fmnist", "model": "mlp", "batch_size": 4}
    assert pricing.measure_step(setting, "cpu", steps=5, warmup=1) == pytest.approx(0.1)


def test_the_h200_table_prices_every_setting_of_the_papers():
    costs = json.loads((ROOT / pricing.H200_STEP_COSTS_FILE).read_text())["step_seconds"]
    from fedrepro.ops.gpucheck import PAPER_PARAMS  # the files the table was measured from

    runs = expansion.expand(paramsfile.load_params_files([str(ROOT / p) for p in PAPER_PARAMS]))
    unpriced = sorted({pricing.step_key(r.setting) for r in runs if pricing.step_seconds(costs, r.setting) is None})
    assert not unpriced, f"no H200 step cost (gpucheck.measure_step_costs) for {unpriced}"


# --------------------------------------------------------------------------- which device's step costs price a plan

PAPERS = ["params/fedaware.yaml", "params/fedlaw.yaml", "params/ima.yaml", "params/fednova.yaml"]
# What `snakemake bench` writes on a CPU machine: three settings, timed on the CPU only.
CPU_BENCH = {"step_seconds": {"cpu": {"fmnist/mlp:64": 5.3e-4, "fmnist/cnn:50": 5.7e-3, "cifar10/cnn:64": 2.6e-2}}}


def _copy_evidence(root: Path) -> None:
    for name in (pricing.H200_STEP_COSTS_FILE, pricing.H200_BENCH_FILE):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text((ROOT / name).read_text())


def _write_bench(root: Path, table: dict) -> None:
    (root / pricing.BENCH_FILE).parent.mkdir(parents=True, exist_ok=True)
    (root / pricing.BENCH_FILE).write_text(json.dumps(table))


def _cli_plan(capsys, tmp_path, configfile, *extra) -> dict:
    cli.main(["plan", "--configfile", str(configfile), "--json", "--runs-dir", str(tmp_path / "none"), *extra])
    return json.loads(capsys.readouterr().out)


def _two_settings(tmp_path) -> Path:
    """One experiment of FMNIST CNN, batch 50 (what a benchmark measures), one of a CIFAR-10 ResNet-20 (not)."""
    import yaml

    common = {"num_clients": 10, "participation": 0.5, "rounds": 4, "local_epochs": 1}
    path = tmp_path / "two.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "experiments": {
                    "covered": {"base": {**common, "dataset": "fmnist", "model": "cnn", "batch_size": 50}},
                    "other": {"base": {**common, "dataset": "cifar10", "model": "resnet20", "batch_size": 128}},
                }
            }
        )
    )
    return path


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_bench_covering_one_setting_leaves_the_others_to_the_table(tmp_path, monkeypatch, capsys, device):
    monkeypatch.chdir(tmp_path)
    _copy_evidence(tmp_path)
    _write_bench(tmp_path, {"step_seconds": {device: {"fmnist/cnn:50": 0.01}}})
    h200 = json.loads((ROOT / pricing.H200_STEP_COSTS_FILE).read_text())["step_seconds"]["cifar10/resnet20:128"]
    out = _cli_plan(capsys, tmp_path, _two_settings(tmp_path), "--device", device)
    covered, other = out["experiments"]["covered"], out["experiments"]["other"]
    # 4 rounds x 5 clients x 1 epoch x ceil(6000 / 50) steps; ceil(5000 / 128) for CIFAR-10
    assert covered["seconds"] == pytest.approx(4 * 5 * 120 * 0.01)
    assert other["unknown"] == [] and other["seconds"] > 0, "a setting the bench did not time is priced at 0"
    factor = 1.0 if device == "cuda" else pricing.ROUGH_CPU_OVER_GPU  # a CPU plan guesses from the GPU table
    assert other["seconds"] == pytest.approx(4 * 5 * 40 * h200 * factor)
    assert covered["priced_by"] == [f"measured on {device} (bench.json)"]
    assert other["priced_by"] == ["GPU table" if device == "cuda" else "guess (GPU table x 50)"]


@pytest.mark.parametrize("paper", PAPERS)
def test_a_cpu_benchmark_prices_no_experiment_at_zero_and_leaves_the_gpu_plan_as_it_was(
    tmp_path, monkeypatch, capsys, paper
):
    monkeypatch.chdir(tmp_path)
    _copy_evidence(tmp_path)
    before = _cli_plan(capsys, tmp_path, ROOT / paper)
    _write_bench(tmp_path, CPU_BENCH)
    for device in ("cuda", "cpu"):
        out = _cli_plan(capsys, tmp_path, ROOT / paper, "--device", device)
        zero = [name for name, row in out["experiments"].items() if row["seconds"] <= 0 or row["unknown"]]
        assert not zero, f"{paper} on {device}: priced at 0 h: {zero}"
        if device == "cuda":
            assert out["total"] == before["total"], "a CPU benchmark changed the GPU plan"
        else:
            assert out["total"]["seconds"] > before["total"]["seconds"]


def test_runtime_requests_after_a_cpu_benchmark_are_those_of_the_gpu_table(tmp_path, monkeypatch, capsys):
    """The train rule's runtime requests (cluster_requests prices runs as it does): a CPU benchmark changes
    no GPU run's request, and a setting it does not cover is still priced by the table, not the 120-minute
    fallback of an unknown model."""
    monkeypatch.chdir(tmp_path)
    _copy_evidence(tmp_path)
    params = _two_settings(tmp_path)
    before = _cli_plan(capsys, tmp_path, params, "--walltime", "600")["cluster"]["run_minutes"]
    _write_bench(tmp_path, CPU_BENCH)
    after = _cli_plan(capsys, tmp_path, params, "--walltime", "600")["cluster"]["run_minutes"]
    assert after == before
    costs = pricing.step_costs_by_device()
    setting = settings.resolve(
        {
            "dataset": "fmnist",
            "model": "cnn",
            "num_clients": 10,
            "participation": 0.5,
            "rounds": 400,
            "local_epochs": 1,
            "batch_size": 50,
            "device": "cpu",
        }
    )
    # 400 x 5 x 120 = 240,000 steps x 5.7 ms = 1,368 s, x 3 = 68.4 min: a device: cpu run asks for the CPU's cost
    assert plan.run_minutes(setting, costs[pricing.run_device(setting)]) == 69


def test_plan_names_the_device_option_on_a_device_it_does_not_know(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["plan", "--configfile", str(_two_settings(tmp_path)), "--device", "tpu"])
    assert exit_.value.code == 2  # argparse's usage error
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--device" in err and "'cuda', 'cpu'" in err
