"""fedrepro plan: runs per experiment, shared and finished runs, local steps and their cost."""
from __future__ import annotations

import json
import math

import pytest

from fedrepro import cli, config, plan


def _params(**base):
    return {"experiments": {
        "a": {"base": {"dataset": "fmnist", "model": "mlp", "num_clients": 10, "participation": 0.5, "rounds": 4,
                       "local_epochs": 2, "batch_size": 100, **base},
              "grid": {"seed": [1, 2]}},
        "b": {"base": {"dataset": "fmnist", "model": "mlp", "num_clients": 10, "participation": 0.5, "rounds": 4,
                       "local_epochs": 2, "batch_size": 100, **base},
              "grid": {"seed": [2, 3]}}}}


def test_local_steps_formula():
    setting = config.resolve({"dataset": "fmnist", "num_clients": 10, "participation": 0.5, "rounds": 4,
                              "local_epochs": 2, "batch_size": 100})
    # 4 rounds x 5 clients x 2 epochs x ceil(6000 / 100)
    assert plan.local_steps(setting) == 4 * 5 * 2 * 60


def test_random_epochs_count_their_mean():
    setting = {"dataset": "fmnist", "num_clients": 10, "participation": 0.5, "rounds": 1, "local_epochs": 9,
               "batch_size": 6000, "plugins": ["random_epochs"], "random_epochs": {"low": 2, "high": 5}}
    assert plan.local_steps(setting) == 5 * 3.5


def test_plan_counts_shared_and_finished_runs_once(tmp_path):
    params = config.validate(_params(), "params.schema.yaml", "test")
    runs = config.expand(params)
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


def test_without_a_benchmark_the_estimate_says_it_is_a_guess(tmp_path):
    params = config.validate(_params(), "params.schema.yaml", "test")
    result = plan.plan(params, tmp_path / "absent.json", tmp_path)
    assert "rough guess" in result["source"] and result["total"]["seconds"] > 0
    assert "rough guess" in plan.format_plan(result)


def test_batch_size_scales_a_per_batch_measurement():
    costs = {"mlp": {"seconds": 1.0, "batch_size": 50}, "cnn/cifar10": 3.0}
    assert plan.step_seconds(costs, {"model": "mlp", "dataset": "fmnist", "batch_size": 100}) == 2.0
    assert plan.step_seconds(costs, {"model": "cnn", "dataset": "cifar10", "batch_size": 100}) == 3.0
    assert plan.step_seconds(costs, {"model": "vgg11", "dataset": "cifar10", "batch_size": 100}) is None


def test_measured_keys_win_and_the_nearest_measured_batch_is_scaled():
    costs = {"fmnist/cnn:50": 0.02, "fmnist/cnn:200": 0.05, "cnn": {"seconds": 9.0, "batch_size": 64}}
    assert plan.step_seconds(costs, {"model": "cnn", "dataset": "fmnist", "batch_size": 50}) == 0.02
    assert plan.step_seconds(costs, {"model": "cnn", "dataset": "fmnist", "batch_size": 100}) == 0.04  # 50 is nearer
    assert plan.step_seconds(costs, {"model": "cnn", "dataset": "fmnist", "batch_size": 25}) == 0.02   # not below


def test_the_benchmarks_table_per_device_is_read_gpu_first(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"step_seconds": {"cpu": {"fmnist/mlp:64": 1.0}, "cuda": {"fmnist/mlp:64": 0.001}}}))
    costs, source = plan.load_step_costs(bench)
    assert costs == {"fmnist/mlp:64": 0.001} and source == f"measured on cuda ({bench})"
    with pytest.raises(ValueError, match="not a step_costs file"):
        plan.measure(config.validate(_params(), "params.schema.yaml", "test"), "cpu", bench)


def test_measure_times_every_setting_of_the_params_file_and_plan_uses_it(tmp_path):
    params = config.validate(_params(batch_size=8), "params.schema.yaml", "test")
    out = tmp_path / "step_costs.json"
    table = plan.measure(params, "cpu", out, steps=2, log=lambda line: None)
    assert list(table["step_seconds"]) == ["fmnist/mlp:8"] and table["step_seconds"]["fmnist/mlp:8"] > 0
    assert table["device"] == "cpu" and json.loads(out.read_text()) == table
    result = plan.plan(params, out, tmp_path)
    steps = 4 * 5 * 2 * 750  # ceil(6000 / 8)
    assert result["total"]["seconds"] == pytest.approx(3 * steps * table["step_seconds"]["fmnist/mlp:8"])
    assert result["source"] == f"measured on cpu ({out})"


def test_pythia_is_timed_from_its_published_architecture_without_the_hub():
    setting = {"dataset": "agnews", "model": "pythia70m", "batch_size": 2, "pretrained": {"max_length": 8}}
    forward, module, inputs, labels = plan._timed_model(setting, plan.torch.device("cpu"))
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
    assert math.isfinite(out["total"]["seconds"])


def test_cli_plan_merges_a_subset_file_as_snakemake_does(tmp_path, capsys):
    import yaml
    base, subset = tmp_path / "p.yaml", tmp_path / "only_b_seed3.yaml"
    base.write_text(yaml.safe_dump(_params()))
    subset.write_text(yaml.safe_dump({"only": "b", "experiments": {"b": {"grid": {"seed": [3]}}}}))
    cli.main(["plan", "--configfile", str(base), str(subset), "--json", "--runs-dir", str(tmp_path)])
    out = json.loads(capsys.readouterr().out)
    assert list(out["experiments"]) == ["b"] and out["total"]["runs"] == 1, "lists replace, only applies"
    assert out["experiments"]["b"]["steps"] == 4 * 5 * 2 * 60, "the base's settings still hold"
