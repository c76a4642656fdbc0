"""The tuning stage's parts one by one (fedrepro.configure.tuning), without training or Snakemake: the choice
(``choose``, ``select``) on summaries this file writes, its records and refusals word for word; the tune
blocks' refusals; which grid points a block matches; the tuning's name, manifest entry and runs (``stage``);
the tuned manifest, the waiting settings and the choices on disk; the run table the workflow looks runs up in.

The expected values are written from what docs/configuration.md ("Tuning, as the papers did it") and the
module's docstring say the stage does: the best mean over the tuning seeds wins, a diverged run (or a value
that is not finite) loses, an exact tie goes to the candidate listed first, a tuning run has to be finished
and scored on the validation split."""

from __future__ import annotations

import copy
import json
import os
import re

import pytest

from conftest import TUNE_PROX as PROX, TUNING_BASE as BASE
from fedrepro.configure import expansion, registry, schema, settings, tuning
from fedrepro.configure.schema import ConfigError
from fedrepro.identity import partition_id, run_id

DYN = {"when": {"algorithm": "feddyn"}, "grid": {"feddyn.alpha": [0.1, 0.01]}, "seeds": [7]}


def params(tune, grid) -> dict:
    exp = {"base": copy.deepcopy(BASE), "grid": grid, "tune": copy.deepcopy(tune)}
    return schema.validate({"experiments": {"e": exp}}, "params.schema.yaml", "test.yaml")


def expanded(tune, grid):
    p, tunings = params(tune, grid), {}
    runs = expansion.expand(p, tunings)
    return expansion.manifest(p, runs, "t", tunings), runs


def final_setting(algorithm: str, seed: int, **sections) -> dict:
    """The final run's setting as the params file and the choice make it, resolved on its own."""
    return settings.resolve(settings.deep_merge({**BASE, "algorithm": algorithm, "seed": seed}, sections))


# --------------------------------------------------------------------------- choose


def summary(value: float, status="finished", scored_on="validation", key="final_acc") -> dict:
    return {"status": status, key: value, "scored_on": scored_on}


def selection(*candidates, criterion="mean_final_val_acc") -> dict:
    """Candidates x=0, x=1, ... each with its runs' ids."""
    return {
        "criterion": criterion,
        "candidates": [{"point": {"x": i}, "label": f"x={i}", "runs": list(r)} for i, r in enumerate(candidates)],
    }


def test_the_choice_record_names_every_candidates_values_statuses_mean_and_the_winner():
    # means 0.625, 0.75 and 0.5 (binary fractions: exact); the best single run, c1 = 0.875, is x=2's, whose mean
    # is the lowest: a per-run maximum would pick x=2
    sel = selection(["a1", "a2"], ["b1", "b2"], ["c1", "c2"])
    sums = {
        "a1": summary(0.5),
        "a2": summary(0.75),
        "b1": summary(0.75),
        "b2": summary(0.75),
        "c1": summary(0.875),
        "c2": summary(0.125),
    }
    assert tuning.choose(sel, sums) == {
        "criterion": "mean_final_val_acc",
        "criterion_says": "mean over the tuning seeds of the final validation accuracy",
        "higher_is_better": True,
        "candidates": [
            {"point": {"x": 0}, "label": "x=0", "runs": ["a1", "a2"], "values": [0.5, 0.75],
             "statuses": ["finished", "finished"], "value": 0.625},
            {"point": {"x": 1}, "label": "x=1", "runs": ["b1", "b2"], "values": [0.75, 0.75],
             "statuses": ["finished", "finished"], "value": 0.75},
            {"point": {"x": 2}, "label": "x=2", "runs": ["c1", "c2"], "values": [0.875, 0.125],
             "statuses": ["finished", "finished"], "value": 0.5},
        ],
        "chosen": {"x": 1},
        "chosen_label": "x=1",
        "chosen_index": 1,
    }  # fmt: skip


