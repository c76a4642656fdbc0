"""The algorithms and plug-ins, assembled from their settings fragments.

A method is two files side by side: ``algorithms/<name>.py`` (its math, a ``build`` or ``apply``) and
``algorithms/<name>.yaml`` (its settings):

    kind: algorithm            # or plugin; `part` for keys shared by several methods (proxy.yaml)
    schema:                    # the setting sections it reads, as JSON schema with defaults
      <section>: {type: object, default: {}, properties: {...}}
    keys: {...}                # keys other fragments may include with `$keys: <this file's name>`
    requires:                  # conditions checked before any job (fedrepro.configure.conditions)
      - {check: "<section>.mu * client.lr < 1", because: "..."}
    refuses:                   # plug-ins: algorithms it cannot be combined with, and why
      <algorithm>: "..."
    fork:                      # plug-ins that act only from some round on (fedrepro.configure.forks)
      acts_from: "<expression: the first round it changes anything>"
      needs_models: "<expression: the host's last global models it needs at that round>"

Nothing else names a method: the schema of a setting is ``schemas/setting.schema.yaml`` plus these
sections, and the sections a run does not read are pruned from it so that they do not enter its hash.
A method of the user's own package (fedrepro.external) joins when a setting names it (``admit``), with the
fragment it brings. This module reads YAML only, so the Snakefile can check a grid of thousands of runs before any job
starts; training code does not import it.
"""

from __future__ import annotations

import copy
import functools

import yaml

from fedrepro import catalog, external
from fedrepro.catalog import DATASETS, MODELS, PARTITION_KEYS, PARTITION_KINDS, FragmentError
from fedrepro.configure import conditions

FRAGMENTS = catalog.PACKAGE / "algorithms"
SCHEMAS = catalog.PACKAGE / "schemas"


def _stamps() -> tuple:
    return catalog.stamps(FRAGMENTS)


@functools.lru_cache(maxsize=4)
def _fragments(stamps: tuple) -> dict[str, dict]:
    fragments = catalog.fragments(FRAGMENTS)
    for name, fragment in fragments.items():
        path = FRAGMENTS / f"{name}.yaml"
        kind = fragment.get("kind")
        if kind not in ("algorithm", "plugin", "part"):
            raise FragmentError(f"{path}: kind must be algorithm, plugin or part, not {kind!r}")
        if kind != "part" and not path.with_suffix(".py").is_file():
            raise FragmentError(f"{path}: no {name}.py beside it")
        for condition in fragment.get("requires", []):
            conditions.parse(condition["check"])  # a malformed condition fails here, not in a grid
        fork = fragment.get("fork")
        if fork is not None:
            if (
                kind != "plugin"
                or not isinstance(fork, dict)
                or set(fork) - {"acts_from", "needs_models"}
                or "acts_from" not in fork
            ):
                raise FragmentError(f"{path}: fork: a plug-in's acts_from (and needs_models) expressions only")
            for expression in fork.values():
                conditions.parse(str(expression))
    return fragments


# Methods of the users' own packages that a setting named (fedrepro.external), admitted by ``admit``
OUTSIDE: dict[str, dict] = {}
OUTSIDE_MODULES: dict[str, str] = {}


def fragments() -> dict[str, dict]:
    return {**_fragments(_stamps()), **OUTSIDE}


def _entry(f: dict) -> dict:
    return {
        "sections": sorted(f.get("schema", {})),
        "requires": f.get("requires", []),
        "refuses": f.get("refuses", {}),
        "fork": f.get("fork"),
        "tune": f.get("tune"),
    }


def _entries(kind: str) -> dict[str, dict]:
    return {name: _entry(f) for name, f in fragments().items() if f["kind"] == kind}


ALGORITHMS: dict[str, dict] = _entries("algorithm")
PLUGINS: dict[str, dict] = _entries("plugin")
# Sections of a setting that only some algorithms or plug-ins read; the others are pruned
OPTIONAL_SECTIONS = {s for entry in [*ALGORITHMS.values(), *PLUGINS.values()] for s in entry["sections"]}


def admit(names: list[str]) -> None:
    """The outside methods among ``names`` join the registry (their fragments, their sections) before a setting
    naming them is validated; a module not written to the method API is refused here, in one line
    (fedrepro.external.MethodError). Names that are neither built in nor outside are left to the checks."""
    for name in names:
        if name in ALGORITHMS or name in PLUGINS:
            continue
        method = external.find(name)
        if method is None:
            continue
        fragment = method.fragment
        if method.module in OUTSIDE_MODULES.values():  # one module under a second name: its sections are there
            (ALGORITHMS if method.kind == "algorithm" else PLUGINS)[name] = _entry(fragment)
            continue
        core = yaml.safe_load((SCHEMAS / "setting.schema.yaml").read_text())["properties"]
        for section in fragment.get("schema") or {}:
            if section in core or section in OPTIONAL_SECTIONS:
                raise FragmentError(
                    f"{method.where}: its settings section '{section}' is one of fedrepro's already; "
                    f"name its section after the method"
                )
        for condition in fragment.get("requires", []):
            conditions.parse(condition["check"])
        if fragment.get("fork") is not None and method.kind != "plugin":
            raise FragmentError(f"{method.where}: fork: only a plug-in acts from some round on")
        OUTSIDE[name], OUTSIDE_MODULES[name] = fragment, method.module
        (ALGORITHMS if method.kind == "algorithm" else PLUGINS)[name] = _entry(fragment)
        OPTIONAL_SECTIONS.update(fragment.get("schema") or {})


