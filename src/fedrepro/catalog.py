"""What exists, found by one registry: every kind of part is a module plus the YAML fragment beside it.

    algorithms/<name>.yaml   a method or plug-in: its settings sections (read by fedrepro.configure.registry)
    data/<family>.yaml       ``datasets: {<name>: facts}``, the datasets data/<family>.py serves
    models/<family>.yaml     ``models: {<name>: facts}``, the models models/<family>.py builds (its BUILDERS)
    partitions/<kind>.yaml   a partition kind: the keys of its identity, its readable name, its own settings
    report/figures/<paper>.yaml   a paper's figure kinds (read by fedrepro.report.figures)

Adding a dataset, a model or a partition kind is its module and its fragment (fedrepro.configure.registry checks that
each gives the facts that are read). A family module may still key its own tables by dataset name (the CIFAR
archive names, Synthetic's parameters), so a dataset added to an existing family goes into both its files.
This module reads YAML only (no torch), so validation and the Snakefile use it before any job starts, and
training code reads the same facts. A run's identity hashes its own dataset's and model's facts
(``training_facts``), not these files, so editing another entry renames no run.
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from fedrepro.errors import FedreproError

PACKAGE = Path(__file__).resolve().parent
# Facts that describe an entry, and facts only validation and the plan read (which models fit which
# datasets, split sizes, a dataset's own clients): no training code reads them, so a run's name leaves
# them out and adding a dataset to a model's list renames no run. Training reads the others (a family, an
# input shape, classes, domains, a model's BatchNorm or feature classifier).
NOT_READ_BY_TRAINING = frozenset(
    {
        "doc",
        "params",
        "rough_step_seconds",
        "offline",
        "datasets",
        "models",
        "train_size",
        "test_size",
        "natural_clients",
        "coarse_classes",
    }
)


class FragmentError(FedreproError, ValueError):
    """A fragment that cannot be read: a module without one, or an entry declared twice."""


def stamps(folder: str | Path) -> tuple:
    """Each fragment's name and modification time (``folder`` under the package, or a path): cached readers see
    edits."""
    return tuple((p.name, p.stat().st_mtime_ns) for p in sorted((PACKAGE / folder).glob("*.yaml")))


@functools.lru_cache(maxsize=16)
def _read(folder: Path, stamps: tuple) -> dict[str, dict]:
    fragments = {}
    for name, _ in stamps:
        path = folder / name
        fragment = yaml.safe_load(path.read_text()) or {}
        if not isinstance(fragment, dict):
            raise FragmentError(f"{path}: a fragment is a mapping, not {type(fragment).__name__}")
        fragments[Path(name).stem] = fragment
    return fragments


def fragments(folder: str | Path) -> dict[str, dict]:
    """``<folder>/<name>.yaml`` by name, each parsed (``folder`` under the package, or a path)."""
    return _read(PACKAGE / folder, stamps(folder))


def _members(folder: str, section: str) -> dict[str, dict]:
    """The entries of every fragment's ``section``, each with the family (the fragment's name) that serves it."""
    members: dict[str, dict] = {}
    for family, fragment in fragments(folder).items():
        if not (PACKAGE / folder / f"{family}.py").is_file():
            raise FragmentError(f"{PACKAGE / folder / family}.yaml: no {family}.py beside it")
        for name, facts in (fragment.get(section) or {}).items():
            if name in members:
                raise FragmentError(
                    f"{folder}/{family}.yaml: {section[:-1]} '{name}' is declared in "
                    f"{folder}/{members[name]['family']}.yaml too"
                )
            if "family" in facts:
                raise FragmentError(f"{folder}/{family}.yaml: {name}: family is the fragment's own name, not a fact")
            members[name] = {"family": family, **facts}
    return members


DATASETS = _members("data", "datasets")
MODELS = _members("models", "models")
PARTITION_KINDS = {
    kind: fragment
    for kind, fragment in fragments("partitions").items()
    if (PACKAGE / "partitions" / f"{kind}.py").is_file()
}
# the settings a partition of each kind reads: its identity
PARTITION_KEYS = {kind: ["kind", *spec.get("keys", [])] for kind, spec in PARTITION_KINDS.items()}
# partition kinds that can keep a long-tailed subset of the training set before splitting it
LONG_TAIL_KINDS = tuple(kind for kind, spec in PARTITION_KINDS.items() if spec.get("long_tail"))
FEATURE_CLASSIFIER_MODELS = {name for name, spec in MODELS.items() if spec.get("feature_classifier")}


def training_facts(facts: dict) -> dict:
    """An entry's facts that training reads, which a run's name hashes (``NOT_READ_BY_TRAINING`` left out)."""
    return {k: v for k, v in facts.items() if k not in NOT_READ_BY_TRAINING}


def omitted_at_default() -> dict[str, dict]:
    """Section -> {key: default} of the methods' keys marked ``omitted_at_default`` in their fragments
    (algorithms/*.yaml): a key added after runs were named, whose default a run's name leaves out so that
    those runs keep their names (fedrepro.identity.identity_setting)."""
    return {
        section: {
            key: sub["default"]
            for key, sub in (spec.get("properties") or {}).items()
            if isinstance(sub, dict) and sub.get("omitted_at_default")
        }
        for fragment in fragments("algorithms").values()
        for section, spec in (fragment.get("schema") or {}).items()
    }
