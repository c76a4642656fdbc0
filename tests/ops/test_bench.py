"""`fedrepro bench` at CI size: it runs, writes what `fedrepro plan` reads, and its three loops do
the same amount of work. (No timing assertions: speed goals live in the benchmark, not in tests.)"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from fedrepro import cli, data
from fedrepro.ops import bench, bench_baselines, bench_settings
from fedrepro.run.cohorts import sample_cohort
from fedrepro.run.trainer import Trainer

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats


def _high_water_mib() -> float:
    """This process's peak resident memory from /proc (VmHWM, in kB), another reading than the bench's."""
    line = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024.0


def test_quick_bench_writes_json_table_and_page(tmp_path, capsys):
    out, page = tmp_path / "bench.json", tmp_path / "bench.html"
    high_water_before = _high_water_mib()
    cli.main(
        [
            "bench",
            "--quick",
            "--rounds",
            "1",
            "--device",
            "cpu",
            "--settings",
            "fmnist_mlp",
            "cifar_cnn",
            "--data-root",
            str(tmp_path / "absent"),
            "--out",
            str(out),
            "--html",
            str(page),
        ]
    )
    printed = capsys.readouterr().out
    assert "(b)/(a)" in printed and "Machine:" in printed
    report = json.loads(out.read_text())
    assert [r["setting"] for r in report["results"]] == ["fmnist_mlp", "cifar_cnn"]
    for r in report["results"]:
        seconds = r["seconds_per_round"]
        assert all(seconds[k] > 0 for k in ("engine", "reference", "floor"))
        assert r["ratios"]["reference_over_engine"] == seconds["reference"] / seconds["engine"]
        assert r["ratios"]["engine_over_floor"] == seconds["engine"] / seconds["floor"]
        # the loops share one process, so the readings are its high-water mark after each loop's first
        # round (not a split by method, as the page says): within what /proc reports before and after, in MiB
        readings = [r["memory"][k]["peak_rss_mb"] for k in ("before", "engine", "floor", "reference")]
        assert high_water_before - 1 <= readings[0] and readings[-1] <= _high_water_mib() + 1, readings
        assert r["data"] == "generated"
    # the per-step costs, keyed by device and <dataset>/<model>:<batch size>
    assert set(report["step_seconds"]["cpu"]) == {"fmnist/mlp:64", "cifar10/cnn:64"}
    assert all(v > 0 for v in report["step_seconds"]["cpu"].values())
    assert "cpu" in report["engine_step_seconds"] and report["machine"]["usable_cores"] >= 1
    html = page.read_text()
    assert "Seconds per federated round" in html and "cifar_cnn" in html
    assert "host memory is not split by method" in printed


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["bench", "--help"])
    assert done.value.code in (0, None), f"--help exited with {done.value.code}"
    text = capsys.readouterr().out
    for option in ("--settings", "--device", "--rounds", "--repeats", "--quick", "--out"):
        assert option in text


def _small(name: str):
    setting = bench_settings.SETTINGS[name].quick()
    images, labels, _ = bench.load_train(setting.dataset, None, quick=True)
    parts = bench.make_parts(setting, labels, quick=True)
    return setting, images, labels, parts


def test_floor_does_the_engines_steps_with_the_engines_batch_sizes(tmp_path):
    setting, images, labels, parts = _small("fmnist_mlp")
    parts = [p[: 50 + 7 * i] for i, p in enumerate(parts)]  # unequal, with partial last batches
    module = bench.build_module(setting)
    trainer = Trainer(
        bench.engine_setting(setting, "cpu"),
        tmp_path,
        None,
        None,
        datasets=(data.TensorDataset(images, labels, 0.0, 1.0),) * 2,
        parts=parts,
        module=copy.deepcopy(module),
    )
    floor = bench_baselines.ComputeFloor(module, images, labels, setting, parts, torch.device("cpu"), seed=1)
    for t in (1, 2):
        cohort = sample_cohort(1, t, setting.num_clients, setting.per_round)
        updates = trainer.train_cohort(trainer.plan(t, cohort, trainer.model.flat.clone(), 0.01))
        assert floor.round(t) == int(updates.steps.sum()) == len(floor.batch_sizes(t))
        sizes = floor.batch_sizes(t)
        assert sum(sizes) == setting.epochs * sum(len(parts[c]) for c in cohort)


def test_reference_loop_is_fedavg_over_the_same_cohort():
    """One reference round with one full-batch step per client (batch size >= every client's data, one
    epoch: the DataLoader's shuffle changes nothing but float summation order) equals FedAvg written
    out here: each client of the engine's cohort takes x - lr * grad of its mean loss, and the server
    takes the data-size weighted mean. A wrong cohort, weight or step moves the result by ~lr * |grad|."""
    setting, images, labels, parts = _small("cifar_cnn")
    parts = [p[: 20 + 9 * i] for i, p in enumerate(parts)]  # unequal sizes, so the weights matter
    one_step = bench_settings.BenchSetting(
        **{**setting.__dict__, "lr": 0.5, "epochs": 1, "batch_size": max(len(p) for p in parts)}
    )
    module = bench.build_module(setting)
    dataset = bench_baselines.ImageArray(images, labels)
    loop = bench_baselines.ReferenceLoop(module, dataset, parts, one_step, torch.device("cpu"), 1)
    start = copy.deepcopy(loop.model)
    loop.round(1)
    cohort = sample_cohort(1, 1, setting.num_clients, setting.per_round)
    sizes = torch.tensor([len(parts[c]) for c in cohort], dtype=torch.float64)
    expected = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in start.state_dict().items()}
    widest, largest = [0], 0.0  # the longest gradient sum, the largest gradient entry (for the bound below)
    hooks = [
        m.register_forward_hook(lambda m, i, o: widest.append(o[0].numel()))
        for m in start.modules()
        if not list(m.children())
    ]
    for c, weight in zip(cohort, sizes / sizes.sum()):
        client = copy.deepcopy(start)
        x, y = data.TensorDataset(images, labels, 0.0, 1.0).batch(torch.as_tensor(parts[c]))
        client.zero_grad()
        torch.nn.functional.cross_entropy(client(x), y).backward()
        widest.append(x[0].numel())  # the input layer sums over its inputs too
        largest = max(largest, max(float(p.grad.abs().max()) for p in client.parameters()))
        with torch.no_grad():
            for p in client.parameters():
                p -= one_step.lr * p.grad
        for k, v in client.state_dict().items():
            expected[k] += weight * v.double()
    for h in hooks:
        h.remove()
    # float32, one step: a gradient entry is a sum of at most R = batch * widest activation terms, summed in
    # another order by the loop (as tests/conftest.py's rounding_bound: sqrt(R) u32 of the largest gradient,
    # twice for the feedback), times lr; the weighted mean adds one rounding per client of the largest weight
    r = max(len(p) for p in parts) * max(widest)
    u32 = 2.0**-24
    largest_weight = max(float(v.abs().max()) for v in start.state_dict().values() if v.is_floating_point())
    bound = 2 * one_step.lr * math.sqrt(r) * 2 * u32 * largest + (len(cohort) + 1) * u32 * (
        largest_weight + one_step.lr * largest
    )
    moved = 0.0
    for key, value in loop.model.state_dict().items():
        torch.testing.assert_close(value.double(), expected[key], rtol=0, atol=bound)
        moved = max(moved, float((value - start.state_dict()[key]).abs().max()))
    assert moved > 100 * bound, "the round did not move the model beyond rounding: the comparison would be vacuous"


def test_image_array_matches_the_engines_scaling():
    """The reference dataset yields what the engine's uint8 batch gathers yield: pixels / 255, CHW."""
    _, images, labels, _ = _small("cifar_cnn")
    dataset = bench_baselines.ImageArray(images[:3], labels[:3])
    x, y = dataset[2]
    engine_x, engine_y = data.TensorDataset(images, labels, 0.0, 1.0).batch(torch.tensor([2]))
    # one float32 division of the same byte on each side (the engine's normalisation by 0 and 1 is exact)
    torch.testing.assert_close(x, engine_x[0], rtol=0, atol=2 * 2.0**-24)
    assert y == int(engine_y[0])


def test_engine_setting_is_a_valid_run_setting():
    setting = bench.engine_setting(bench_settings.SETTINGS["fmnist_cnn"], "cpu")
    assert setting["participation"] * setting["num_clients"] == 10
    assert setting["local_epochs"] == 5 and setting["batch_size"] == 50


@pytest.mark.slow
def test_throughput_side_by_side_and_table1_extrapolation(tmp_path, capsys):
    """Several runs per device at CI size on the CPU: the mechanism the GPU measurement uses."""
    out = tmp_path / "bench.json"
    cli.main(
        [
            "bench",
            "--quick",
            "--rounds",
            "1",
            "--device",
            "cpu",
            "--settings",
            "fmnist_cnn",
            "--data-root",
            str(tmp_path / "absent"),
            "--throughput",
            "2",
            "--out",
            str(out),
        ]
    )
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
    tput = {
        "timed_rounds": 5,
        "runs_per_device": 4,
        "rows": [
            {"runs_side_by_side": 1, "seconds_per_round": 0.1},
            {"runs_side_by_side": 4, "seconds_per_round": 0.2},
        ],
    }
    e = bench.extrapolate_table(tput, 96, 300)
    assert e["waves"] == 24 and abs(e["wall_seconds"] - 24 * 300 * 0.2) < 1e-9
