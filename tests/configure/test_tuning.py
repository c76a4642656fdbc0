"""The tuning stage (fedrepro.configure.tuning): choosing, tune blocks and their errors, the validation split, the
expansion into tuning runs and final runs, the plan's count, and the stage end to end through Snakemake."""

from __future__ import annotations

import copy
import json
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import (
    DEBIAN_FMNIST,
    ROOT,
    TUNE_PROX as PROX,
    TUNING_BASE as BASE,
    job_counts,
    make_partition,
    snakemake_cmd,
    subprocess_env,
    write_yaml,
)
from fedrepro.configure import expansion, paramsfile, schema, settings, tuning
from fedrepro.evaluation import validation_split


def params(tune=PROX, grid=None, base=BASE) -> dict:
    exp = {"base": copy.deepcopy(base), "grid": grid or {"algorithm": ["fedavg", "fedprox"], "seed": [1, 2]}}
    if tune is not None:
        exp["tune"] = copy.deepcopy(tune if isinstance(tune, list) else [tune])
    return schema.validate({"experiments": {"e": exp}}, "params.schema.yaml", "test.yaml")


def expand(p: dict):
    tunings: dict = {}
    return expansion.expand(p, tunings), tunings


# --------------------------------------------------------------------------- choosing


def summaries(**runs) -> dict:
    """run id -> a summary with final_acc (None: diverged, NaN) scored on the validation split."""
    return {
        rid: {
            "status": "finished" if acc is not None else "diverged",
            "final_acc": float("nan") if acc is None else acc,
            "final_loss": 1 - (acc or 0),
            "scored_on": "validation",
        }
        for rid, acc in runs.items()
    }


def selection(*candidates, criterion="mean_final_val_acc") -> dict:
    return {
        "criterion": criterion,
        "candidates": [{"point": {"x": i}, "label": f"x={i}", "runs": runs} for i, runs in enumerate(candidates)],
    }


def test_the_best_mean_over_the_tuning_seeds_wins_not_the_best_single_run():
    sel = selection(["a1", "a2"], ["b1", "b2"])
    choice = tuning.choose(sel, summaries(a1=0.5, a2=0.9, b1=0.72, b2=0.71))  # means 0.70 and 0.715
    assert choice["chosen"] == {"x": 1} and choice["chosen_index"] == 1
    assert choice["candidates"][0]["value"] == pytest.approx(0.7)


def test_a_tie_goes_to_the_candidate_listed_first_whatever_the_order():
    for order in (["a", "b"], ["b", "a"]):
        choice = tuning.choose(selection([order[0]], [order[1]]), summaries(a=0.5, b=0.5))
        assert choice["chosen_index"] == 0


def test_a_diverged_candidate_loses_even_when_its_other_seeds_score_higher():
    # c's first seed is the best single number, its second diverged: c loses to the finished, lower a
    sel = selection(["a1", "a2"], ["c1", "c2"])
    choice = tuning.choose(sel, summaries(a1=0.3, a2=0.3, c1=0.9, c2=None))
    assert choice["chosen"] == {"x": 0}
    assert choice["candidates"][1]["value"] is None and choice["candidates"][1]["values"] == [0.9, None]
    json.dumps(choice, allow_nan=False)  # the record is strict JSON


def test_every_candidate_diverged_is_an_error_naming_them():
    with pytest.raises(tuning.TuningError, match="every candidate diverged.*x=0.*x=1"):
        tuning.choose(selection(["a"], ["b"]), summaries(a=None, b=None))


def test_a_run_scored_on_the_test_set_cannot_choose():
    runs = summaries(a=0.5, b=0.4)
    runs["b"]["scored_on"] = "test"
    with pytest.raises(tuning.TuningError, match="b was scored on the test set"):
        tuning.choose(selection(["a"], ["b"]), runs)


def test_a_loss_criterion_picks_the_lowest():
    choice = tuning.choose(selection(["a"], ["b"], criterion="mean_final_val_loss"), summaries(a=0.5, b=0.6))
    assert choice["chosen"] == {"x": 1}  # loss 0.4 < 0.5


# --------------------------------------------------------------------------- tune blocks: errors


