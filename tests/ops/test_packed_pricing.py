"""The batched and packed path priced from measured packed steps (ops/packed_pricing.py, ops/packed_bench.py):
hand-written records give hand-computed hours and pack sizes; without a record the plan prices sequentially and
says which measurement is missing; the measurement itself runs on a CPU and writes a record the plan reads.
No timing is asserted (speed goals live in docs/benchmark.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedrepro import cli
from fedrepro.configure import schema, settings
from fedrepro.ops import packed_bench, packed_pricing, plan

MiB = 2**20
KEY = "fmnist/cnn:50"


def _record(points, total=None, clients=10, **extra) -> dict:
    """A record of KEY on cuda: points as (runs, seconds per step, peak MiB or None)."""
    return {
        "device": "cuda",
        "machine": {"gpu": "a test GPU"},
        "measured_at": "2026-11-28T00:00:00+00:00",
        "total_memory_bytes": total,
        "packed_steps": {
            KEY: {
                "clients": clients,
                "points": [
                    {
                        "runs": r,
                        "stacked": r * clients,
                        "seconds_per_step": s,
                        "peak_bytes": None if m is None else int(m * MiB),
                    }
                    for r, s, m in points
                ],
                **extra,
            }
        },
    }


def _curve(record) -> packed_pricing.PackedCurve:
    return packed_pricing.curves_of(record, "test")[KEY]


# runs per device-hour go as stacked / seconds: 10/0.01 = 1000, 40/0.02 = 2000 (+100%), 160/0.06 = 2667 (+33%),
# 640/0.24 = 2667 (+0%): the knee is 160 stacked models, 16 runs of 10 clients
KNEE_AT_16 = [
    (1, 0.01, 1024 + 5 * 10),
    (4, 0.02, 1024 + 5 * 40),
    (16, 0.06, 1024 + 5 * 160),
    (64, 0.24, 1024 + 5 * 640),
]
# peak = 1024 MiB + 5 MiB a stacked model; 140 GiB leave room for about 22,000
BIG = 140 * 1024 * MiB


def _params(rounds=300, seeds=(1, 2, 3, 4), participation=0.1, batch_size=50) -> dict:
    return schema.validate(
        {
            "experiments": {
                "t1": {
                    "base": {
                        "dataset": "fmnist",
                        "model": "cnn",
                        "num_clients": 100,
                        "participation": participation,
                        "rounds": rounds,
                        "local_epochs": 5,
                        "batch_size": batch_size,
                    },
                    "grid": {"seed": list(seeds)},
                }
            }
        },
        "params.schema.yaml",
        "test",
    )


def _costs(tmp_path, record) -> packed_pricing.PackedCosts:
    path = tmp_path / "packed_steps-cuda.json"
    path.write_text(json.dumps(record))
    return packed_pricing.packed_costs("cuda", [path])


def test_a_hand_written_record_prices_a_run_in_its_pack(tmp_path):
    """IMA's FMNIST CNN: 100 clients of 600 samples, 10 a round, E = 5, B = 50: 5 x 12 = 60 steps a client a round.
    In packs of 16 runs (the knee) a packed step costs 0.06 s, so a run's 300 rounds cost 300 x 60 x 0.06 / 16
    = 67.5 s, and four runs 270 s."""
    result = plan.plan(_params(), None, tmp_path, "cuda", packed=_costs(tmp_path, _record(KNEE_AT_16, BIG)))
    assert result["total"]["seconds"] == pytest.approx(4 * 67.5, rel=1e-12)
    assert result["experiments"]["t1"]["priced_by"] == ["packed steps (packed_steps-cuda.json)"]
    name = f"{KEY}, 10 clients a round"
    assert result["packing"][name]["runs"] == 16 and result["packing"][name]["bound"] == "knee"
    assert result["packed_runs"] == {name: 4} and result["packed_missing"] is None
    text = plan.format_plan(result)
    assert (
        f"{name}: 16 runs a pack on one GPU (160 stacked models, bound by knee); its 4 runs: pack: {{packs: 1}}" in text
    )
    assert "knee at 160 stacked models: 640 add +0% runs per device-hour (at most 10%)" in text


def test_other_cohorts_take_the_knee_in_stacked_models_and_interpolate(tmp_path):
    """5 clients a round: 160 // 5 = 32 runs, a step of 160 models (0.06 s); 20 clients of 300 samples: 8 runs.
    Between measured sizes seconds are linear, below the smallest they are its, above the largest proportional."""
    curve = _curve(_record(KNEE_AT_16, BIG))
    assert packed_pricing.pack_size(curve, 5).runs == 32 and packed_pricing.pack_size(curve, 20).runs == 8
    assert curve.step_seconds(100) == pytest.approx(0.02 + 0.04 * 60 / 120, rel=1e-12)
    assert curve.step_seconds(5) == 0.01 and curve.step_seconds(1280) == pytest.approx(0.48, rel=1e-12)
    # 5 clients of 600 samples: 60 steps a round, 300 rounds, 0.06 s a step shared by 32 runs
    setting = settings.resolve(
        {"dataset": "fmnist", "model": "cnn", "num_clients": 100, "participation": 0.05, "rounds": 300}
        | {"local_epochs": 5, "batch_size": 50}
    )
    assert packed_pricing.run_seconds(setting, curve) == pytest.approx(300 * 60 * 0.06 / 32, rel=1e-12)
    # a child forked at round 225 trains 75 rounds of them
    assert packed_pricing.run_seconds(setting, curve, 225) == pytest.approx(75 * 60 * 0.06 / 32, rel=1e-12)


# (room - fixed) / per model = (0.8 x total - 1024 MiB) / 5 MiB stacked models fit
def _total_fitting(stacked: float) -> int:
    return int((1024 + 5 * stacked) * MiB / 0.8)


@pytest.mark.parametrize(
    ("points", "total", "clients", "runs", "bound"),
    [
        # the knee at 16 runs, memory for about 22,000 models: the knee bounds
        (KNEE_AT_16, BIG, 10, 16, "knee"),
        # memory for 100.5 models (10 runs) before the knee (the largest measured, 16 runs): memory bounds
        (KNEE_AT_16[:3], _total_fitting(100.5), 10, 10, "memory"),
        # memory for 165.5 models: 16 runs, as the knee: both bound
        (KNEE_AT_16, _total_fitting(165.5), 10, 16, "knee and memory"),
        # one pack size measured (4 runs, no memory on a CPU): it is the knee; 8 clients a round take 40 // 8 runs
        ([(4, 0.02, None)], None, 10, 4, "knee"),
        ([(4, 0.02, None)], None, 8, 5, "knee"),
        # a cohort larger than the knee: one run a pack, never 0
        ([(4, 0.02, None)], None, 50, 1, "knee"),
        # memory fitting fewer models than one run's clients: still one run (its round is chunked)
        (KNEE_AT_16, _total_fitting(4.5), 10, 1, "memory"),
    ],
)
def test_the_knee_and_memory_rules_pick_the_pack_size(points, total, clients, runs, bound):
    choice = packed_pricing.pack_size(_curve(_record(points, total)), clients)
    assert (choice.runs, choice.bound) == (runs, bound)
    assert choice.stacked == runs * clients


def test_memory_is_fitted_through_the_smallest_and_largest_points_and_one_point_has_no_fixed_part():
    limit, why = packed_pricing.memory_limit(_curve(_record(KNEE_AT_16, _total_fitting(100.5))))
    assert limit == 100 and "5.00 MiB per stacked model + 1024 MiB fit 100 in 80% of" in why
    # one point of 40 models at 400 MiB: 10 MiB each, no fixed part; 80% of 1000 MiB fit 80
    limit, why = packed_pricing.memory_limit(_curve(_record([(4, 0.02, 400)], 1000 * MiB)))
    assert limit == 80 and "10.00 MiB per stacked model + 0 MiB fit 80" in why
    assert packed_pricing.memory_limit(_curve(_record([(4, 0.02, None)])))[0] is None


def test_a_pack_size_that_ran_out_of_memory_caps_the_pack_and_a_dropout_model_packs_one_run():
    oom = _curve(_record(KNEE_AT_16[:2], BIG, out_of_memory_at=160))
    choice = packed_pricing.pack_size(oom, 10)
    # the knee is the largest measured (40 stacked: +100% from 10), so 4 runs; memory allows 159 models, 15 runs
    assert (choice.runs, choice.bound) == (4, "knee")
    limit, why = packed_pricing.memory_limit(oom)
    assert limit == 159 and "160 ran out of memory, so at most 159" in why
    alone = packed_pricing.pack_size(_curve(_record(KNEE_AT_16[:1], BIG, alone="dropout: ...")), 10)
    assert (alone.runs, alone.bound) == (1, "one run per step (dropout)")


def test_a_flat_first_step_puts_the_knee_at_the_smallest_pack():
    # 10/0.01 = 1000, 40/0.042 = 952: no growth, so one run a pack
    knee, why = packed_pricing.knee(_curve(_record([(1, 0.01, None), (4, 0.042, None)])))
    assert knee == 10 and "40 add -5% runs per device-hour" in why


def test_without_a_record_the_plan_prices_sequentially_and_names_the_missing_measurement(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no results/bench, no evidence/gpu
    costs = packed_pricing.packed_costs("cuda")
    assert costs.looked_in == ("results/bench/packed_steps-cuda.json", "evidence/gpu/packed_steps-*.json")
    result = plan.plan(_params(), None, tmp_path, "cuda")
    assert result["packing"] == {} and result["experiments"]["t1"]["priced_by"] == ["guess (rough table)"]
    line = result["packed_missing"]
    assert line == (
        "no packed step costs on cuda (results/bench/packed_steps-cuda.json or evidence/gpu/packed_steps-*.json): "
        "priced on the sequential path (one client at a time); `fedrepro plan --configfile <params file> "
        "--measure-packed --device cuda` measures them (scripts/gpu_check.sh on a GPU node)"
    )
    text = plan.format_plan(result)
    assert text.count("no packed step costs") == 1 and "packed path" not in text


def test_a_record_of_another_setting_or_device_prices_nothing_packed_and_says_which(tmp_path):
    record = _record(KNEE_AT_16, BIG)
    sequential = plan.plan(
        _params(batch_size=64), None, tmp_path, "cuda", packed=packed_pricing.PackedCosts("cuda", {}, "", ())
    )
    result = plan.plan(_params(batch_size=64), None, tmp_path, "cuda", packed=_costs(tmp_path, record))
    assert result["total"] == sequential["total"], "a record of batch 50 priced batch 64"
    assert result["packed_missing"].startswith(
        f"no packed step costs on cuda for fmnist/cnn:64 in {tmp_path / 'packed_steps-cuda.json'}: priced on the "
        "sequential path"
    )
    path = tmp_path / "packed_steps-cuda.json"
    assert packed_pricing.packed_costs("cpu", [path]).curves == {}, "a GPU record priced a CPU plan"


def test_the_newest_kept_gpu_record_is_read_after_the_checkouts_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kept = tmp_path / "evidence" / "gpu"
    kept.mkdir(parents=True)
    old, new = _record(KNEE_AT_16[:1], BIG), _record(KNEE_AT_16, BIG)
    old["measured_at"], new["measured_at"] = "2026-11-01T00:00:00+00:00", "2026-11-28T00:00:00+00:00"
    (kept / "packed_steps-aaa.json").write_text(json.dumps(old))  # first by name, older
    (kept / "packed_steps-zzz.json").write_text(json.dumps(new))
    assert packed_pricing.packed_costs("cuda").source.startswith(
        "evidence/gpu/packed_steps-zzz.json (measured on a test GPU"
    )
    own = tmp_path / packed_pricing.OWN_FILE.format(device="cuda")
    own.parent.mkdir(parents=True)
    own.write_text(json.dumps(old))
    assert packed_pricing.packed_costs("cuda").source.startswith(str(Path("results/bench/packed_steps-cuda.json")))


# --------------------------------------------------------------------------- the measurement, on a CPU


def _tiny(**extra) -> dict:
    return settings.resolve(
        {"dataset": "fmnist", "model": "mlp", "num_clients": 4, "participation": 0.5, "batch_size": 8, "rounds": 2}
        | extra
    )


def test_the_packed_step_is_measured_on_a_cpu_into_a_well_formed_record(tmp_path):
    out = tmp_path / "packed_steps-cpu.json"
    text = {"dataset": "agnews", "model": "pythia70m", "num_clients": 4, "participation": 0.5, "batch_size": 8}
    record = packed_bench.measure([_tiny(), _tiny(), text], "cpu", out, runs=(1, 2), steps=2, log=lambda line: None)
    assert json.loads(out.read_text()) == record
    assert record["device"] == "cpu" and record["total_memory_bytes"] is None
    assert record["memory"] == "not measured on cpu (torch reports no peak memory there)"
    assert {"cpu", "torch", "usable_cores"} <= set(record["machine"]) and record["measured_at"]
    assert record["max_together"] == packed_bench.PACK_MAX_TOGETHER
    assert list(record["packed_steps"]) == ["fmnist/mlp:8"]
    assert record["skipped"] == {"agnews/pythia70m:8": "a text model: its runs train one client at a time"}
    entry = record["packed_steps"]["fmnist/mlp:8"]
    assert entry["clients"] == 2 and [(p["runs"], p["stacked"]) for p in entry["points"]] == [(1, 2), (2, 4)]
    assert all(p["seconds_per_step"] > 0 and p["peak_bytes"] is None for p in entry["points"])
    assert all(p["peak_bytes_per_model"] is None for p in entry["points"]), "a CPU reports no peak memory"
    costs = packed_pricing.packed_costs("cpu", [out])
    choice = packed_pricing.pack_size(costs.curve(_tiny()), 2)
    assert choice.runs in (1, 2) and "memory not measured on this device" in choice.why


def test_the_measurement_stops_at_its_budget_and_names_what_it_left(tmp_path):
    record = packed_bench.measure(
        [_tiny()], "cpu", tmp_path / "p.json", runs=(1,), steps=1, budget=0, log=lambda line: None
    )
    assert record["packed_steps"] == {}
    assert record["skipped"] == {"fmnist/mlp:8": "not measured: the budget of 0 s was spent"}


def test_the_gpu_checks_measurement_reads_the_params_files_there_are(tmp_path):
    """scripts/gpu_check.sh measures the papers' settings (gpucheck.PAPER_PARAMS) in by_compute's order; here a
    one-setting file and an absent one, on the CPU."""
    config = tmp_path / "p.yaml"
    base = {"dataset": "fmnist", "model": "mlp", "num_clients": 4, "participation": 0.5, "batch_size": 8}
    config.write_text(yaml.safe_dump({"experiments": {"e": {"base": base, "grid": {"seed": [1, 2]}}}}))
    out = tmp_path / "packed.json"
    record = packed_bench.measure_params(
        [str(config), str(tmp_path / "absent.yaml")], "cpu", out, 60, lambda line: None
    )
    assert list(record["packed_steps"]) == ["fmnist/mlp:8"] and json.loads(out.read_text()) == record


def test_cli_plan_measures_the_packed_step_and_prices_with_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "p.yaml"
    base = {"dataset": "fmnist", "model": "mlp", "num_clients": 4, "participation": 0.5, "batch_size": 8, "rounds": 2}
    config.write_text(yaml.safe_dump({"experiments": {"a": {"base": base, "grid": {"seed": [1, 2]}}}}))
    cli.main(["plan", "--configfile", str(config), "--measure-packed", "--device", "cpu", "--runs-dir", "none"])
    out = capsys.readouterr().out
    assert (tmp_path / "results/bench/packed_steps-cpu.json").is_file()
    assert "priced by: packed steps (packed_steps-cpu.json)" in out
    assert "fmnist/mlp:8, 2 clients a round:" in out and "no packed step costs" not in out


def test_the_benchmark_measures_the_packed_step_of_its_settings(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cli.main(["bench", "--settings", "fmnist_mlp", "--device", "cpu", "--quick", "--rounds", "1", "--packed"])
    record = json.loads((tmp_path / packed_pricing.OWN_FILE.format(device="cpu")).read_text())
    # the quick FedLAW MLP setting: 4 clients, all of them each round, batch 64
    entry = record["packed_steps"]["fmnist/mlp:64"]
    assert entry["clients"] == 4 and [p["runs"] for p in entry["points"]] == list(packed_bench.RUNS["cpu"])


def test_measuring_on_cuda_without_one_is_refused_in_one_line_before_any_work(tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "p.yaml"
    base = {"dataset": "fmnist", "model": "mlp", "num_clients": 4, "participation": 0.5, "batch_size": 8}
    config.write_text(yaml.safe_dump({"experiments": {"e": {"base": base}}}))
    with pytest.raises(SystemExit, match="--device cuda was asked for, but torch sees no CUDA device"):
        cli.main(["plan", "--configfile", str(config), "--measure-packed", "--device", "cuda"])
    assert not (tmp_path / "results").exists()


def test_ima_table1_fmnist_is_measured_first_then_the_most_compute(tmp_path, monkeypatch):
    """A measurement cut short by its budget keeps what weighs most: FIRST, then by sequential compute. Priced
    by a hand-written step-cost table: 2 runs of MLP at 1 s a step outweigh 3 of the LeNet at 0.001 s."""
    from types import SimpleNamespace

    from fedrepro.ops import pricing

    monkeypatch.chdir(tmp_path)
    table = tmp_path / pricing.STEP_COSTS_FILE
    table.parent.mkdir(parents=True)
    table.write_text(json.dumps({"device": "cuda", "step_seconds": {"fmnist/mlp:8": 1.0, "fmnist/lenet5:8": 0.001}}))
    runs = [SimpleNamespace(setting=_tiny(model=m, seed=s)) for m, s in [("lenet5", 1), ("lenet5", 2), ("lenet5", 3)]]
    runs += [SimpleNamespace(setting=_tiny(seed=s)) for s in (1, 2)]
    runs += [SimpleNamespace(setting=_tiny(model="cnn", batch_size=50))]
    order = [pricing.step_key(s) for s in packed_bench.by_compute(runs, "cuda")]
    assert order == ["fmnist/cnn:50", "fmnist/mlp:8", "fmnist/lenet5:8"]


# --------------------------------------------------------------------------- step_graph compile (CUDA graphs)


def test_a_step_graph_run_is_priced_from_its_own_curve_when_the_record_has_one(tmp_path):
    """The record's step_graph curve at half the plain step's seconds (same knee, 16 runs): a run of step_graph
    compile costs half (300 x 60 x 0.03 / 16 = 33.75 s), a run of the plain step as before (67.5 s)."""
    record = _record(KNEE_AT_16, BIG)
    graphs = _record([(r, s / 2, m) for r, s, m in KNEE_AT_16], BIG)
    record["step_graph"] = {"mode": "compile", "packed_steps": graphs["packed_steps"], "skipped": {}}
    costs = _costs(tmp_path, record)
    compiled = schema.validate(_params(), "params.schema.yaml", "test")
    compiled["experiments"]["t1"]["base"]["step_graph"] = "compile"
    result = plan.plan(compiled, None, tmp_path, "cuda", packed=costs)
    assert result["total"]["seconds"] == pytest.approx(4 * 33.75, rel=1e-12)
    assert list(result["packing"]) == [f"{KEY}, 10 clients a round, step_graph compile"]
    plain = plan.plan(_params(), None, tmp_path, "cuda", packed=costs)
    assert plain["total"]["seconds"] == pytest.approx(4 * 67.5, rel=1e-12)
    # a record without a step_graph curve prices a compile run from the plain step's
    fallback = plan.plan(compiled, None, tmp_path, "cuda", packed=_costs(tmp_path, _record(KNEE_AT_16, BIG)))
    assert fallback["total"]["seconds"] == pytest.approx(4 * 67.5, rel=1e-12)


def test_on_a_cpu_the_step_graph_is_not_measured_and_the_record_says_why(tmp_path):
    lines = []
    record = packed_bench.measure([_tiny()], "cpu", tmp_path / "p.json", runs=(1,), steps=1, log=lines.append)
    graphs = record["step_graph"]
    assert graphs["mode"] == "compile" and "packed_steps" not in graphs
    assert graphs["not_measured"].startswith("on cpu: step_graph compile is measured on CUDA only")
    assert any(line.startswith("packed step_graph=compile: not measured on cpu") for line in lines)
    assert packed_pricing.packed_costs("cpu", [tmp_path / "p.json"]).graph_curves == {}


def test_the_static_step_is_measured_by_the_same_curve(tmp_path):
    """The curve code the GPU runs for step_graph compile, here with the uncompiled static step (same shapes):
    its warm-up timed apart; a deadline already past measures nothing and says so."""
    lines = []
    entry = packed_bench.measure_curve(_tiny(), "cpu", (1, 2), 1, log=lines.append, step_graph="static")
    assert [p["stacked"] for p in entry["points"]] == [2, 4]
    assert all(p["seconds_per_step"] > 0 and p["warmup_seconds"] > 0 for p in entry["points"])
    assert lines[0].startswith("packed step_graph=static fmnist/mlp:8 on cpu: 1 runs x 2 clients")
    late = packed_bench.measure_curve(_tiny(), "cpu", (1,), 1, log=lines.append, step_graph="static", deadline=0)
    assert late["points"] == [] and late["not_measured"] == "1 runs and more: the budget was spent"
