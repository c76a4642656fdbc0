"""Methods are assembled from their settings fragments; their conditions are safe expressions."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from fedrepro.configure import conditions, registry, schema, settings


def test_every_method_module_has_its_fragment_and_every_fragment_its_module():
    modules = {p.stem for p in registry.FRAGMENTS.glob("*.py")} - {"__init__", "proxy"}
    assert modules == set(registry.ALGORITHMS) | set(registry.PLUGINS)


def test_shared_keys_are_included_and_listed_keys_win():
    schema = registry.setting_schema()["properties"]
    assert schema["aware"]["properties"] == schema["fedaware"]["properties"] | {} or set(
        schema["aware"]["properties"]
    ) == set(schema["fedaware"]["properties"]) - {"weights"}
    assert schema["serverft"]["properties"]["server_epochs"]["default"] == 2  # its own value
    assert schema["feddf"]["properties"]["server_epochs"]["default"] == 100  # the shared one
    assert set(schema["fedbe"]["properties"]) == set(schema["feddf"]["properties"]) | {"swag_scale"}


def test_a_condition_names_its_keys_and_their_values():
    with pytest.raises(schema.ConfigError) as err:
        settings.resolve({"algorithm": "fedprox", "fedprox": {"mu": 10}, "client": {"lr": 0.5}})
    message = str(err.value)
    assert "fedprox.mu = 10" in message and "client.lr = 0.5" in message and "overshoot" in message


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "open('x')",
        "(lambda: 1)()",
        "client['lr']",
        "[x for x in rounds]",
        "client.lr.__class__.__mro__",
        "min.__call__(1, 2)",
        "int(x=1)",
    ],
)
def test_nothing_but_the_small_language_parses(expression):
    if expression == "client.lr.__class__.__mro__":
        # attributes are setting keys, never Python attributes: an unknown key reads as None
        assert conditions.evaluate(expression, {"client": {"lr": 0.1}}) is None
        return
    with pytest.raises((conditions.ConditionError, SyntaxError)):
        conditions.parse(expression)


def test_conditions_evaluate_like_python_on_the_setting():
    s = {"rounds": 100, "ima": {"start_round": None, "window": 5}, "dataset": "fmnist", "model": "cnn"}
    assert conditions.evaluate("(ima.start_round if ima.start_round is not None else int(0.75 * rounds))", s) == 75
    assert conditions.evaluate("dataset_info.num_classes * 2 + max(1, 3) - len([1, 2])", s) == 21
    assert conditions.evaluate("model_info.feature_classifier and not missing.key", s) is True
    assert conditions.evaluate("1 < rounds <= 100 and dataset in ['fmnist', 'cifar10']", s) is True


def test_a_new_method_needs_only_its_module_and_its_fragment(tmp_path):
    """Copy the package, add two files, and the method is validated, defaulted and built."""
    src = tmp_path / "src"
    shutil.copytree(registry.FRAGMENTS.parent, src / "fedrepro", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "fedrepro" / "algorithms" / "fedtoy.py").write_text(
        textwrap.dedent('''
        """A toy method: FedAvg with a server lr scaled by fedtoy.scale."""
        from fedrepro.parts import Algorithm
        from fedrepro.server import ServerSGD, WeightedMean


        def build(setting, ctx):
            return Algorithm("fedtoy", WeightedMean(), ServerSGD(setting["server"]["lr"] * setting["fedtoy"]["scale"]))
        ''')
    )
    (src / "fedrepro" / "algorithms" / "fedtoy.yaml").write_text(
        textwrap.dedent("""
        kind: algorithm
        schema:
          fedtoy:
            type: object
            additionalProperties: false
            default: {}
            properties:
              scale: {type: number, exclusiveMinimum: 0, default: 0.5}
        requires:
          - check: "fedtoy.scale * server.lr <= 1"
            because: "a toy must not overshoot"
        """)
    )
    script = textwrap.dedent("""
        import torch
        from fedrepro import algorithms, identity
        from fedrepro.configure import schema, settings
        s = settings.resolve({"algorithm": "fedtoy"})
        assert s["fedtoy"] == {"scale": 0.5}, s
        entries = (identity.RUN_ENTRY,) + identity.method_modules("fedtoy", [])
        assert "algorithms/fedtoy.py" in identity.code_closure(entries)
        a = algorithms.build(s, 2, 3, torch.device("cpu"), torch.ones(2))
        assert a.optimizer.lr == 0.5
        try:
            settings.resolve({"algorithm": "fedtoy", "fedtoy": {"scale": 4}})
        except schema.ConfigError as err:
            assert "a toy must not overshoot" in str(err)
        else:
            raise AssertionError("the condition was not checked")
        print("ok")
        """)
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_broken_fragment_is_named(tmp_path, monkeypatch):
    for name in ["fedavg.py", "fedavg.yaml"]:
        shutil.copy(registry.FRAGMENTS / name, tmp_path / name)
    (tmp_path / "bad.py").write_text("")
    (tmp_path / "bad.yaml").write_text("kind: algorithm\nrequires:\n  - {check: \"__import__('os')\", because: x}\n")
    monkeypatch.setattr(registry, "FRAGMENTS", tmp_path)
    with pytest.raises(conditions.ConditionError, match="Call|may be called"):
        registry.fragments()
    (tmp_path / "bad.yaml").write_text("kind: method\n")
    with pytest.raises(registry.FragmentError, match="bad.yaml: kind must be"):
        registry.fragments()


def test_a_fragment_without_a_fact_that_is_read_is_named_before_any_job(monkeypatch):
    from fedrepro import catalog

    registry.check_fragments()  # the shipped fragments give every fact
    monkeypatch.setitem(catalog.DATASETS, "blobs", {"family": "fmnist", "train_size": 10, "test_size": 5, "shape": [2]})
    with pytest.raises(catalog.FragmentError, match=r"data/fmnist.yaml: dataset 'blobs': missing num_classes"):
        registry.check_fragments()
    monkeypatch.setitem(catalog.DATASETS["blobs"], "num_classes", 2)
    monkeypatch.setitem(catalog.DATASETS["blobs"], "models", ["nosuchmodel"])
    with pytest.raises(catalog.FragmentError, match=r"lists model 'nosuchmodel', which no models/\*.yaml declares"):
        registry.check_fragments()
    monkeypatch.setitem(catalog.DATASETS["blobs"], "models", ["mlp"])
    registry.check_fragments()
    assert "blobs" in registry.fits("mlp") and "fmnist" in registry.fits("mlp")
    monkeypatch.setitem(catalog.PARTITION_KINDS, "halves", {"doc": "x", "keys": ["seed"]})
    with pytest.raises(catalog.FragmentError, match=r"partitions/halves.yaml: missing name"):
        registry.check_fragments()


def test_a_partition_kind_may_read_a_setting_another_kind_declares_whatever_their_order(monkeypatch):
    from fedrepro import catalog

    for kind in ("aaa", "zzz"):  # before and after pachinko, which declares beta
        monkeypatch.setitem(catalog.PARTITION_KINDS, kind, {"doc": "x", "keys": ["seed", "beta"], "name": kind})
        monkeypatch.setitem(catalog.PARTITION_KEYS, kind, ["kind", "seed", "beta"])
        schema = registry._setting_schema(("edited", kind), 0)
        assert kind in schema["properties"]["partition"]["properties"]["kind"]["enum"]
        monkeypatch.delitem(catalog.PARTITION_KINDS, kind)
        monkeypatch.delitem(catalog.PARTITION_KEYS, kind)


def test_the_catalog_refuses_an_entry_that_names_its_own_family(tmp_path):
    """An entry's family is the fragment it sits in; a family key of its own would override it in silence."""
    from fedrepro import catalog

    (tmp_path / "toy.py").write_text("")
    (tmp_path / "toy.yaml").write_text("models:\n  toynet: {datasets: [fmnist]}\n")
    assert catalog._members(str(tmp_path), "models") == {"toynet": {"family": "toy", "datasets": ["fmnist"]}}
    (tmp_path / "toy.yaml").write_text("models:\n  toynet: {family: cnn, datasets: [fmnist]}\n")
    os.utime(tmp_path / "toy.yaml", ns=(1, 1))  # a new stamp: the catalog's reader is cached on it
    with pytest.raises(catalog.FragmentError, match="toynet: family is the fragment's own name"):
        catalog._members(str(tmp_path), "models")
