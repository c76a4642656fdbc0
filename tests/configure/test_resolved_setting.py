"""The trainer receives a fully resolved setting: every key of the sections it reads has its value (defaults and
derived defaults filled before the run is named), and run/ and algorithms/ read it without defaults of their own."""

from __future__ import annotations

import ast

import pytest

from fedrepro import identity
from fedrepro.configure import registry, settings

# receivers of .get( in run/ and algorithms/ that are no setting: checkpoint state, the environment, a round's
# info and metrics row, a fork record, a pack's member record (its optional keys: done_at, forks), a JSON record read
# from disk (a run folder's summary)
NOT_SETTINGS = {"state", "environ", "updates", "row", "fork", "member", "read_json"}


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def defaulted_reads(source: str) -> list[int]:
    """Lines of ``x.get(...)`` calls whose receiver is not one of NOT_SETTINGS."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and _root(node.func.value) not in NOT_SETTINGS
    ]


def test_the_check_sees_a_default_read_of_a_setting():
    assert defaulted_reads('s = setting["cohort"].get("assignment", "per_client")\n') == [1]
    assert defaulted_reads('x = self.cfg.get("vr")\ny = state.get("history", [])\n') == [1]


@pytest.mark.parametrize("folder", ["run", "algorithms"])
def test_training_code_reads_the_setting_without_defaults(folder):
    # the run wing's record modules (run folder, provenance) are no training code: outside every run id, they read
    # records and the environment, never a setting
    found = {
        name: lines
        for p in sorted((identity.PACKAGE / folder).glob("*.py"))
        if (name := str(p.relative_to(identity.PACKAGE))) not in identity.OUTSIDE_RUNS
        and (lines := defaulted_reads(p.read_text()))
    }
    assert found == {}, "read the resolved setting's key; its default is written once, in the schema or fragment"


SETTINGS = [{"algorithm": name} for name, entry in registry.fragments().items() if entry["kind"] == "algorithm"]


@pytest.mark.parametrize("raw", SETTINGS + [{"algorithm": "fedavg+ima+aware"}], ids=lambda r: r["algorithm"])
def test_a_resolved_setting_has_every_key_of_its_sections_and_no_null_left_to_derive(raw):
    schema = registry.setting_schema()
    if raw["algorithm"] in ("fedlaw", "feddf", "fedbe", "serverft"):
        raw = {**raw, "evaluation": {"proxy_holdout": 100}}
    if raw["algorithm"] in ("fedfa", "fedasam"):
        raw = {**raw, "model": "cnn"}
    setting = settings.resolve(raw)
    used = registry.sections_used(setting["algorithm"], setting["plugins"])
    expected = {k for k in schema["properties"] if k not in registry.OPTIONAL_SECTIONS or k in used}
    assert set(setting) == expected
    for section, spec in schema["properties"].items():
        if section in setting and section != "partition" and isinstance(setting[section], dict):
            keys = {k for k, sub in spec.get("properties", {}).items() if "default" in sub}
            assert keys <= set(setting[section]), section
            for key, sub in spec.get("properties", {}).items():
                if "null_means" in sub:
                    assert setting[section][key] is not None, f"{section}.{key}"
    assert settings.resolve(setting) == setting  # resolving a resolved setting gives it back


def test_a_derived_default_and_its_value_written_out_are_one_run():
    """proxy.lr null is client.lr, resolved once before the name: the two spellings are one id."""
    base = {"algorithm": "feddf", "evaluation": {"proxy_holdout": 100}, "client": {"lr": 0.03, "momentum": 0.5}}
    derived = settings.resolve(base)
    written = settings.resolve({**base, "feddf": {"lr": 0.03, "momentum": 0.5, "weight_decay": 0.0}})
    assert derived == written and identity.run_id(derived) == identity.run_id(written)
    other = settings.resolve({**base, "client": {"lr": 0.02, "momentum": 0.5}})
    assert other["feddf"]["lr"] == 0.02 and identity.run_id(other) != identity.run_id(derived)


def test_a_neutral_value_is_no_part_of_the_name():
    """The trainer gets hessian, snapshots, corruption with their values; the name leaves the off ones out."""
    setting = settings.resolve({"algorithm": "fedavg"})
    assert setting["hessian"]["every"] == 0 and setting["corruption"]["fraction"] == 0
    named = identity.identity_setting(setting)
    assert not {
        "hessian",
        "corruption",
        "snapshots",
        "log_cohort_classes",
        "preprocess",
        "pretrained",
        "batchnorm",
    } & set(named)
    assert "validation" not in named["evaluation"] and "long_tail_rho" not in named["partition"]
    on = settings.resolve({"algorithm": "fedavg", "hessian": {"every": 5}})
    assert identity.run_id(on) != identity.run_id(setting)