def one_error(p: dict) -> str:
    with pytest.raises(schema.ConfigError) as err:
        expand(schema.validate(p, "params.schema.yaml", "test.yaml") if "experiments" in p else p)
    text = str(err.value)
    assert len(text.splitlines()) == 1, text
    return text


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda t: t.update(seed=[1]), r"unknown setting 'experiments.e.tune.0.seed'; did you mean seeds\?"),
        (lambda t: t.pop("seeds"), r"'seeds' is a required property"),
        (
            lambda t: t.update(criterion="best_test_acc"),
            r"tune\[0\]: criterion 'best_test_acc' is unknown; known: "
            r"mean_final_val_acc",
        ),
        (
            lambda t: t.update(when={"algoritm": "fedprox"}),
            r"tune\[0\]: when: 'algoritm' is no setting; did you mean "
            r"algorithm\?",
        ),
        (lambda t: t.update(without=["imma"]), r"tune\[0\]: without: imma is no plug-in"),
        (lambda t: t.update(when={"algorithm": "fedyogi"}), r"tune\[0\]: when = .* matches no grid point"),
        (
            lambda t: t.update(grid={"fedavgm.momentum": [0.5, 0.9]}),
            r"tune\[0\]: grid: candidates .* give the same run",
        ),
        (lambda t: t.update(grid={"seed": [1, 2]}), r"tune\[0\]: grid: 'seed' is no value to tune"),
        (lambda t: t.update(validation=1.5), r"validation' = 1.5 is not allowed: must be < 1"),
        (lambda t: t.update(grid={"fedprox.mu": [0.1, 200.0]}), r"fedprox.mu \* client.lr < 1"),
    ],
)
def test_a_bad_tune_block_is_one_line_naming_the_key(change, says):
    block = copy.deepcopy(PROX)
    change(block)
    p = {
        "experiments": {
            "e": {"base": copy.deepcopy(BASE), "grid": {"algorithm": ["fedavg", "fedprox"]}, "tune": [block]}
        }
    }
    assert re.search(says, one_error(p)), one_error(p)


def test_two_blocks_tuning_one_grid_point_are_refused():
    p = params(tune=[PROX, {**PROX, "grid": {"client.lr": [0.1, 0.2]}}])
    assert "tune[0] and experiments.e.tune[1] both match" in one_error(p)


# --------------------------------------------------------------------------- the validation split


def test_the_validation_split_is_disjoint_complete_and_drawn_by_the_seed():
    parts = [np.arange(0, 50), np.arange(50, 53), np.arange(53, 54), np.arange(54, 154)]
    trained, held = validation_split(parts, 0.2, seed=3)
    for part, kept in zip(parts, trained):
        assert len(kept) == len(part) - min(int(0.2 * len(part)), len(part) - 1) and len(kept) >= 1
    assert sorted(np.concatenate([*trained, held]).tolist()) == list(range(154))  # disjoint and complete
    assert len(held) == 10 + 0 + 0 + 20
    again, held_again = validation_split(parts, 0.2, seed=3)
    assert np.array_equal(held, held_again)
    assert not np.array_equal(held, validation_split(parts, 0.2, seed=4)[1])


def test_a_tuning_run_scores_the_validation_samples_and_trains_on_the_rest(tiny_data_root, tmp_path):
    from fedrepro.run.trainer import Trainer

    partition = make_partition(tiny_data_root, tmp_path / "part", num_clients=4, kind="iid")
    setting = settings.resolve({**BASE, "evaluation": {"validation": 0.25}, "seed": 5})
    trainer = Trainer(setting, tmp_path / "run", partition, tiny_data_root)
    full = Trainer(settings.resolve({**BASE, "seed": 5}), tmp_path / "full", partition, tiny_data_root)
    trained, held = validation_split(full.inputs.parts, 0.25, 5)
    assert len(trainer.inputs.test) == len(held) == 100  # 400 samples, a quarter of each client's
    assert np.array_equal(trainer.inputs.test.labels.numpy(), full.inputs.train.labels[held].numpy())
    assert [len(i) for i in trainer.inputs.client_index] == [len(t) for t in trained]
    assert trainer.inputs.client_sizes.tolist() == [len(t) for t in trained]
    assert trainer.run(progress=False)["scored_on"] == "validation"
    assert full.run(progress=False)["scored_on"] == "test" and len(full.inputs.test) == 100


