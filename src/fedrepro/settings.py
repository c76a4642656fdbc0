"""Settings: params files read and validated, one grid point resolved into a complete, checked run setting.

A params file holds ``experiments``; each has a ``base`` setting and ``grid`` axes. A grid point is
deep-merged over the base, filled with the schema's defaults and its derived defaults, pruned to the
sections the run actually uses, and checked. Expanding whole grids (with tunings and forks, which build on
this module) is config.py's.
"""
from __future__ import annotations

import copy
import functools
import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from fedrepro import registry
# reading the project's JSON records has its own light module, below training code (config is above it)
from fedrepro.records import CorruptFileError, read_json  # noqa: F401
# a run's identity (names, hashes, the code it runs) has its own light module
from fedrepro.catalog import cohort_size  # noqa: F401  (plan reads it from here)
from fedrepro.identity import partition_id, partition_setting, run_id, stable_hash  # noqa: F401
from fedrepro.errors import FedreproError

ROOT = Path(__file__).resolve().parents[2]


class ConfigError(FedreproError, ValueError):
    """A params file that cannot run; the message names the key, the value and what is allowed."""


# --------------------------------------------------------------------------- schema


def _load_schema(name: str) -> dict:
    if name == "setting.schema.yaml":
        return registry.setting_schema()  # the core file plus every method's settings fragment
    return _parsed_schema(name, (registry.SCHEMAS / name).stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _parsed_schema(name: str, mtime_ns: int) -> dict:
    # Parsing the schema took ~0.1 s per run; a grid of 800 runs spent a minute here. Keyed by
    # mtime so an edited schema is read again. Validation never mutates the schema.
    return yaml.safe_load((registry.SCHEMAS / name).read_text())


def _with_defaults(validator_class):
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_Validator = _with_defaults(jsonschema.Draft202012Validator)


def _explain(error: jsonschema.ValidationError, where: str) -> str:
    path = [str(p) for p in error.absolute_path]
    if error.validator == "additionalProperties":
        # Name the unknown key itself, not the whole mapping that holds it (a setting printed in
        # full per grid point buried the error under 92 KB of defaults).
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        lines = []
        for key in unknown:
            guess = closest(key, allowed)
            hint = f"; did you mean {guess}?" if guess else ""
            lines.append(f"{where}: unknown setting '{'.'.join([*path, key])}'{hint} allowed keys"
                         f"{' of ' + '.'.join(path) if path else ''}: {', '.join(allowed)}")
        if lines:
            return "\n".join(lines)
    key = ".".join(path) or "(top level)"
    return f"{where}: setting '{key}' = {_short(error.instance)} is not allowed: {_allowed(error)}"


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def closest(word: str, choices: list[str]) -> str | None:
    """The allowed key a typo most likely meant: one sharing a whole word (``clients_per_round`` ->
    ``num_clients``), else the nearest spelling."""
    import difflib

    words = set(word.lower().split("_"))
    sharing = [c for c in choices if words & set(c.lower().split("_"))]
    if sharing:
        return max(sharing, key=lambda c: difflib.SequenceMatcher(None, word, c).ratio())
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return match[0] if match else None


def _allowed(error: jsonschema.ValidationError) -> str:
    kind, value = error.validator, error.validator_value
    if kind == "enum":
        return "must be one of " + ", ".join(map(str, value))
    if kind == "exclusiveMinimum":
        return f"must be > {value}"
    if kind == "minimum":
        return f"must be >= {value}"
    if kind == "exclusiveMaximum":
        return f"must be < {value}"
    if kind == "maximum":
        return f"must be <= {value}"
    if kind == "type":
        return f"must be of type {value}"
    if kind == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        return f"{error.message}; allowed keys: {', '.join(allowed)}"
    if kind == "const":
        return f"must be {value!r}"
    if kind in ("anyOf", "oneOf") and error.context:
        # one line naming every form the key takes (partition.seed: an integer in range, or 'run')
        return " or ".join(dict.fromkeys(_allowed(e) for e in error.context))
    return error.message


# A schema whose top level is only a list of properties validates each top-level value on its own: the
# walk over every method's section took ~13 ms a setting, and expanding the papers' grids (thousands of
# settings, at every Snakemake start) spent minutes there. Most values recur (an absent section's
# defaults, a grid's shared client section), so each (key, value) is walked once per process.
_TOP_LEVEL_ONLY = {"$schema", "description", "title", "type", "additionalProperties", "properties", "required"}
_checked_parts: dict[int, tuple[dict, dict, bool]] = {}  # id(schema) -> (schema, kept alive so ids stay unique;
#                                                         memo; whether it holds a $ref)


def _valid_by_parts(instance: Any, schema: dict) -> bool:
    """True, with ``instance`` filled exactly as the full walk fills it, when it is valid; False (and
    ``instance`` untouched) when it is not or the schema is not of that shape: the full walk then decides."""
    if not isinstance(instance, dict) or set(schema) - _TOP_LEVEL_ONLY or schema.get("type", "object") != "object":
        return False
    if id(schema) not in _checked_parts:
        # a part checked on its own cannot resolve a reference into the whole: such a schema takes the whole walk
        _checked_parts[id(schema)] = (schema, {}, '"$ref"' in json.dumps(schema))
    _, memo, refers = _checked_parts[id(schema)]
    if refers:
        return False
    properties = schema.get("properties", {})
    if schema.get("additionalProperties", True) is not True and (
            schema["additionalProperties"] is not False or set(instance) - set(properties)):
        return False
    if any(key not in instance for key in schema.get("required", [])):
        return False
    filled = {}
    for key, sub in properties.items():
        if key in instance:
            value = instance[key]
        elif "default" in sub:
            value = sub["default"]
        else:
            continue
        token = (key, repr(value))  # repr keeps types (1, 1.0, True) and key order apart
        if token not in memo:
            value = copy.deepcopy(value)
            if next(_Validator(sub).iter_errors(value), None) is not None:
                return False
            memo[token] = value
        filled[key] = copy.deepcopy(memo[token])
    for key, value in filled.items():
        held = instance.get(key)
        if isinstance(held, dict) and isinstance(value, dict):
            held.clear()  # in place, as the full walk fills: a caller's reference to the section stays live
            held.update(value)
        else:
            instance[key] = value
    return True


def validate(instance: dict, schema_name: str, where: str) -> dict:
    """Validate ``instance`` in place (filling defaults); raise ConfigError naming the key."""
    refuse_nonfinite(instance, where)
    schema = _load_schema(schema_name)
    if _valid_by_parts(instance, schema):
        return instance
    errors = sorted(_Validator(schema).iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        raise ConfigError("\n".join(dict.fromkeys(_explain(e, where) for e in errors)))
    return instance


def refuse_nonfinite(value: Any, where: str, key: str = "") -> None:
    """NaN and infinity pass every ``minimum`` of a JSON schema (all comparisons with NaN are false):
    refuse them wherever they appear, naming the key."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: setting '{key or '(top level)'}' = {value} is not allowed: must be a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            refuse_nonfinite(v, where, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            refuse_nonfinite(v, where, f"{key}[{i}]")


# --------------------------------------------------------------------------- grids


def deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _nest(dotted: str, value: Any) -> dict:
    out: Any = value
    for part in reversed(dotted.split(".")):
        out = {part: out}
    return out


def grid_points(grid: dict[str, list]) -> list[dict]:
    """Cartesian product of the axes; an axis key may be dotted (``partition.alpha``).

    The axis ``setting`` takes partial settings merged at the top level, for values that must
    change together (e.g. ``{algorithm: fedadam, server: {lr: 0.01}}`` next to ``{algorithm: fedavg}``).
    """
    axes = list(grid.items())
    points = []
    for combo in itertools.product(*(values for _, values in axes)):
        point: dict = {}
        for (key, _), value in zip(axes, combo):
            point = deep_merge(point, value if key == "setting" else _nest(key, value))
        points.append(point)
    return points


def split_algorithm(setting: dict) -> dict:
    """``fedavg+ima+aware`` in the algorithm key is the algorithm plus its plug-ins."""
    name, *plugins = str(setting.get("algorithm", "fedavg")).split("+")
    setting["algorithm"] = name
    setting["plugins"] = sorted(set(setting.get("plugins", [])) | set(plugins))
    return setting


# --------------------------------------------------------------------------- resolution


def prune(setting: dict) -> dict:
    """Keep only the sections and keys this run uses, so unrelated defaults do not change its hash."""
    used = registry.sections_used(setting["algorithm"], setting["plugins"])
    out = {k: v for k, v in setting.items() if k not in registry.OPTIONAL_SECTIONS or k in used}
    part = out["partition"]
    out["partition"] = {k: part[k] for k in registry.PARTITION_KEYS[part["kind"]] if k in part}
    if out["partition"].get("long_tail_rho") == 1:
        del out["partition"]["long_tail_rho"]  # the whole training set: the partition's identity is unchanged
    if not out.get("hessian", {}).get("every"):
        out.pop("hessian", None)  # off: the run's identity is unchanged
    if not out.get("log_cohort_classes"):
        out.pop("log_cohort_classes", None)  # off: the run's identity is unchanged
    if not out.get("corruption", {}).get("fraction"):
        out.pop("corruption", None)  # no corrupted client: the run's identity is unchanged
    if not registry.DATASETS[out["dataset"]].get("preprocess"):
        out.pop("preprocess", None)  # only CIFAR has per-paper transforms
    if not registry.MODELS[out["model"]].get("pretrained"):
        out.pop("pretrained", None)  # only pretrained models (Pythia) read a weights path and a token length
    if not registry.MODELS[out["model"]].get("batchnorm"):
        out.pop("batchnorm", None)  # only BatchNorm models read running_stats / batch_stats
    if out["client"].get("keep_momentum") and not out["client"]["momentum"]:
        # nothing to keep: a protocol that keeps momentum buffers applies to the methods that have them
        # (FedLAW's code runs FedProx without momentum), and the run is the one without the key
        out["client"] = {**out["client"], "keep_momentum": False}
    if not out["evaluation"].get("validation"):
        # scored on the test set, as every run before the tuning stage: the run's identity is unchanged
        out["evaluation"] = {k: v for k, v in out["evaluation"].items() if k != "validation"}
    if not any(out.get("snapshots", {}).get(k) for k in ("rounds", "cosine_rounds")):
        out.pop("snapshots", None)  # figures: no snapshots asked, so the run's identity is unchanged
    return out


def derive_defaults(setting: dict) -> dict:
    """Defaults that depend on other values, made explicit before the run is named: two settings that
    compute the same run get the same id, and training code reads values instead of re-deriving them."""
    if setting["partition"].get("seed") == "run":
        # a new draw per training seed (FedLAW App. D.4): the run and its partition are named by the number
        setting["partition"] = {**setting["partition"], "seed": setting["seed"]}
    if "ima" in setting and setting["ima"].get("start_round") is None:
        setting["ima"] = {**setting["ima"], "start_round": registry.ima_start_round(setting)}  # 0.75 R
    return setting


def check_compatible(setting: dict, where: str) -> None:
    """Refuse combinations that cannot work together, before any job starts."""
    problems = []
    algo, plugins = setting["algorithm"], setting["plugins"]
    if algo not in registry.ALGORITHMS:
        problems.append(f"algorithm '{algo}' is unknown; known: {', '.join(sorted(registry.ALGORITHMS))}")
    for plugin in plugins:
        if plugin not in registry.PLUGINS:
            problems.append(f"plug-in '+{plugin}' is unknown; known: {', '.join('+' + p for p in sorted(registry.PLUGINS))}")
        elif algo in registry.PLUGINS[plugin].get("refuses", ()):
            problems.append(f"'+{plugin}' cannot be combined with algorithm '{algo}': {registry.PLUGINS[plugin]['refuses'][algo]}")
    if cohort_size(setting) < 1:
        problems.append(
            f"participation = {setting['participation']} with num_clients = {setting['num_clients']} samples no client "
            f"per round; need participation * num_clients >= 1")
    model_spec = registry.MODELS.get(setting["model"])
    if model_spec and setting["dataset"] not in model_spec["datasets"]:
        problems.append(f"model '{setting['model']}' does not fit dataset '{setting['dataset']}'; it fits: "
                        f"{', '.join(model_spec['datasets'])}")
    part = setting["partition"]
    n_train = registry.DATASETS[setting["dataset"]]["train_size"]
    natural = registry.DATASETS[setting["dataset"]].get("natural_clients")
    if part["kind"] == "natural" and natural is None:
        problems.append(f"partition.kind = natural needs a dataset with its own clients; "
                        f"'{setting['dataset']}' has none")
    elif part["kind"] == "natural" and setting["num_clients"] != natural:
        problems.append(f"partition.kind = natural: {setting['dataset']} has {natural} clients, "
                        f"num_clients = {setting['num_clients']}")
    if setting["num_clients"] > n_train:
        problems.append(f"num_clients = {setting['num_clients']} exceeds the {n_train} training samples")
    domains = registry.DATASETS[setting["dataset"]].get("domains")
    if domains and setting["num_clients"] % len(domains):
        problems.append(f"num_clients = {setting['num_clients']}: {setting['dataset']} splits each of its "
                        f"{len(domains)} domains over its own clients, so num_clients must be a multiple of "
                        f"{len(domains)}")
    if part["kind"] == "label_quantity" and part["classes_per_client"] > registry.DATASETS[setting["dataset"]]["num_classes"]:
        problems.append(f"partition.classes_per_client = {part['classes_per_client']} exceeds the "
                        f"{registry.DATASETS[setting['dataset']]['num_classes']} classes of {setting['dataset']}")
    if part["kind"] == "shards":
        shards = setting["num_clients"] * part["classes_per_client"]
        if shards > n_train:
            problems.append(f"partition.classes_per_client = {part['classes_per_client']} with num_clients = "
                            f"{setting['num_clients']} asks for {shards} shards, more than the {n_train} samples")
        n_classes = registry.DATASETS[setting["dataset"]]["num_classes"]
        if part["classes_per_client"] > n_classes:
            problems.append(f"partition.classes_per_client = {part['classes_per_client']} exceeds the "
                            f"{n_classes} classes of {setting['dataset']}")
    if part["kind"] == "pachinko":
        if setting["dataset"] != "cifar100":
            problems.append(f"partition.kind = pachinko needs coarse labels; only cifar100 has them, not "
                            f"'{setting['dataset']}'")
        per = part["samples_per_client"]
        if per is not None and per * setting["num_clients"] > n_train:
            problems.append(f"partition.samples_per_client = {per} for {setting['num_clients']} clients needs "
                            f"{per * setting['num_clients']} samples, more than the {n_train} of {setting['dataset']}")
    if part["kind"] == "hybrid" and setting["num_clients"] < 2:
        problems.append(f"partition.kind = hybrid splits the clients into two groups: num_clients must be >= 2, "
                        f"not {setting['num_clients']}")
    if part["kind"] in ("dirichlet", "hybrid") and part["min_size"] * setting["num_clients"] > n_train:
        problems.append(f"partition.min_size = {part['min_size']} for {setting['num_clients']} clients needs more "
                        f"than the {n_train} samples")
    holdout, spec = setting["evaluation"]["proxy_holdout"], registry.DATASETS[setting["dataset"]]
    if holdout % spec["num_classes"] or holdout >= spec["test_size"]:
        problems.append(f"evaluation.proxy_holdout = {holdout} must be a multiple of the {spec['num_classes']} classes "
                        f"of {setting['dataset']} (the hold-out is class-balanced) and smaller than its test set")
    if setting["evaluation"].get("validation") and holdout:
        problems.append(f"evaluation.validation = {setting['evaluation']['validation']} with evaluation.proxy_holdout = "
                        f"{holdout}: a tuning run scores a validation split of the training data, and the proxy "
                        f"methods' hold-out of the test set is not carved from it; tune without a proxy method")
    client = setting["client"]
    if "lr_milestone_factor" in client and not client.get("lr_milestones"):
        problems.append(f"client.lr_milestone_factor = {client['lr_milestone_factor']} is given without "
                        f"client.lr_milestones, so it would never apply; add the milestones or drop the factor")
    for key in ("rounds", "cosine_rounds"):  # figures: snapshot rounds must lie in the run
        bad = [r for r in setting.get("snapshots", {}).get(key, []) if r == 0 or abs(r) > setting["rounds"]]
        if bad:
            problems.append(f"snapshots.{key} = {bad}: allowed are 1..{setting['rounds']} or -1..-{setting['rounds']}")
    for check in registry.extra_checks(algo, plugins):
        problems.extend(check(setting))
    if problems:
        raise ConfigError("\n".join(f"{where}: {p}" for p in problems))














@dataclass
class Run:
    id: str
    experiment: str
    setting: dict
    variant: dict = field(default_factory=dict)  # the grid values other than the seed
    tuning: str = ""  # the tuning (fedrepro.tuning) whose candidate this run is; "" for an experiment's own run

    @property
    def partition(self) -> str:
        return partition_id(self.setting)

    @property
    def label(self) -> str:
        """A short name of the grid point without its seed, e.g. ``fedavg+ima · dir0.1 · client.lr=0.01``."""
        parts, partition_shown = [], False
        for key, value in self.variant.items():
            if key == "algorithm":
                parts.append(str(value))
            elif key.startswith("partition"):
                if not partition_shown:
                    parts.append(partition_id(self.setting).split("-")[1])
                    partition_shown = True
            else:
                parts.append(f"{key}={value}")
        return " · ".join(parts) or "+".join([self.setting["algorithm"], *self.setting["plugins"]])


def _refuse_unread_pretrained(raw: dict, setting: dict, where: str) -> None:
    """A ``pretrained`` section given for a model that loads no weights would be dropped in silence."""
    if "pretrained" in raw and not registry.MODELS[setting["model"]].get("pretrained"):
        readers = sorted(name for name, spec in registry.MODELS.items() if spec.get("pretrained"))
        raise ConfigError(f"{where}: pretrained = {_short(json.dumps(raw['pretrained'], sort_keys=True))} is given for "
                          f"model '{setting['model']}', which loads no weights; only {', '.join(readers)} read it: "
                          f"remove the pretrained key or choose such a model")
def check_data_transforms(setting: dict, where: str) -> None:
    """Long-tailed client data and label swaps, refused where they cannot apply (before pruning drops them)."""
    problems = []
    part = setting["partition"]
    if part.get("long_tail_rho", 1) != 1 and part["kind"] not in registry.LONG_TAIL_KINDS:
        problems.append(f"partition.long_tail_rho = {part['long_tail_rho']} applies to partition kinds "
                        f"{', '.join(registry.LONG_TAIL_KINDS)}, not {part['kind']}")
    evaluation = setting["evaluation"]
    if evaluation.get("proxy_long_tail_rho", 1) != 1 and not evaluation["proxy_holdout"]:
        problems.append(f"evaluation.proxy_long_tail_rho = {evaluation['proxy_long_tail_rho']} shapes the proxy "
                        f"hold-out, but evaluation.proxy_holdout is 0 (no proxy set)")
    corruption = setting.get("corruption", {})
    if corruption.get("fraction"):
        classes = registry.DATASETS[setting["dataset"]]["num_classes"]
        a, b = corruption["swap"]
        if a == b or max(a, b) >= classes:
            problems.append(f"corruption.swap = {[a, b]}: two different classes of {setting['dataset']}, 0..{classes - 1}")
        if round(corruption["fraction"] * setting["num_clients"]) < 1:
            problems.append(f"corruption.fraction = {corruption['fraction']} of {setting['num_clients']} clients "
                            f"corrupts none; raise it or drop the section")
    if problems:
        raise ConfigError("\n".join(f"{where}: {p}" for p in problems))


def resolve(raw: dict, where: str = "setting") -> dict:
    """A complete, validated, pruned run setting from a partial one."""
    setting = split_algorithm(copy.deepcopy(raw))
    validate(setting, "setting.schema.yaml", where)
    _refuse_unread_pretrained(raw, setting, where)  # before prune drops the section
    check_data_transforms(setting, where)
    setting = derive_defaults(prune(setting))
    check_compatible(setting, where)
    if setting["partition"]["kind"] == "file":
        check_partition_file(setting, where)
    return setting


def check_partition_file(setting: dict, where: str) -> None:
    """Kind ``file``: read and check the index lists before any job, and put the file's content hash in the
    setting (the run's and the partition's identity; a changed file is a new partition)."""
    from fedrepro import partition
    from fedrepro.identity import file_sha256

    part = setting["partition"]
    if "path" not in part:
        raise ConfigError(f"{where}: partition.kind = file needs partition.path (an .npz or .json of client index lists)")
    if Path(part["path"]).is_dir():
        raise ConfigError(f"{where}: partition.path: {part['path']} is a directory; name the .npz or .json file of "
                          f"client index lists in it")
    try:
        digest = file_sha256(part["path"]) if Path(part["path"]).is_file() else None
        partition.read_file(part["path"], setting["num_clients"], registry.DATASETS[setting["dataset"]]["train_size"],
                            part.get("sha256"))
    except partition.PartitionError as err:
        raise ConfigError(f"{where}: partition.path: {err}") from None
    part["sha256"] = digest


def _variant_label(point: dict) -> dict:
    flat = {}

    def walk(prefix: str, value: Any):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat[prefix] = value

    walk("", point)
    flat.pop("seed", None)
    return flat


# Names that become file names and reach shell commands: experiments (report figures), params files
# (reports, logs), runs. A safe set means no quoting mistake can turn one into a command or a path
# outside its folder.
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
SAFE_EXPERIMENT = re.compile(r"[A-Za-z0-9_]+")


def check_name(name: str, what: str, pattern: re.Pattern = SAFE_NAME) -> str:
    if not isinstance(name, str) or not pattern.fullmatch(name) or ".." in name:
        raise ConfigError(f"{what} {name!r} is not allowed: use letters, digits and "
                          f"{'_' if pattern is SAFE_EXPERIMENT else '_ . + -'} only")
    return name


def data_root(params: dict) -> str:
    """``data.root``, refused when it would put data outside the project without saying so: empty
    (``/fmnist`` at the file system root), or relative and climbing out with ``..``. An absolute path
    is the user's explicit choice. Braces would be read as Snakemake wildcards."""
    root = params.get("data", {}).get("root", "data")
    problem = None
    if not isinstance(root, str) or not root.strip():
        problem = "must name a folder (empty would write at the file system root)"
    elif any(c in root for c in "{}\n\r\0"):
        problem = "must not contain braces, newlines or NUL"
    elif not os.path.isabs(root) and os.path.normpath(root).split(os.sep)[0] == "..":
        problem = "a relative path must stay inside the project; give an absolute path to go elsewhere"
    if problem:
        raise ConfigError(f"setting 'data.root' = {root!r} is not allowed: {problem}")
    return root


def selected_experiments(params: dict) -> dict:
    """The experiments ``only`` names (exact names or shell patterns such as ``ima_table1_*``);
    all of them when ``only`` is absent. ``only`` comes from the file or from ``--config only=a,b``."""
    import fnmatch

    only = params.get("only")
    if not only:
        return dict(params["experiments"])
    patterns = [p.strip() for p in (only.split(",") if isinstance(only, str) else only) if p.strip()]
    unmatched = [p for p in patterns if not fnmatch.filter(params["experiments"], p)]
    if unmatched:
        raise ConfigError(f"only: {', '.join(unmatched)} matches no experiment; experiments: "
                          f"{', '.join(params['experiments'])}")
    return {name: exp for name, exp in params["experiments"].items()
            if any(fnmatch.fnmatchcase(name, p) for p in patterns)}


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe subset, refusing a key given twice in one mapping (YAML says it is an error;
    PyYAML lets the last one win silently)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` then an override is no repeat
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"key '{key}' is given twice", key_node.start_mark)
            seen[key] = key_node
        return super().construct_mapping(node, deep)


# A params file is a few hundred values; aliases may repeat a block, but not blow it up to millions.
MAX_YAML_NODES = 100_000


def _expanded_size(root: yaml.Node, path: Path) -> int:
    """The number of values the document has once every alias is expanded, counted over the node graph
    (each distinct node once, so an alias bomb costs no more than its text); an alias inside the block it
    names (a cycle) or an expansion beyond MAX_YAML_NODES is a ConfigError before anything is built."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:  # iterative: a deep document must not hit Python's recursion limit either
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = 1
            continue
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else node.value
        if children_done:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[key] > MAX_YAML_NODES:
                raise ConfigError(f"{path}, line {node.start_mark.line + 1}: its aliases expand to more than "
                                  f"{MAX_YAML_NODES} values (an alias bomb?); write the values out or repeat fewer")
            continue
        if key in open_nodes:
            raise ConfigError(f"{path}, line {node.start_mark.line + 1}: an alias refers to a block that contains "
                              f"it (a recursive alias, e.g. `&a [*a]`); a params file must be a tree")
        open_nodes.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in open_nodes:
                raise ConfigError(f"{path}, line {child.start_mark.line + 1}: an alias refers to a block that "
                                  f"contains it (a recursive alias, e.g. `&a [*a]`); a params file must be a tree")
            stack.append((child, False))
    return sizes[id(root)]


def read_yaml(path: str | Path) -> Any:
    """A params file's content; a file that cannot be read or parsed is a ConfigError naming it and the line."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot be read: {err}") from None
    try:
        loader = _StrictLoader(text)
        try:
            root = loader.get_single_node()
            if root is not None:
                _expanded_size(root, path)
            content = None if root is None else loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f", line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{path}{line}: not a valid params file (plain YAML, no Python tags): {problem}") from None
    if isinstance(content, dict) and "__use_yte__" in content:
        raise ConfigError(f"{path}: '__use_yte__' asks for YTE templating, which runs Python code while the file "
                          f"is loaded; fedrepro refuses templated params files")
    return content


def load_params(path: str | Path) -> dict:
    path = Path(path)
    params = read_yaml(path)
    if not isinstance(params, dict):
        raise ConfigError(f"{path}: expected a mapping with 'experiments'")
    return validate(params, "params.schema.yaml", str(path))


def load_params_files(paths: list[str | Path]) -> dict:
    """Params files merged in order as Snakemake merges several --configfile (mappings key by key,
    lists replace), validated as a whole: a subset file need not be a complete params file."""
    params: dict = {}
    for path in paths:
        if not params:
            params = load_params(path)
            continue
        extra = read_yaml(path)
        if not isinstance(extra, dict):
            raise ConfigError(f"{path}: expected a mapping")
        params = deep_merge(params, extra)
    return validate(params, "params.schema.yaml", " ".join(str(p) for p in paths))