def test_a_loss_criterion_picks_the_lowest_mean_and_says_so():
    sel = selection(["a"], ["b"], ["c"], criterion="mean_final_val_loss")
    sums = {r: summary(v, key="final_loss") for r, v in (("a", 0.5), ("b", 0.25), ("c", 0.75))}
    choice = tuning.choose(sel, sums)
    assert (choice["chosen"], choice["chosen_index"], choice["chosen_label"]) == ({"x": 1}, 1, "x=1")
    assert choice["criterion"] == "mean_final_val_loss" and choice["higher_is_better"] is False
    assert choice["criterion_says"] == "mean over the tuning seeds of the final validation loss"
    assert [c["value"] for c in choice["candidates"]] == [0.5, 0.25, 0.75]


@pytest.mark.parametrize("criterion, key", [("mean_final_val_acc", "final_acc"), ("mean_final_val_loss", "final_loss")])
def test_an_exact_tie_goes_to_the_candidate_listed_first_on_either_criterion(criterion, key):
    # x=1 and x=2 tie for the best value of the criterion; x=0 is worse (a lower accuracy, a higher loss)
    best, worse = (0.75, 0.5) if criterion == "mean_final_val_acc" else (0.25, 0.5)
    sel = selection(["a"], ["b"], ["c"], criterion=criterion)
    choice = tuning.choose(
        sel, {"a": summary(worse, key=key), "b": summary(best, key=key), "c": summary(best, key=key)}
    )
    assert choice["chosen_index"] == 1 and choice["chosen"] == {"x": 1}


def test_a_diverged_run_loses_whatever_its_value():
    # x=0's run says diverged but carries a finite, higher accuracy: it still loses to x=1
    sel = selection(["a"], ["b"])
    choice = tuning.choose(sel, {"a": summary(0.875, status="diverged"), "b": summary(0.25)})
    assert choice["chosen_index"] == 1
    assert choice["candidates"][0]["value"] is None and choice["candidates"][0]["statuses"] == ["diverged"]
    assert choice["candidates"][0]["values"] == [0.875]


def test_a_non_finite_value_loses_even_when_the_run_says_finished():
    sel = selection(["a"], ["b"])
    choice = tuning.choose(sel, {"a": summary(float("inf")), "b": summary(0.25)})
    assert choice["chosen_index"] == 1 and choice["candidates"][0]["value"] is None
    assert choice["candidates"][0]["values"] == [None]  # JSON has no infinity either
    json.dumps(choice, allow_nan=False)


def test_a_losing_candidate_listed_first_does_not_end_the_ranking():
    sel = selection(["a"], ["b"], ["c"])
    choice = tuning.choose(sel, {"a": summary(float("nan"), "diverged"), "b": summary(0.25), "c": summary(0.5)})
    assert choice["chosen_index"] == 2


def test_every_candidate_diverged_names_each_with_its_runs_statuses():
    sel = selection(["a1", "a2"], ["b"])
    sums = {"a1": summary(0.5), "a2": summary(float("nan"), "diverged"), "b": summary(float("nan"), "diverged")}
    with pytest.raises(tuning.TuningError) as err:
        tuning.choose(sel, sums)
    assert str(err.value) == "every candidate diverged: x=0 (finished, diverged); x=1 (diverged); widen the tune grid"


def test_a_run_without_its_summary_refuses_the_choice():
    with pytest.raises(tuning.TuningError) as err:
        tuning.choose(selection(["a"], ["b"]), {"a": summary(0.5), "b": None})
    assert str(err.value) == "tuning run b has no summary; it has to finish before the choice"


@pytest.mark.parametrize("scored_on, says", [(None, "test"), ("test", "test"), ("train", "train")])
def test_a_run_not_scored_on_the_validation_split_refuses_the_choice(scored_on, says):
    b = summary(0.5)
    if scored_on is None:
        del b["scored_on"]  # a summary from before the key existed was scored on the test set
    else:
        b["scored_on"] = scored_on
    with pytest.raises(tuning.TuningError) as err:
        tuning.choose(selection(["a"], ["b"]), {"a": summary(0.5), "b": b})
    assert str(err.value) == (
        f"tuning run b was scored on the {says} set, not the validation split; a tuning never looks at the test set"
    )


