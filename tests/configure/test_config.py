"""Params files: schema errors name the key, the value and what is allowed; incompatible settings
are refused before any job starts; every shipped params file expands."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import ROOT, snakemake_cmd, subprocess_env, write_yaml
from fedrepro.configure import expansion, paramsfile, registry, schema, settings


def _params(base: dict | None = None, grid: dict | None = None) -> dict:
    params = {
        "experiments": {
            "exp": {"base": {"dataset": "fmnist", "num_clients": 10, **(base or {})}, "grid": grid or {"seed": [1]}}
        }
    }
    return schema.validate(params, "params.schema.yaml", "params")


def _error(base: dict | None = None, grid: dict | None = None) -> str:
    with pytest.raises(schema.ConfigError) as err:
        expansion.expand(_params(base, grid))
    return str(err.value)


# key as it appears in the message, the bad setting, a fragment of what is allowed
BAD_VALUES = [
    ("partition.alpha", {"partition": {"kind": "dirichlet", "alpha": 0}}, "0", "> 0"),
    ("partition.alpha", {"partition": {"kind": "dirichlet", "alpha": -0.5}}, "-0.5", "> 0"),
    ("participation", {"participation": 0}, "0", "> 0"),
    ("participation", {"participation": 1.5}, "1.5", "<= 1"),
    ("participation", {"participation": -0.1}, "-0.1", "> 0"),
    ("dataset", {"dataset": "imagenet"}, "imagenet", "fmnist"),
    ("model", {"model": "resnet1000"}, "resnet1000", "mlp"),
    ("partition.kind", {"partition": {"kind": "zipf"}}, "zipf", "dirichlet"),
    ("rounds", {"rounds": 0}, "0", ">= 1"),
    ("batch_size", {"batch_size": 0}, "0", ">= 1"),
    ("batch_size", {"batch_size": -4}, "-4", ">= 1"),
    ("local_epochs", {"local_epochs": 0}, "0", ">= 1"),
    ("client.lr", {"client": {"lr": 0}}, "0", "> 0"),
    ("num_clients", {"num_clients": 0}, "0", ">= 1"),
]


@pytest.mark.parametrize("key,base,value,allowed", BAD_VALUES, ids=[f"{k}={v}" for k, _, v, _ in BAD_VALUES])
def test_bad_value_names_key_value_and_what_is_allowed(key, base, value, allowed):
    message = _error(base)
    assert f"'{key}'" in message
    assert repr(value) in message or f"= {value}" in message or f"'{value}'" in message
    assert allowed in message
    assert "experiments.exp" in message, "the message says which experiment"


def test_bad_value_in_a_grid_axis_is_reported():
    message = _error(grid={"partition.alpha": [0.5, -1.0], "seed": [1]})
    assert "'partition.alpha'" in message and "-1.0" in message and "> 0" in message


def test_unknown_algorithm_is_named_with_the_known_ones():
    message = _error({"algorithm": "fedmagic"})
    assert "fedmagic" in message and "algorithm" in message
    for known in registry.ALGORITHMS:
        assert known in message


def test_unknown_plugin_is_named():
    message = _error({"algorithm": "fedavg+sparkle"})
    assert "sparkle" in message


def test_unknown_key_names_allowed_keys():
    message = _error({"rouns": 3})
    assert "rouns" in message and "rounds" in message


def test_every_error_is_reported_at_once():
    message = _error({"rounds": 0, "batch_size": 0})
    assert "'rounds'" in message and "'batch_size'" in message


def test_params_level_schema_error_names_the_key(tmp_path):
    path = write_yaml(tmp_path / "p.yaml", {"experiments": {"e": {"base": {}}}, "data": {"rooot": "x"}})
    with pytest.raises(schema.ConfigError) as err:
        paramsfile.load_params(path)
    assert "rooot" in str(err.value) and "root" in str(err.value)


# --------------------------------------------------------------------------- incompatible settings


def test_participation_that_samples_no_client_is_refused():
    message = _error({"participation": 0.05, "num_clients": 10})
    assert "participation" in message and "num_clients" in message


def test_more_shards_than_samples_is_refused():
    message = _error({"num_clients": 40000, "partition": {"kind": "shards", "classes_per_client": 2}})
    assert "classes_per_client" in message and "num_clients" in message


def test_more_classes_per_client_than_classes_is_refused():
    message = _error({"partition": {"kind": "shards", "classes_per_client": 11}})
    assert "classes_per_client" in message


def test_dirichlet_min_size_beyond_the_data_is_refused():
    message = _error({"num_clients": 100, "partition": {"kind": "dirichlet", "min_size": 1000}})
    assert "min_size" in message


def _needs(plugin: str | None = None, algorithm: str | None = None):
    missing = (plugin and plugin not in registry.PLUGINS) or (algorithm and algorithm not in registry.ALGORITHMS)
    return pytest.mark.skipif(bool(missing), reason=f"{plugin or algorithm} is not in the registry yet")


@_needs(plugin="ima")
def test_ima_start_round_beyond_the_last_round_is_refused():
    message = _error({"algorithm": "fedavg+ima", "rounds": 10, "ima": {"start_round": 50, "window": 5}})
    assert "start_round" in message and "rounds" in message


@_needs(plugin="ima")
def test_ima_window_larger_than_start_round_is_refused():
    message = _error({"algorithm": "fedavg+ima", "rounds": 100, "ima": {"start_round": 3, "window": 10}})
    assert "window" in message and "start_round" in message


@pytest.mark.skipif(
    "aware" not in registry.PLUGINS or "feddyn" not in registry.ALGORITHMS,
    reason="+aware or feddyn is not in the registry yet",
)
def test_aware_with_feddyn_is_refused():
    message = _error({"algorithm": "feddyn+aware"})
    assert "aware" in message and "feddyn" in message


# --------------------------------------------------------------------------- identity


def test_run_ids_are_content_hashes():
    base = {"partition": {"kind": "dirichlet", "alpha": 0.5}}
    a = expansion.expand(_params(base, {"seed": [1, 2]}))
    b = expansion.expand(_params(base, {"seed": [2, 1]}))
    assert sorted(r.id for r in a) == sorted(r.id for r in b)
    c = expansion.expand(_params({"partition": {"kind": "dirichlet", "alpha": 0.3}}, {"seed": [1, 2]}))
    assert not {r.id for r in a} & {r.id for r in c}
    # a section the run does not use does not change its hash
    d = expansion.expand(
        _params({**base, "partition": {"kind": "dirichlet", "alpha": 0.5, "classes_per_client": 7}}, {"seed": [1, 2]})
    )
    assert sorted(r.id for r in a) == sorted(r.id for r in d)


def test_partition_seed_run_is_the_runs_own_seed_written_out():
    """``partition.seed: run`` draws a partition per training seed (FedLAW App. D.4); the resolved setting, the
    run id and the partition id hold the number, so it names the same runs as the seeds written out."""
    base = {"partition": {"kind": "dirichlet", "alpha": 0.5, "seed": "run"}}
    tied = expansion.expand(_params(base, {"seed": [3, 4]}))
    assert [r.setting["partition"]["seed"] for r in tied] == [3, 4]
    written = [
        r
        for seed in (3, 4)
        for r in expansion.expand(
            _params({"partition": {"kind": "dirichlet", "alpha": 0.5, "seed": seed}}, {"seed": [seed]})
        )
    ]
    assert [(r.id, r.partition) for r in tied] == [(r.id, r.partition) for r in written]
    assert len({r.partition for r in tied}) == 2
    shared = expansion.expand(_params({"partition": {"kind": "dirichlet", "alpha": 0.5}}, {"seed": [3, 4]}))
    assert len({r.partition for r in shared}) == 1  # the default stays one fixed draw (seed 1)


@pytest.mark.parametrize(
    "value, allowed", [("runs", "must be of type integer or must be 'run'"), (-1, "must be >= 0 or must be 'run'")]
)
def test_a_bad_partition_seed_names_the_key_and_both_forms(value, allowed):
    with pytest.raises(schema.ConfigError) as err:
        expansion.expand(_params({"partition": {"seed": value}}, {"seed": [1]}))
    assert f"setting 'partition.seed' = {value!r} is not allowed: {allowed}" in str(err.value)
    assert len(str(err.value).splitlines()) == 1


GRID_FILES = [p for p in sorted((ROOT / "params").glob("*.yaml")) if p.name != "paper_results.yaml"]


def test_every_grid_file_is_tested():
    assert {p.stem for p in GRID_FILES} >= {"default", "ima", "fedlaw", "fedaware", "fednova"}


@pytest.mark.parametrize("path", GRID_FILES, ids=lambda p: p.name)
def test_shipped_params_files_expand(path):
    params = paramsfile.load_params(path)
    runs = expansion.expand(params)
    assert runs and len(expansion.unique_runs(runs)) >= 1


# --------------------------------------------------------------------------- through snakemake


def test_snakemake_stops_before_any_job_on_a_bad_value(tmp_path):
    bad = write_yaml(
        tmp_path / "bad.yaml",
        {"experiments": {"e": {"base": {"num_clients": 4, "participation": 1.5, "rounds": 2}, "grid": {"seed": [1]}}}},
    )
    proc = subprocess.run(
        snakemake_cmd(tmp_path, "-n", "--configfile", str(bad)),
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "'participation'" in out and "1.5" in out and "<= 1" in out
    assert "Job stats" not in out
    assert not (tmp_path / "results").exists()


def test_pretrained_on_a_model_that_loads_no_weights_is_refused_naming_the_key():
    """prune drops `pretrained` for models that read none (the MLP): given anyway, it was ignored in silence."""
    message = _error({"model": "mlp", "pretrained": {"path": "EleutherAI/pythia-70m"}})
    assert "experiments.exp: pretrained = " in message and "model 'mlp', which loads no weights" in message
    assert "pythia70m" in message, "names the models that read it"
    # the model that reads it keeps it (the params file of FedAWARE's AGNews rows)
    setting = settings.resolve(
        {"dataset": "agnews", "model": "pythia70m", "num_clients": 10, "pretrained": {"path": "/models/pythia-70m"}}
    )
    assert setting["pretrained"]["path"] == "/models/pythia-70m"


def _alias_bomb(levels: int = 9, width: int = 10) -> str:
    """A mapping whose aliases expand to width**levels values from a few hundred bytes ("billion laughs")."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\nexperiments: {}\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("extra: &a [*a]\nexperiments: {}\n", "line 1: an alias refers to a block that contains it (a recursive alias"),
        ("x: &m {k: [1, {deeper: *m}]}\nexperiments: {}\n", "a recursive alias"),
        (_alias_bomb(), "its aliases expand to more than 100000 values"),
    ],
    ids=["self", "nested", "bomb"],
)
def test_recursive_alias_and_alias_bomb_are_refused_quickly_by_name(tmp_path, capsys, text, message):
    """Once a RecursionError traceback (a recursive alias) or minutes of expansion (a bomb): the file is
    refused while it is read, by `fedrepro expand` and by the Snakefile's read (paramsfile.read_yaml)."""
    import time

    from fedrepro import cli

    path = tmp_path / "bad.yaml"
    path.write_text(text)
    start = time.monotonic()
    with pytest.raises(schema.ConfigError, match=message.replace("(", r"\(")):
        paramsfile.read_yaml(path)
    assert time.monotonic() - start < 2, "refused from the node graph, before anything is expanded"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["expand", "--configfile", str(path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [f"fedrepro expand: {path}, " + err.split(f"{path}, ", 1)[1].strip()]


def test_aliases_that_repeat_a_block_within_reason_still_load(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(_alias_bomb(levels=4) + "more: [*l3, *l3]\n")  # 2 x 10**4 values: fine
    assert len(paramsfile.read_yaml(path)["more"][1]) == 10


def _full_walk(instance: dict) -> dict:
    """Today's setting validated by the whole-schema walk alone (the reference the per-key memo must equal)."""
    setting_schema = schema._load_schema("setting.schema.yaml")
    errors = list(schema._Validator(setting_schema).iter_errors(instance))
    assert not errors, errors[0].message
    return instance


@pytest.mark.parametrize(
    "raw",
    [
        {"dataset": "fmnist", "num_clients": 10, "seed": 1},
        {
            "algorithm": "fedlaw",
            "dataset": "fmnist",
            "num_clients": 20,
            "seed": 9,
            "client": {"lr": 0.08, "momentum": 0.9},
            "partition": {"kind": "dirichlet", "alpha": 0.1},
            "fedlaw": {"variant": "swa"},
        },
        {
            "algorithm": "fedavg",
            "plugins": ["ima"],
            "dataset": "fmnist",
            "num_clients": 100,
            "seed": 2,
            "rounds": 30,
            "partition": {"kind": "shards", "classes_per_client": 2},
            "ima": {"start_round": 20, "window": 5},
        },
    ],
)
def test_validation_by_parts_fills_exactly_what_the_whole_walk_fills(raw):
    # twice: the second validation is served from the memo and must still equal the reference, key order included
    for _ in range(2):
        fast = schema.validate(settings.split_algorithm(json.loads(json.dumps(raw))), "setting.schema.yaml", "t")
        reference = _full_walk(settings.split_algorithm(json.loads(json.dumps(raw))))
        assert json.dumps(fast) == json.dumps(reference)
        fast["client"]["lr"] = -1.0  # a caller changing its copy must not reach the memo
        fast["fedlaw"]["variant"] = "changed"


def test_validation_by_parts_refuses_what_the_whole_walk_refuses():
    good = {"dataset": "fmnist", "num_clients": 10, "seed": 1}
    schema.validate(dict(good), "setting.schema.yaml", "t")  # the good parts are in the memo now
    for bad, key in [
        ({**good, "seed": "one"}, "seed"),
        ({**good, "client": {"lr": 0}}, "client.lr"),
        ({**good, "client": {"lrr": 0.1}}, "client.lrr"),
        ({**good, "nonsense": 1}, "nonsense"),
        ({**good, "participation": 1.5}, "participation"),
    ]:
        with pytest.raises(schema.ConfigError, match=key.replace(".", r"\.")):
            schema.validate(bad, "setting.schema.yaml", "t")
        assert schema._valid_by_parts(dict(bad), schema._load_schema("setting.schema.yaml")) is False


def test_a_schema_with_a_reference_into_the_whole_takes_the_whole_walk():
    # a property checked on its own has no root to resolve "#/..." against; the whole walk does
    whole = {"type": "object", "properties": {"lr": {"$ref": "#/properties/rate"}, "rate": {"type": "number"}}}
    assert schema._valid_by_parts({"lr": 0.1}, whole) is False
    errors = list(schema._Validator(whole).iter_errors({"lr": "fast"}))
    assert errors and "number" in errors[0].message


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fedlaw", "fednova"])
def test_a_papers_grid_expands_to_the_same_runs_with_the_whole_walk(name, monkeypatch):
    params = paramsfile.load_params(ROOT / "params" / f"{name}.yaml")
    fast = [(r.id, json.dumps(r.setting)) for r in expansion.expand(params)]
    monkeypatch.setattr(schema, "_valid_by_parts", lambda instance, whole: False)
    assert [
        (r.id, json.dumps(r.setting))
        for r in expansion.expand(paramsfile.load_params(ROOT / "params" / f"{name}.yaml"))
    ] == fast


def test_one_expansion_reads_the_code_once_and_the_next_sees_an_edit(monkeypatch):
    from fedrepro import identity

    walks = []
    real_closure = identity.code_closure
    monkeypatch.setattr(
        identity,
        "code_closure",
        lambda entries, outside=frozenset(): walks.append(entries) or real_closure(entries, outside),
    )
    params = _params(grid={"seed": [1, 2, 3], "algorithm": ["fedavg", "fedprox"]})
    ids = [r.id for r in expansion.expand(params)]
    assert len(set(ids)) == 6 and len(walks) == 3  # fedavg, fedprox, the partition: once each
    monkeypatch.setattr(identity, "files_hash", lambda names: "edited")  # as if the code changed in between
    assert not set(r.id for r in expansion.expand(params)) & set(ids)
    assert identity.code_hash is not None and not getattr(identity.code_hash, "read_once", False)


def test_plain_copy_and_deep_merge_leave_their_arguments_alone():
    from collections import OrderedDict

    from fedrepro.configure.schema import plain_copy
    from fedrepro.configure.settings import deep_merge

    base = {"client": {"lr": 0.1, "milestones": [10, 20]}, "seed": 1, "tags": OrderedDict(a=[1])}
    copied = plain_copy(base)
    assert copied == base and type(copied["tags"]) is OrderedDict
    copied["client"]["milestones"].append(30)
    copied["tags"]["a"].append(2)
    assert base["client"]["milestones"] == [10, 20] and base["tags"]["a"] == [1]
    override = {"client": {"lr": 0.2, "extra": {"k": [1]}}}
    merged = deep_merge(base, override)
    assert merged["client"] == {"lr": 0.2, "milestones": [10, 20], "extra": {"k": [1]}} and merged["seed"] == 1
    merged["client"]["extra"]["k"].append(2)
    merged["client"]["milestones"].append(3)
    assert override["client"]["extra"]["k"] == [1] and base["client"] == {"lr": 0.1, "milestones": [10, 20]}