# --------------------------------------------------------------------------- expansion and identity


def test_a_tuned_grid_point_gives_its_tuning_runs_and_waits_for_the_choice():
    runs, tunings = expand(params())
    ((tid, entry),) = tunings.items()
    tuning_runs = [r for r in runs if r.tuning]
    assert {r.setting["fedprox"]["mu"] for r in tuning_runs} == {0.1, 0.01}
    assert all(r.setting["seed"] == 7 and r.setting["evaluation"]["validation"] == 0.1 for r in tuning_runs)
    own = [r for r in runs if not r.tuning]
    assert [r.setting["algorithm"] for r in own] == ["fedavg", "fedavg"]  # the fedprox runs wait
    assert [p["variant"] for p in entry["pending"]] == [{"algorithm": "fedprox"}] * 2
    manifest = expansion.manifest(params(), runs, "t", tunings)
    assert {r["id"] for r in manifest["experiments"]["e"]["runs"]} == {r.id for r in own}
    assert manifest["tunings"][tid]["selection"]["candidates"][0]["runs"] == [tuning_runs[0].id]


def test_the_chosen_value_is_in_the_final_runs_setting_and_identity():
    p = params()
    runs, tunings = expand(p)
    ((tid, entry),) = tunings.items()
    finals = {mu: tuning.final_runs(tunings, {tid: {"chosen": {"fedprox": {"mu": mu}}}}) for mu in (0.1, 0.01)}
    for mu, pairs in finals.items():
        assert [r.setting["fedprox"]["mu"] for r, _ in pairs] == [mu, mu]
        assert [r.setting["seed"] for r, _ in pairs] == [1, 2]
        assert all(r.setting["evaluation"]["validation"] == 0 for r, _ in pairs)  # scored on the test set
    assert {r.id for r, _ in finals[0.1]}.isdisjoint(r.id for r, _ in finals[0.01])
    # the untuned runs and a plain file's manifest are those of the file without the tune block
    plain = expansion.expand(params(tune=None))
    assert [r.id for r in runs if not r.tuning and r.setting["algorithm"] == "fedavg"] == [
        r.id for r in plain if r.setting["algorithm"] == "fedavg"
    ]
    assert "tunings" not in expansion.manifest(params(tune=None), plain, "t", {})
    # the tuned manifest lists them with the choice
    choice = {"chosen": {"fedprox": {"mu": 0.01}}, "chosen_label": "fedprox.mu=0.01"}
    tuned = tuning.tuned_manifest(expansion.manifest(p, runs, "t", tunings), {tid: choice})
    assert [r["tuned"]["label"] for r in tuned["experiments"]["e"]["runs"] if "tuned" in r] == ["fedprox.mu=0.01"] * 2
    assert tuned["tunings"][tid]["choice"] == choice


def test_a_changed_tune_grid_keeps_the_runs_of_the_values_it_keeps():
    runs, tunings = expand(params())
    wider = copy.deepcopy(PROX)
    wider["grid"]["fedprox.mu"].append(0.001)
    runs2, tunings2 = expand(params(tune=wider))
    assert set(tunings).isdisjoint(tunings2)  # a new choice, next to the old one
    old, new = {r.id for r in runs if r.tuning}, {r.id for r in runs2 if r.tuning}
    assert old < new and len(new - old) == 1


def test_bare_and_plugin_points_share_one_tuning_without_the_plugin():
    block = {**PROX, "without": ["ima"]}
    runs, tunings = expand(params(tune=block, grid={"algorithm": ["fedprox", "fedprox+ima"], "seed": [1]}))
    ((tid, entry),) = tunings.items()
    assert len([r for r in runs if r.tuning]) == 2 and all(r.setting["plugins"] == [] for r in runs if r.tuning)
    finals = tuning.final_runs(tunings, {tid: {"chosen": {"fedprox": {"mu": 0.1}}}})
    assert sorted(tuple(r.setting["plugins"]) for r, _ in finals) == [(), ("ima",)]
    # `plugins: []` tunes the bare method only
    runs, tunings = expand(
        params(
            tune={**PROX, "when": {"algorithm": "fedprox", "plugins": []}},
            grid={"algorithm": ["fedprox", "fedprox+ima"], "seed": [1]},
        )
    )
    assert [r.setting["plugins"] for r in runs if not r.tuning] == [["ima"]]


