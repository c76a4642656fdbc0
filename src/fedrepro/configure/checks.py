"""A resolved setting's cross-key checks: combinations that cannot work together, refused before any job
starts with a message that names the keys."""

from __future__ import annotations

import json
from pathlib import Path

from fedrepro import catalog, schedule
from fedrepro.configure import registry
from fedrepro.configure.schema import ConfigError, _short


def check_compatible(setting: dict, where: str) -> None:
    """Refuse combinations that cannot work together, before any job starts."""
    problems = []
    algo, plugins = setting["algorithm"], setting["plugins"]
    if algo not in registry.ALGORITHMS:
        problems.append(
            f"algorithm '{algo}' is unknown; known: {', '.join(sorted(registry.ALGORITHMS))}, or a method "
            f"of your own package by its entry point or module path (docs/methods.md)"
        )
    for plugin in plugins:
        if plugin not in registry.PLUGINS:
            problems.append(
                f"plug-in '+{plugin}' is unknown; known: {', '.join('+' + p for p in sorted(registry.PLUGINS))}"
            )
        elif algo in registry.PLUGINS[plugin].get("refuses", ()):
            problems.append(
                f"'+{plugin}' cannot be combined with algorithm '{algo}': {registry.PLUGINS[plugin]['refuses'][algo]}"
            )
    if schedule.cohort_size(setting) < 1:
        problems.append(
            f"participation = {setting['participation']} with num_clients = {setting['num_clients']} samples no client "
            f"per round; need participation * num_clients >= 1"
        )
    model_spec = catalog.MODELS.get(setting["model"])
    fits = registry.fits(setting["model"]) if model_spec else []
    if model_spec and setting["dataset"] not in fits:
        problems.append(
            f"model '{setting['model']}' does not fit dataset '{setting['dataset']}'; it fits: {', '.join(fits)}"
        )
    n_train = catalog.DATASETS[setting["dataset"]]["train_size"]
    if setting["num_clients"] > n_train:
        problems.append(f"num_clients = {setting['num_clients']} exceeds the {n_train} training samples")
    domains = catalog.DATASETS[setting["dataset"]].get("domains")
    if domains and setting["num_clients"] % len(domains):
        problems.append(
            f"num_clients = {setting['num_clients']}: {setting['dataset']} splits each of its "
            f"{len(domains)} domains over its own clients, so num_clients must be a multiple of "
            f"{len(domains)}"
        )
    holdout, spec = setting["evaluation"]["proxy_holdout"], catalog.DATASETS[setting["dataset"]]
    if holdout % spec["num_classes"] or holdout >= spec["test_size"]:
        problems.append(
            f"evaluation.proxy_holdout = {holdout} must be a multiple of the {spec['num_classes']} classes "
            f"of {setting['dataset']} (the hold-out is class-balanced) and smaller than its test set"
        )
    if setting["evaluation"].get("validation") and holdout:
        problems.append(
            f"evaluation.validation = {setting['evaluation']['validation']} with evaluation.proxy_holdout = "
            f"{holdout}: a tuning run scores a validation split of the training data, and the proxy "
            f"methods' hold-out of the test set is not carved from it; tune without a proxy method"
        )
    client = setting["client"]
    if "lr_milestone_factor" in client and not client.get("lr_milestones"):
        problems.append(
            f"client.lr_milestone_factor = {client['lr_milestone_factor']} is given without "
            f"client.lr_milestones, so it would never apply; add the milestones or drop the factor"
        )
    for key in ("rounds", "cosine_rounds"):  # figures: snapshot rounds must lie in the run
        bad = [r for r in setting.get("snapshots", {}).get(key, []) if r == 0 or abs(r) > setting["rounds"]]
        if bad:
            problems.append(f"snapshots.{key} = {bad}: allowed are 1..{setting['rounds']} or -1..-{setting['rounds']}")
    for check in registry.extra_checks(algo, plugins, setting["partition"]["kind"]):
        problems.extend(check(setting))
    if problems:
        raise ConfigError("\n".join(f"{where}: {p}" for p in problems))


def _refuse_unread_pretrained(raw: dict, setting: dict, where: str) -> None:
    """A ``pretrained`` section given for a model that loads no weights would be ignored in silence (one that
    says what the defaults say, as a resolved setting's does, changes nothing)."""
    section = registry.setting_schema()["properties"]["pretrained"]["properties"]
    defaults = {k: sub["default"] for k, sub in section.items()}
    if "pretrained" in raw and raw["pretrained"] != defaults and not catalog.MODELS[setting["model"]].get("pretrained"):
        readers = sorted(name for name, spec in catalog.MODELS.items() if spec.get("pretrained"))
        raise ConfigError(
            f"{where}: pretrained = {_short(json.dumps(raw['pretrained'], sort_keys=True))} is given for "
            f"model '{setting['model']}', which loads no weights; only {', '.join(readers)} read it: "
            f"remove the pretrained key or choose such a model"
        )


def check_data_transforms(setting: dict, where: str) -> None:
    """Long-tailed client data and label swaps, refused where they cannot apply (before pruning drops them)."""
    problems = []
    part = setting["partition"]
    if part.get("long_tail_rho", 1) != 1 and part["kind"] not in catalog.LONG_TAIL_KINDS:
        problems.append(
            f"partition.long_tail_rho = {part['long_tail_rho']} applies to partition kinds "
            f"{', '.join(catalog.LONG_TAIL_KINDS)}, not {part['kind']}"
        )
    evaluation = setting["evaluation"]
    if evaluation.get("proxy_long_tail_rho", 1) != 1 and not evaluation["proxy_holdout"]:
        problems.append(
            f"evaluation.proxy_long_tail_rho = {evaluation['proxy_long_tail_rho']} shapes the proxy "
            f"hold-out, but evaluation.proxy_holdout is 0 (no proxy set)"
        )
    corruption = setting.get("corruption", {})
    if corruption.get("fraction"):
        classes = catalog.DATASETS[setting["dataset"]]["num_classes"]
        a, b = corruption["swap"]
        if a == b or max(a, b) >= classes:
            problems.append(
                f"corruption.swap = {[a, b]}: two different classes of {setting['dataset']}, 0..{classes - 1}"
            )
        if round(corruption["fraction"] * setting["num_clients"]) < 1:
            problems.append(
                f"corruption.fraction = {corruption['fraction']} of {setting['num_clients']} clients "
                f"corrupts none; raise it or drop the section"
            )
    if problems:
        raise ConfigError("\n".join(f"{where}: {p}" for p in problems))


def check_partition_file(setting: dict, where: str) -> None:
    """Kind ``file``: read and check the index lists before any job, and put the file's content hash in the
    setting (the run's and the partition's identity; a changed file is a new partition)."""
    from fedrepro.identity import file_sha256
    from fedrepro.partitions import file as partition_file
    from fedrepro.partitions.base import PartitionError

    part = setting["partition"]
    if "path" not in part:
        raise ConfigError(
            f"{where}: partition.kind = file needs partition.path (an .npz or .json of client index lists)"
        )
    if Path(part["path"]).is_dir():
        raise ConfigError(
            f"{where}: partition.path: {part['path']} is a directory; name the .npz or .json file of "
            f"client index lists in it"
        )
    try:
        digest = file_sha256(part["path"]) if Path(part["path"]).is_file() else None
        partition_file.read_file(
            part["path"], setting["num_clients"], catalog.DATASETS[setting["dataset"]]["train_size"], part.get("sha256")
        )
    except PartitionError as err:
        raise ConfigError(f"{where}: partition.path: {err}") from None
    part["sha256"] = digest