def sections_used(algorithm: str, plugins: list[str]) -> set[str]:
    used = set(ALGORITHMS.get(algorithm, {}).get("sections", []))
    for plugin in plugins:
        used |= set(PLUGINS.get(plugin, {}).get("sections", []))
    return used


def extra_checks(algorithm: str, plugins: list[str], partition_kind: str | None = None):
    """Per method, plug-in and the partition kind, a check: setting -> the messages of the conditions it does not
    meet (each fragment's ``requires``)."""
    for name, entry in [(algorithm, ALGORITHMS.get(algorithm, {})), *((p, PLUGINS.get(p, {})) for p in plugins)]:
        if entry.get("requires"):
            yield functools.partial(conditions.violations, entry["requires"], owner=name)
    requires = PARTITION_KINDS.get(partition_kind, {}).get("requires")
    if requires:
        yield functools.partial(conditions.violations, requires, owner=f"partition.kind = {partition_kind}")


# --------------------------------------------------------------------------- datasets, models, partition kinds

# The facts every entry of a kind's fragments must give (the others are optional)
REQUIRED_FACTS = {
    "data": ("train_size", "test_size", "num_classes", "shape"),
    "models": ("datasets",),
    "partitions": ("doc", "keys", "name"),
}


def check_fragments() -> None:
    """The data, model and partition fragments give what validation, training and naming read, before any job;
    a missing fact is named with its file rather than met as a KeyError later."""
    for name, facts in DATASETS.items():
        _require(f"data/{facts['family']}.yaml: dataset '{name}'", facts, REQUIRED_FACTS["data"])
        for model in facts.get("models", []):
            if model not in MODELS:
                raise FragmentError(
                    f"data/{facts['family']}.yaml: dataset '{name}' lists model '{model}', which no "
                    f"models/*.yaml declares"
                )
    for name, facts in MODELS.items():
        _require(f"models/{facts['family']}.yaml: model '{name}'", facts, REQUIRED_FACTS["models"])
        if not fits(name):
            raise FragmentError(f"models/{facts['family']}.yaml: model '{name}' fits no dataset")
    for kind, spec in PARTITION_KINDS.items():
        _require(f"partitions/{kind}.yaml", spec, REQUIRED_FACTS["partitions"])
        for condition in spec.get("requires", []):
            conditions.parse(condition["check"])  # a malformed condition fails here, not in a grid


def _require(where: str, facts: dict, keys) -> None:
    missing = [k for k in keys if k not in facts]
    if missing:
        raise FragmentError(f"{where}: missing {', '.join(missing)}")


def fits(model: str) -> list[str]:
    """The datasets a model fits: those its fragment lists, and those whose fragment lists it."""
    return [
        *MODELS[model].get("datasets", []),
        *(name for name, facts in DATASETS.items() if model in facts.get("models", [])),
    ]


# --------------------------------------------------------------------------- schemas


def _with_keys(properties: dict, where: str) -> dict:
    """A section's properties with ``$keys: <fragment>`` replaced by that fragment's keys (listed keys win)."""
    properties = dict(properties)
    source = properties.pop("$keys", None)
    if source is None:
        return properties
    shared = fragments().get(source, {}).get("keys")
    if shared is None:
        raise FragmentError(f"{where}: $keys: {source} names no fragment with keys")
    return {**copy.deepcopy(shared), **properties}


def setting_schema() -> dict:
    """The schema of one resolved run: the core file plus every fragment's sections (admitted outside ones too)."""
    return _setting_schema(_stamps(), (SCHEMAS / "setting.schema.yaml").stat().st_mtime_ns, tuple(OUTSIDE))


@functools.lru_cache(maxsize=4)
def _setting_schema(stamps: tuple, core_mtime: int, outside: tuple = ()) -> dict:
    schema = yaml.safe_load((SCHEMAS / "setting.schema.yaml").read_text())
    # the datasets, models and partition kinds that exist are their fragments' (fedrepro.catalog)
    schema["properties"]["dataset"]["enum"] = list(DATASETS)
    schema["properties"]["model"]["enum"] = list(MODELS)
    check_fragments()
    partition = schema["properties"]["partition"]
    partition["properties"]["kind"]["enum"] = list(PARTITION_KINDS)
    partition["properties"]["kind"]["description"] += "".join(
        f" | {kind}: {spec['doc']}" for kind, spec in PARTITION_KINDS.items()
    )
    for kind, spec in PARTITION_KINDS.items():
        for key, sub in (spec.get("properties") or {}).items():
            if partition["properties"].get(key, sub) != sub:  # two kinds may declare one setting, alike
                raise FragmentError(f"partitions/{kind}.yaml: partition.{key} is defined twice, differently")
            partition["properties"][key] = sub
    for kind in PARTITION_KINDS:  # after every kind has added its settings: one kind may read another's
        unknown = set(PARTITION_KEYS[kind]) - set(partition["properties"])
        if unknown:
            raise FragmentError(f"partitions/{kind}.yaml: keys {sorted(unknown)} are no partition setting")
    for name, fragment in {**_fragments(stamps), **{n: OUTSIDE[n] for n in outside}}.items():
        for section, sub in (fragment.get("schema") or {}).items():
            if section in schema["properties"]:
                raise FragmentError(f"algorithms/{name}.yaml: section '{section}' is defined twice")
            sub = dict(sub)
            sub["properties"] = _with_keys(sub.get("properties", {}), f"algorithms/{name}.yaml: {section}")
            schema["properties"][section] = sub
    return schema