# --------------------------------------------------------------------------- select: from the run folders


def write_summary(runs_dir, rid: str, body: dict) -> None:
    (runs_dir / rid).mkdir(parents=True)
    (runs_dir / rid / "summary.json").write_text(json.dumps(body))


def test_select_reads_the_runs_summaries_and_names_the_tuning(tmp_path):
    manifest = {"tunings": {"t1": {"selection": selection(["c1"], ["a1", "a2"], ["b1", "b2"])}, "t2": {}}}
    for rid, value in (("a1", 0.5), ("a2", 0.5), ("b1", 0.75), ("b2", 0.25)):
        write_summary(tmp_path, rid, summary(value))
    # a diverged run's summary as the trainer writes it: NaN, a token Python's json reads back
    write_summary(tmp_path, "c1", summary(float("nan"), "diverged"))
    assert "NaN" in (tmp_path / "c1" / "summary.json").read_text()
    choice = tuning.select(manifest, "t1", str(tmp_path))
    assert choice["tuning"] == "t1" and choice["chosen"] == {"x": 1}  # 0.5 and 0.5: a tie, the first
    assert [c["values"] for c in choice["candidates"]] == [[None], [0.5, 0.5], [0.75, 0.25]]
    assert set(choice) == {"tuning", "criterion", "criterion_says", "higher_is_better", "candidates", "chosen",
                           "chosen_label", "chosen_index"}  # fmt: skip