def test_the_plan_counts_the_tuning_runs_and_the_final_runs(tmp_path):
    from fedrepro.ops import plan

    result = plan.plan(params(), runs_dir=tmp_path / "runs")
    row = result["experiments"]["e"]
    assert (row["runs"], row["tuning"]) == (2 + 2 + 2, 2)  # fedavg x2, tuning runs x2, fedprox final x2
    assert "tuning" in plan.format_plan(result).splitlines()[0]


def test_the_papers_files_tune_where_the_papers_did():
    for name, grids in (
        ("ima", {("fedprox.mu",): [0.1, 0.01, 0.001], ("fedfa.lam",): [0.1, 0.01, 0.001]}),
        (
            "fedaware",
            {
                ("fedprox.mu",): [0.01, 0.1, 1, 10],
                ("feddyn.alpha",): [0.1, 0.01, 0.001],
                ("fedavgm.momentum",): [0.7, 0.9, 0.97, 0.997],
            },
        ),
    ):
        p = paramsfile.load_params(ROOT / "params" / f"{name}.yaml")
        blocks = [b for exp in p["experiments"].values() for b in (exp.get("tune") or [])]
        found = {tuple(b["grid"]): list(b["grid"].values())[0] for b in blocks}
        for axes, values in grids.items():
            assert found.get(axes) == values, (name, axes)
        assert "Tuned" in (ROOT / "params" / f"{name}.yaml").read_text()[:3000]


# --------------------------------------------------------------------------- end to end


def _snakemake(work: Path, params_file: Path, *args: str, fmnist=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        snakemake_cmd(work, "--configfile", str(params_file), "--cores", "2", *args),
        capture_output=True,
        text=True,
        env=subprocess_env(fmnist=fmnist),
        timeout=600,
    )


TINY_TUNE = {
    "title": "Tiny tuning check",
    "quick": True,
    "tracking": {"enabled": False},
    "data": {"root": "data", "mirrors": {"fmnist": [str(DEBIAN_FMNIST) + "/"]}},
    "experiments": {
        "tiny_tune": {
            "title": "FedAvg with a tuned client lr",
            "base": {
                "dataset": "fmnist",
                "model": "mlp",
                "num_clients": 4,
                "participation": 0.5,
                "rounds": 2,
                "batch_size": 128,
                "device": "cpu",
                "client": {"lr": 0.02},
                "partition": {"kind": "dirichlet", "alpha": 0.5, "seed": 1, "min_size": 10},
            },
            "grid": {"algorithm": ["fedavg"], "seed": [1]},
            # 1e6 diverges (as .test/config/tiny.yaml's tiny_diverge): the choice is 0.05 on any machine
            "tune": [{"when": {"algorithm": "fedavg"}, "grid": {"client.lr": [1.0e6, 0.05]}, "seeds": [7]}],
        }
    },
    # a figure of a tuned experiment draws its final runs (it waits for the checkpoint), never the tuning runs
    "figures": {"tiny_tune_accuracy": {"kind": "accuracy", "experiment": "tiny_tune"}},
}


def _summaries(work: Path) -> dict[str, tuple[dict, int]]:
    return {
        p.parent.name: (json.loads(p.read_text()), p.stat().st_mtime_ns)
        for p in (work / "results" / "runs").glob("*/summary.json")
    }


