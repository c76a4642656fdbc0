"""`fedrepro bench` at CI size: it runs, writes what `fedrepro plan` reads, and its three loops do
the same amount of work. (No timing assertions: speed goals live in the benchmark, not in tests.)"""
from __future__ import annotations

import copy
import json

import pytest
import torch

from fedrepro import bench, cli, data, engine


def test_quick_bench_writes_json_table_and_page(tmp_path, capsys):
    out, page = tmp_path / "bench.json", tmp_path / "bench.html"
    cli.main(["bench", "--quick", "--rounds", "1", "--device", "cpu", "--settings", "fmnist_mlp", "cifar_cnn",
              "--data-root", str(tmp_path / "absent"), "--out", str(out), "--html", str(page)])
    printed = capsys.readouterr().out
    assert "(b)/(a)" in printed and "Machine:" in printed
    report = json.loads(out.read_text())
    assert [r["setting"] for r in report["results"]] == ["fmnist_mlp", "cifar_cnn"]
    for r in report["results"]:
        seconds = r["seconds_per_round"]
        assert all(seconds[k] > 0 for k in ("engine", "reference", "floor"))
        assert r["ratios"]["reference_over_engine"] == seconds["reference"] / seconds["engine"]
        assert r["ratios"]["engine_over_floor"] == seconds["engine"] / seconds["floor"]
        assert r["memory"]["reference"]["peak_rss_mb"] >= r["memory"]["engine"]["peak_rss_mb"] > 0
        assert r["data"] == "generated"
    # the per-step costs, keyed by device and <dataset>/<model>:<batch size>
    assert set(report["step_seconds"]["cpu"]) == {"fmnist/mlp:64", "cifar10/cnn:64"}
    assert all(v > 0 for v in report["step_seconds"]["cpu"].values())
    assert "cpu" in report["engine_step_seconds"] and report["machine"]["usable_cores"] >= 1
    html = page.read_text()
    assert "Seconds per federated round" in html and "cifar_cnn" in html


def test_help_lists_the_options(capsys):
    try:
        cli.main(["bench", "--help"])
    except SystemExit:
        pass
    text = capsys.readouterr().out
    for option in ("--settings", "--device", "--rounds", "--repeats", "--quick", "--out"):
        assert option in text


def _small(name: str):
    setting = bench.SETTINGS[name].quick()
    images, labels, _ = bench.load_train(setting.dataset, None, quick=True)
    parts = bench.make_parts(setting, labels, quick=True)
    return setting, images, labels, parts


def test_floor_does_the_engines_steps_with_the_engines_batch_sizes(tmp_path):
    setting, images, labels, parts = _small("fmnist_mlp")
    parts = [p[: 50 + 7 * i] for i, p in enumerate(parts)]  # unequal, with partial last batches
    module = bench.build_module(setting)
    trainer = engine.Trainer(bench.engine_setting(setting, "cpu"), tmp_path, None, None,
                             datasets=(data.TensorDataset(images, labels, 0.0, 1.0),) * 2, parts=parts,
                             module=copy.deepcopy(module))
    floor = bench.ComputeFloor(module, images, labels, setting, parts, torch.device("cpu"), seed=1)
    for t in (1, 2):
        cohort = engine.sample_cohort(1, t, setting.num_clients, setting.per_round)
        updates = trainer.local_training(t, cohort, trainer.model.flat.clone(), 0.01)
        assert floor.round(t) == int(updates.steps.sum()) == len(floor.batch_sizes(t))
        sizes = floor.batch_sizes(t)
        assert sum(sizes) == setting.epochs * sum(len(parts[c]) for c in cohort)


def test_reference_loop_is_fedavg_over_the_same_cohort():
    """One reference round with lr 0 leaves the model unchanged (state_dict averaging is a mean)."""
    setting, images, labels, parts = _small("cifar_cnn")
    zero_lr = bench.BenchSetting(**{**setting.__dict__, "lr": 0.0})
    module = bench.build_module(setting)
    loop = bench.ReferenceLoop(module, bench.ImageArray(images, labels), parts, zero_lr, torch.device("cpu"), 1)
    before = copy.deepcopy(loop.model.state_dict())
    loop.round(1)
    for key, value in loop.model.state_dict().items():
        torch.testing.assert_close(value, before[key])


def test_image_array_matches_the_engines_scaling():
    """The reference dataset yields what the engine's uint8 batch gathers yield: pixels / 255, CHW."""
    _, images, labels, _ = _small("cifar_cnn")
    dataset = bench.ImageArray(images[:3], labels[:3])
    x, y = dataset[2]
    engine_x, engine_y = data.TensorDataset(images, labels, 0.0, 1.0).batch(torch.tensor([2]))
    torch.testing.assert_close(x, engine_x[0])
    assert y == int(engine_y[0])


def test_engine_setting_is_a_valid_run_setting():
    setting = bench.engine_setting(bench.SETTINGS["fmnist_cnn"], "cpu")
    assert setting["participation"] * setting["num_clients"] == 10
    assert setting["local_epochs"] == 5 and setting["batch_size"] == 50


@pytest.mark.slow
def test_throughput_side_by_side_and_table1_extrapolation(tmp_path, capsys):
    """Several runs per device at CI size on the CPU: the mechanism the GPU measurement uses."""
    out = tmp_path / "bench.json"
    cli.main(["bench", "--quick", "--rounds", "1", "--device", "cpu", "--settings", "fmnist_cnn",
              "--data-root", str(tmp_path / "absent"), "--throughput", "2", "--out", str(out)])
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    (t,) = report["throughput"]
    assert t["setting"] == "fmnist_cnn" and [r["runs_side_by_side"] for r in t["rows"]] == [1, 2]
    for r in t["rows"]:
        assert r["runs_per_device_hour"] == r["runs_side_by_side"] * 3600 / (300 * r["seconds_per_round"])
    assert t["rows"][0]["device_hours_per_run_vs_one"] == 1.0
    assert t["runs_per_device"] in (1, 2)
    e = report["ima_table1_fmnist"]["cpu"]
    row = next(r for r in t["rows"] if r["runs_side_by_side"] == t["runs_per_device"])
    # 96 runs in ceil(96 / R) waves of 300 rounds
    assert e["runs"] == 96 and e["waves"] == -(-96 // t["runs_per_device"])
    assert e["wall_seconds"] == e["waves"] * 300 * row["seconds_per_round"]
    assert "runs per device-hour" in printed and "IMA Table 1 FMNIST rows (96 runs x 300 rounds)" in printed


def test_extrapolation_picks_the_chosen_concurrency():
    tput = {"timed_rounds": 5, "runs_per_device": 4, "rows": [
        {"runs_side_by_side": 1, "seconds_per_round": 0.1}, {"runs_side_by_side": 4, "seconds_per_round": 0.2}]}
    e = bench.extrapolate_table(tput, 96, 300)
    assert e["waves"] == 24 and abs(e["wall_seconds"] - 24 * 300 * 0.2) < 1e-9