def test_select_refuses_a_run_still_training(tmp_path):
    manifest = {"tunings": {"t1": {"selection": selection(["a"], ["b"])}}}
    write_summary(tmp_path, "a", summary(0.5))
    (tmp_path / "b").mkdir()  # started: a checkpoint, no summary yet
    (tmp_path / "b" / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(tuning.TuningError) as err:
        tuning.select(manifest, "t1", tmp_path)
    assert str(err.value) == "tuning run b has no summary; it has to finish before the choice"


def test_select_refuses_a_tuning_the_manifest_lacks_naming_those_it_has(tmp_path):
    with pytest.raises(tuning.TuningError) as err:
        tuning.select({"tunings": {"t1": {}, "t2": {}}}, "t3", tmp_path)
    assert str(err.value) == "tuning t3 is not in the manifest; it has: t1, t2"
    with pytest.raises(tuning.TuningError) as err:
        tuning.select({"experiments": {}}, "t3", tmp_path)
    assert str(err.value) == "tuning t3 is not in the manifest; it has: "


# --------------------------------------------------------------------------- tune blocks


def exp_with(**block) -> dict:
    return {"tune": [{**PROX, **block}]}


def refusal(**block) -> str:
    with pytest.raises(ConfigError) as err:
        tuning.blocks("e", exp_with(**block))
    return str(err.value)


def test_a_blocks_defaults_and_given_values_reach_it():
    (plain,) = tuning.blocks("e", exp_with())
    assert (plain.where, plain.when, plain.grid, plain.seeds) == (
        "experiments.e.tune[0]",
        PROX["when"],
        PROX["grid"],
        [7],
    )
    assert (plain.criterion, plain.validation, plain.without) == ("mean_final_val_acc", 0.1, [])
    _, given = tuning.blocks(
        "e", {"tune": [PROX, {**PROX, "criterion": "mean_final_val_loss", "validation": 0.25, "without": ["ima"]}]}
    )
    assert (given.where, given.criterion, given.validation, given.without) == (
        "experiments.e.tune[1]",
        "mean_final_val_loss",
        0.25,
        ["ima"],
    )
    assert tuning.blocks("e", {}) == [] and tuning.blocks("e", {"tune": None}) == []


def test_a_dotted_when_key_is_a_setting_by_its_section():
    (block,) = tuning.blocks("e", exp_with(when={"fedprox.mu": 0.1, "partition.kind": "iid"}))
    assert block.when == {"fedprox.mu": 0.1, "partition.kind": "iid"}


def test_the_blocks_refusals_word_for_word():
    assert refusal(criterion="best_test_acc") == (
        "experiments.e.tune[0]: criterion 'best_test_acc' is unknown; known: mean_final_val_acc, mean_final_val_loss"
    )
    # the guess reads the section of a dotted key, whatever follows it
    assert refusal(when={"fedprx.some.long.path.here": 1}) == (
        "experiments.e.tune[0]: when: 'fedprx.some.long.path.here' is no setting; did you mean fedprox?"
    )
    assert refusal(when={"zzzzzz": 1}) == "experiments.e.tune[0]: when: 'zzzzzz' is no setting"
    assert refusal(without=["imma", "awre"]) == (
        "experiments.e.tune[0]: without: imma, awre is no plug-in; known: " + ", ".join(sorted(registry.PLUGINS))
    )
    assert ", ".join(sorted(registry.PLUGINS)) == "aware, ima, random_batch, random_epochs"
    assert refusal(grid={"seed": [1, 2]}) == (
        "experiments.e.tune[0]: grid: 'seed' is no value to tune; the tuning runs' seeds are 'seeds'"
    )


def block(**fields) -> tuning.Block:
    return tuning.Block(**{"where": "experiments.e.tune[0]", "grid": PROX["grid"], "seeds": [7],
                           "criterion": "mean_final_val_acc", "validation": 0.1, "without": [], **fields})  # fmt: skip


def test_a_when_list_is_the_values_allowed():
    either = block(when={"algorithm": ["fedprox", "feddyn"]})
    assert either.matches({"algorithm": "fedprox", "plugins": []})
    assert either.matches({"algorithm": "feddyn", "plugins": []})
    assert not either.matches({"algorithm": "fedavg", "plugins": []})


def test_when_plugins_is_a_set_of_plugins_in_any_order():
    both = block(when={"algorithm": "fedavg", "plugins": ["ima", "aware"]})
    assert both.matches({"algorithm": "fedavg", "plugins": ["aware", "ima"]})
    assert not both.matches({"algorithm": "fedavg", "plugins": ["ima"]})
    bare = block(when={"plugins": []})
    assert bare.matches({"algorithm": "fedavg", "plugins": []})
    assert bare.matches({"algorithm": "fedavg"})  # no plug-ins key: none
    assert not bare.matches({"algorithm": "fedavg", "plugins": ["ima"]})


def test_two_blocks_claiming_one_point_are_named_with_its_method_and_plugins():
    a, b = block(when={"algorithm": "fedprox"}), block(where="experiments.e.tune[1]", when={"plugins": ["ima"]})
    setting = {"algorithm": "fedprox", "plugins": ["ima"]}
    with pytest.raises(ConfigError) as err:
        tuning.claim([a, b], setting)
    assert str(err.value) == (
        "experiments.e.tune[0] and experiments.e.tune[1] both match the grid point of fedprox+ima; tune several "
        "values together with one block whose grid has several axes"
    )
    assert tuning.claim([a, b], {"algorithm": "fedprox", "plugins": []}) is a
    assert tuning.claim([a], {"algorithm": "fedavg", "plugins": []}) is None


def test_a_candidates_label_is_its_dotted_keys_in_grid_order():
    assert tuning.label({"fedprox": {"mu": 0.1}, "client": {"lr": 0.5}}) == "fedprox.mu=0.1, client.lr=0.5"
    assert tuning.label({"fedprox": {"mu": 0.1}, "seed": 3}) == "fedprox.mu=0.1"


# --------------------------------------------------------------------------- stage: one tuning's runs and entry


def test_a_tunings_name_entry_and_runs():
    p = params(
        [{**PROX, "grid": {"fedprox.mu": [0.1, 0.01], "client.lr": [0.05]}, "seeds": [7, 8]}],
        {"algorithm": ["fedprox+ima"], "seed": [1]},
    )
    raw = settings.deep_merge(p["experiments"]["e"]["base"], {"algorithm": "fedprox+ima", "seed": 1})
    (blk,) = tuning.blocks("e", p["experiments"]["e"])
    tid, entry, runs, pending = tuning.stage(blk, raw, {"algorithm": "fedprox+ima", "seed": 1}, "e")
    part = partition_id(final_setting("fedprox", 1))
    desc = part[: part.index("-n4-")]  # the partition without its client count and hash: fmnist-iid
    assert desc == "fmnist-iid"
    prefix = "tune-fedprox+ima-fmnist-iid-mlp-fedprox.mu_client.lr-"
    assert tid.startswith(prefix) and len(tid) == len(prefix) + 10, tid
    cands = [{"fedprox": {"mu": 0.1}, "client": {"lr": 0.05}}, {"fedprox": {"mu": 0.01}, "client": {"lr": 0.05}}]
    expected_runs = [
        settings.resolve(
            settings.deep_merge(
                {**BASE, "algorithm": "fedprox+ima"}, {**c, "seed": s, "evaluation": {"validation": 0.1}}
            )
        )
        for c in cands
        for s in (7, 8)
    ]
    assert [r.setting for r in runs] == expected_runs
    assert [r.id for r in runs] == [run_id(s) for s in expected_runs]
    assert all(r.experiment == "e" and r.tuning == tid for r in runs)
    assert [r.variant for r in runs] == [
        {"algorithm": "fedprox+ima", "fedprox.mu": mu, "client.lr": 0.05} for mu in (0.1, 0.1, 0.01, 0.01)
    ]
    ids = [r.id for r in runs]
    assert entry == {
        "label": "fedprox+ima: fedprox.mu, client.lr on fmnist-iid (mlp)",
        "grid": {"fedprox.mu": [0.1, 0.01], "client.lr": [0.05]},
        "seeds": [7, 8],
        "criterion": "mean_final_val_acc",
        "validation": 0.1,
        "without": [],
        "when": {"algorithm": "fedprox"},
        "experiments": [],
        "selection": {
            "criterion": "mean_final_val_acc",
            "candidates": [
                {"point": cands[0], "label": "fedprox.mu=0.1, client.lr=0.05", "runs": ids[:2]},
                {"point": cands[1], "label": "fedprox.mu=0.01, client.lr=0.05", "runs": ids[2:]},
            ],
        },
        "pending": [],
    }
    assert pending == {"experiment": "e", "raw": raw, "variant": {"algorithm": "fedprox+ima"}}


def test_a_tunings_name_reads_the_first_candidates_run():
    # the candidates change the partition: the name is the first candidate's (its partition, alpha 0.1)
    base = {**BASE, "partition": {"kind": "dirichlet", "alpha": 0.5, "seed": 1, "min_size": 1}}
    blk = block(when={"algorithm": "fedprox"}, grid={"partition.alpha": [0.1, 0.5]})
    tid, entry, runs, _ = tuning.stage(blk, {**base, "algorithm": "fedprox", "seed": 1}, {"seed": 1}, "e")
    first = partition_id(runs[0].setting)
    assert runs[0].setting["partition"]["alpha"] == 0.1 and partition_id(runs[1].setting) != first
    assert tid.startswith(f"tune-fedprox-{first.rsplit('-', 2)[0]}-mlp-partition.alpha-"), tid
    assert entry["label"] == f"fedprox: partition.alpha on {first.rsplit('-', 2)[0]} (mlp)"


def test_a_bad_candidate_is_named_with_its_block_and_grid_point():
    p = {"seed": 1, "algorithm": "fedprox"}
    with pytest.raises(ConfigError) as err:
        tuning.stage(block(when={}, grid={"fedprox.mu": [200.0]}), {**BASE, **p}, p, "e")
    assert str(err.value).startswith('experiments.e.tune[0] (grid point {"algorithm": "fedprox", "seed": 1}): ')
    # a validation share the tuning runs cannot have: refused by the tuning run's check, named the same way
    with pytest.raises(ConfigError) as err:
        tuning.stage(block(when={}, validation=1.5), {**BASE, **p}, p, "e")
    assert str(err.value).startswith('experiments.e.tune[0] (grid point {"algorithm": "fedprox", "seed": 1}): ')


def test_candidates_giving_one_run_are_named_with_the_method_that_ignores_them():
    p = {"seed": 1, "algorithm": "fedprox+ima"}
    with pytest.raises(ConfigError) as err:
        tuning.stage(block(when={}, grid={"fedavgm.momentum": [0.5, 0.9]}), {**BASE, **p}, p, "e")
    assert str(err.value) == (
        "experiments.e.tune[0]: grid: candidates fedavgm.momentum=0.5 and fedavgm.momentum=0.9 give the same run: "
        "the setting they change is not read by fedprox+ima"
    )


# --------------------------------------------------------------------------- the final runs and tuned manifest


def two_tunings():
    """An experiment with its own fedavg runs and a fedprox and a feddyn tuning (in that order), seeds 1 and 2."""
    manifest, _ = expanded([PROX, DYN], {"algorithm": ["fedavg", "fedprox", "feddyn"], "seed": [1, 2]})
    prox, dyn = manifest["tunings"]
    assert manifest["tunings"][prox]["when"] == PROX["when"] and manifest["tunings"][dyn]["when"] == DYN["when"]
    return manifest, prox, dyn


def test_final_runs_take_the_chosen_value_for_the_tunings_that_chose():
    manifest, prox, dyn = two_tunings()
    finals = tuning.final_runs(manifest["tunings"], {dyn: {"chosen": {"feddyn": {"alpha": 0.01}}}})
    expected = [final_setting("feddyn", s, feddyn={"alpha": 0.01}) for s in (1, 2)]
    assert [r.setting for r, _ in finals] == expected and [t for _, t in finals] == [dyn, dyn]
    assert [r.id for r, _ in finals] == [run_id(s) for s in expected]
    assert [(r.experiment, r.variant, r.label) for r, _ in finals] == [("e", {"algorithm": "feddyn"}, "feddyn")] * 2


def test_a_final_run_the_choice_makes_invalid_is_named_with_its_experiment_and_tuning():
    manifest, prox, _ = two_tunings()
    with pytest.raises(ConfigError) as err:
        tuning.final_runs(manifest["tunings"], {prox: {"chosen": {"fedprox": {"mu": 200.0}}}})
    assert str(err.value).startswith(f"experiments.e tuned by {prox}: "), str(err.value)


def test_the_tuned_manifest_lists_final_runs_and_stand_ins_for_the_tunings_still_waiting():
    manifest, prox, dyn = two_tunings()
    before = copy.deepcopy(manifest)
    choice = {"chosen": {"fedprox": {"mu": 0.01}}, "chosen_label": "fedprox.mu=0.01", "chosen_index": 1}
    tuned = tuning.tuned_manifest(manifest, {prox: choice})
    assert manifest == before  # a copy: the manifest itself is left alone
    own = before["experiments"]["e"]["runs"]
    assert [r["setting"]["algorithm"] for r in own] == ["fedavg", "fedavg"]
    assert tuned["experiments"]["e"]["runs"][: len(own)] == own  # the experiment's own runs first, as they were
    added = tuned["experiments"]["e"]["runs"][len(own) :]
    chosen = [final_setting("fedprox", s, fedprox={"mu": 0.01}) for s in (1, 2)]
    waiting = [final_setting("feddyn", s, feddyn={"alpha": 0.1}) for s in (1, 2)]  # the first candidate
    assert added == [
        {
            "id": run_id(s),
            "variant": {"algorithm": "fedprox"},
            "label": "fedprox",
            "seed": s["seed"],
            "partition": partition_id(s),
            "setting": s,
            "tuned": {"tuning": prox, "chosen": {"fedprox": {"mu": 0.01}}, "label": "fedprox.mu=0.01"},
        }
        for s in chosen
    ] + [
        {
            "id": f"{dyn}.waiting{i}",
            "variant": {"algorithm": "feddyn"},
            "label": "feddyn",
            "seed": s["seed"],
            "partition": partition_id(s),
            "setting": s,
            "waiting": dyn,
        }
        for i, s in enumerate(waiting)
    ]
    assert tuned["tunings"][prox]["choice"] == choice and tuned["tunings"][dyn]["choice"] is None
    assert {k: v for k, v in tuned["tunings"][prox].items() if k != "choice"} == before["tunings"][prox]


def test_a_manifest_without_tunings_is_its_own_tuned_manifest(tmp_path):
    plain = {"experiments": {"e": {"runs": [{"id": "r1"}]}}}
    assert tuning.tuned_manifest(plain, {}) == plain
    assert tuning.waiting_settings(plain, ["e"]) == []
    assert tuning.choices_on_disk(plain, tmp_path) == {}


def test_waiting_settings_are_the_listed_experiments_unchosen_final_runs_with_the_first_candidate():
    manifest, prox, dyn = two_tunings()
    tunings = manifest["tunings"]
    tunings[prox]["choice"] = {"chosen": {"fedprox": {"mu": 0.01}}}  # chosen: not waiting
    other = copy.deepcopy(tunings[dyn])
    other["pending"] = [{**p, "experiment": "f"} for p in other["pending"]]
    also = copy.deepcopy(tunings[prox])
    also["choice"] = None
    manifest["tunings"] = {prox: tunings[prox], dyn: tunings[dyn], "other": other, "also": also}
    assert tuning.waiting_settings(manifest, ["e"]) == [
        *(final_setting("feddyn", s, feddyn={"alpha": 0.1}) for s in (1, 2)),
        *(final_setting("fedprox", s, fedprox={"mu": 0.1}) for s in (1, 2)),
    ]
    assert tuning.waiting_settings(manifest, ["f"]) == [
        final_setting("feddyn", s, feddyn={"alpha": 0.1}) for s in (1, 2)
    ]
    assert tuning.waiting_settings(manifest, []) == []


def test_a_waiting_setting_the_first_candidate_makes_invalid_is_named_with_its_experiment():
    manifest, prox, dyn = two_tunings()
    manifest["tunings"][prox]["selection"]["candidates"][0]["point"] = {"fedprox": {"mu": 200.0}}
    with pytest.raises(ConfigError) as err:
        tuning.waiting_settings(manifest, ["e"])
    assert str(err.value).startswith("e: "), str(err.value)


def test_the_choices_on_disk_are_the_manifests_tunings_with_a_file(tmp_path, monkeypatch):
    manifest = {"tunings": {"t1": {}, "t2": {}}}
    folder = tmp_path / "results" / "tuning"
    folder.mkdir(parents=True)
    (folder / "t1.json").write_text(json.dumps({"chosen": {"x": 1}}))
    (folder / "t3.json").write_text(json.dumps({"chosen": {"x": 3}}))  # no tuning of this manifest
    assert tuning.choices_on_disk(manifest, folder) == {"t1": {"chosen": {"x": 1}}}
    assert tuning.choices_on_disk(manifest, str(folder)) == {"t1": {"chosen": {"x": 1}}}
    monkeypatch.chdir(tmp_path)
    assert tuning.choices_on_disk(manifest) == {"t1": {"chosen": {"x": 1}}}  # results/tuning by default


def test_the_tuned_manifests_path_sits_beside_the_manifest():
    assert tuning.tuned_manifest_path("results/manifests/ima.json") == "results/manifests/ima.tuned.json"
    assert tuning.tuned_manifest_path("results/ima.yaml") == "results/ima.yaml.tuned"
    assert tuning.tuned_manifest_path("ima.JSON") == "ima.JSON.tuned"


# --------------------------------------------------------------------------- the run table


def write_tuned(path, runs: list[dict], stamp_ns: int) -> None:
    path.write_text(json.dumps({"experiments": {"e": {"runs": runs}}}))
    os.utime(path, ns=(stamp_ns, stamp_ns))


FINAL = {"id": "fin1", "variant": {"algorithm": "fedprox"}, "setting": {"seed": 1}, "tuned": {"tuning": "t"}}
WAITING = {"id": "t.waiting0", "variant": {}, "setting": {}, "waiting": "t"}
OWN = settings.Run("own1", "e", {"seed": 2}, {"algorithm": "fedavg"})


def test_the_run_table_holds_the_files_runs_before_the_tuned_manifest_exists(tmp_path):
    table = tuning.RunTable({"own1": OWN}, str(tmp_path / "m.tuned.json"))
    assert "own1" in table and table["own1"] is OWN and dict(table) == {"own1": OWN}
    assert "fin1" not in table and table.final_ids() == []
    with pytest.raises(KeyError) as err:
        table["fin1"]
    assert err.value.args == ("fin1",)


def test_the_run_table_adds_the_tuned_final_runs_and_follows_the_file(tmp_path):
    path = tmp_path / "m.tuned.json"
    table = tuning.RunTable({"own1": OWN}, path)
    write_tuned(path, [{"id": "own1"}, FINAL, WAITING], 10**18)
    assert table.final_ids() == ["fin1"]
    assert "fin1" in table and "own1" in table
    assert "t.waiting0" not in table and "nothing" not in table
    assert table["fin1"] == settings.Run("fin1", "e", {"seed": 1}, {"algorithm": "fedprox"})
    assert table["own1"] is OWN
    with pytest.raises(KeyError) as err:
        table["t.waiting0"]
    assert err.value.args == ("t.waiting0",)
    # a rewritten file (a new choice): the table reads it again
    write_tuned(path, [{**FINAL, "id": "fin2"}], 2 * 10**18)
    assert table.final_ids() == ["fin2"] and "fin1" not in table
    # an unchanged stamp is the same file: read once (Snakemake asks for every job)
    path.write_text(json.dumps({"experiments": {"e": {"runs": [{**FINAL, "id": "fin3"}]}}}))
    os.utime(path, ns=(2 * 10**18, 2 * 10**18))
    assert table.final_ids() == ["fin2"]


def test_an_unsafe_run_or_tuning_name_is_refused_naming_which(monkeypatch):
    # the names are made of the setting's names (an outside method's entry point may hold any character but
    # '='); identity makes them, so a name identity would make unsafe is put in here by hand
    p = {"seed": 1, "algorithm": "fedprox"}
    real_run_id, real_partition_id = tuning.run_id, tuning.partition_id
    monkeypatch.setattr(tuning, "run_id", lambda s: "my " + real_run_id(s))
    with pytest.raises(ConfigError) as err:
        tuning.stage(block(when={}), {**BASE, **p}, p, "e")
    assert re.fullmatch(r"run name 'my fedprox-fmnist-iid-mlp-s7-\w+' is not allowed: use letters, digits and "
                        r"_ \. \+ - only", str(err.value)), str(err.value)  # fmt: skip
    monkeypatch.setattr(tuning, "run_id", real_run_id)
    monkeypatch.setattr(tuning, "partition_id", lambda s: "fmnist-my iid-n4-" + real_partition_id(s)[-8:])
    with pytest.raises(ConfigError) as err:
        tuning.stage(block(when={}), {**BASE, **p}, p, "e")
    assert re.fullmatch(r"tuning name 'tune-fedprox-fmnist-my iid-mlp-fedprox\.mu-\w+' is not allowed: use "
                        r"letters, digits and _ \. \+ - only", str(err.value)), str(err.value)  # fmt: skip