@pytest.mark.slow
def test_e2e_the_tuning_stage_chooses_and_a_wider_grid_reruns_only_what_it_adds(tmp_path, fmnist_data):
    work = tmp_path / "work"
    (work / "params").mkdir(parents=True)
    params_file = write_yaml(work / "params" / "tiny_tune.yaml", fmnist_data.params(TINY_TUNE))
    target = "reports/tiny_tune.html"
    # before anything ran, a dry run shows the tuning work; the final run follows the checkpoint
    proc = _snakemake(work, params_file, "-n", target)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = job_counts(proc.stdout + proc.stderr)
    assert (counts.get("train"), counts.get("tune"), counts.get("tuned_manifest")) == (2, 1, 1), counts

    proc = _snakemake(work, params_file, target, fmnist=fmnist_data)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    first = _summaries(work)
    assert len(first) == 3
    tuning_runs = {rid: s for rid, (s, _) in first.items() if s["scored_on"] == "validation"}
    ((final_id, (final, _)),) = [(rid, v) for rid, v in first.items() if v[0]["scored_on"] == "test"]
    assert sorted(s["setting"]["client"]["lr"] for s in tuning_runs.values()) == [0.05, 1.0e6]
    assert sorted(s["status"] for s in tuning_runs.values()) == ["diverged", "finished"]
    assert final["setting"]["client"]["lr"] == 0.05 and final["setting"]["seed"] == 1  # the choice reached it
    (choice_file,) = (work / "results" / "tuning").glob("tune-*.json")
    assert json.loads(choice_file.read_text())["chosen"] == {"client": {"lr": 0.05}}
    page = (work / target).read_text()
    assert "Tuning: fedavg: client.lr" in page and "<b>client.lr=0.05</b> (chosen)" in page
    assert "1 of 1 runs" in page  # the experiment's one run is the final run
    caption = json.loads((work / "results" / "figures" / "tiny_tune" / "tiny_tune_accuracy.json").read_text())
    assert caption["drawn"], caption["reason"]

    # a wider tuning grid: one new tuning run (it diverges too), a new choice; nothing else trains
    wider = copy.deepcopy(TINY_TUNE)
    wider["experiments"]["tiny_tune"]["tune"][0]["grid"]["client.lr"].append(2.0e6)
    write_yaml(params_file, fmnist_data.params(wider))
    proc = _snakemake(work, params_file, target, fmnist=fmnist_data)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    assert len(re.findall(r"^localrule train:|^rule train:", proc.stdout + proc.stderr, flags=re.MULTILINE)) == 1
    second = _summaries(work)
    added = set(second) - set(first)
    assert len(added) == 1 and second[added.pop()][0]["setting"]["client"]["lr"] == 2.0e6
    assert all(second[rid][1] == mtime for rid, (_, mtime) in first.items())  # left alone, the final run too
    assert len(list((work / "results" / "tuning").glob("tune-*.json"))) == 2
    assert math.isclose(
        json.loads(max((work / "results" / "tuning").glob("tune-*.json"), key=lambda p: p.stat().st_mtime).read_text())[
            "chosen"
        ]["client"]["lr"],
        0.05,
    )
    assert "client.lr=2000000.0" in (work / target).read_text()  # the report followed in the same invocation
    proc = _snakemake(work, params_file, "-n", target)
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]


@pytest.mark.slow
def test_e2e_a_tuned_ima_run_forks_from_its_tuned_host(tmp_path, fmnist_data):
    """The final runs a tuning gives are known only after its checkpoint; a tuned fedavg+ima run still starts
    from its tuned FedAvg sibling's state at t_s (fedrepro.configure.forks.WorkflowForks.current)."""
    work = tmp_path / "work"
    (work / "params").mkdir(parents=True)
    spec = copy.deepcopy(TINY_TUNE)
    exp = spec["experiments"]["tiny_tune"]
    exp["base"].update({"rounds": 4, "ima": {"window": 2, "start_round": 2}})
    exp["grid"]["algorithm"] = ["fedavg", "fedavg+ima"]
    exp["tune"][0]["without"] = ["ima"]
    params_file = write_yaml(work / "params" / "tiny_tune.yaml", fmnist_data.params(spec))
    proc = _snakemake(work, params_file, "reports/tiny_tune.html", fmnist=fmnist_data)
    (work / "snakemake.err").write_text(proc.stderr)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    finals = {
        s["setting"]["plugins"] and "ima" or "host": (rid, s)
        for rid, (s, _) in _summaries(work).items()
        if s["scored_on"] == "test"
    }
    (host_id, host), (_, child) = finals["host"], finals["ima"]
    assert host["setting"]["client"]["lr"] == child["setting"]["client"]["lr"] == 0.05  # both tuned
    assert child["forked_from"] == {"run": host_id, "round": 2}, child.get("forked_from")
    assert host.get("forked_from") is None
