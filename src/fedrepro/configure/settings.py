"""Settings: one grid point resolved into a complete, checked run setting.

A params file holds ``experiments``; each has a ``base`` setting and ``grid`` axes. A grid point is
deep-merged over the base, filled with the schema's defaults and its derived defaults, pruned to the
sections the run actually uses, and checked. Reading params files is paramsfile.py's, the schema
schema.py's, the cross-key checks checks.py's; expanding whole grids (with tunings and forks) config.py's.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any

from fedrepro import catalog
from fedrepro.configure import conditions, registry
from fedrepro.configure.checks import (
    _refuse_unread_pretrained,
    check_compatible,
    check_data_transforms,
    check_partition_file,
)
from fedrepro.configure.schema import ConfigError, plain_copy, validate
from fedrepro.errors import FedreproError
from fedrepro.identity import partition_id

# --------------------------------------------------------------------------- grids


def deep_merge(base: dict, override: dict) -> dict:
    """A copy of ``base`` with ``override`` merged in, section by section; neither argument is changed."""
    out = plain_copy(base)
    _merge_into(out, override)
    return out


def _merge_into(out: dict, override: dict) -> None:
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            _merge_into(out[key], value)
        else:
            out[key] = plain_copy(value)


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
    """Keep the sections and partition keys this run reads: the sections of other methods and the settings of
    other partition kinds are no part of it. Every key it keeps has its value (defaults filled); which of them
    a run's name hashes is identity.identity_setting's (neutral values left out)."""
    used = registry.sections_used(setting["algorithm"], setting["plugins"])
    out = {k: v for k, v in setting.items() if k not in registry.OPTIONAL_SECTIONS or k in used}
    part = out["partition"]
    out["partition"] = {k: part[k] for k in catalog.PARTITION_KEYS[part["kind"]] if k in part}
    if out["client"]["keep_momentum"] and not out["client"]["momentum"]:
        # nothing to keep: a protocol that keeps momentum buffers applies to the methods that have them
        # (FedLAW's code runs FedProx without momentum), and the run is the one without the key
        out["client"] = {**out["client"], "keep_momentum": False}
    return out


def derive_defaults(setting: dict) -> dict:
    """Defaults that depend on other values, made explicit before the run is named: two settings that
    compute the same run get the same id, and training code reads values instead of re-deriving them.
    Each is written once, as ``null_means`` beside the key in its schema or fragment (an expression of
    fedrepro.configure.conditions over the setting), and resolved in the order the keys are declared."""
    if setting["partition"].get("seed") == "run":
        # a new draw per training seed (FedLAW App. D.4): the run and its partition are named by the number
        setting["partition"] = {**setting["partition"], "seed": setting["seed"]}
    for section, key, expression in _derived(registry.setting_schema()):
        if isinstance(setting.get(section), dict) and key in setting[section] and setting[section][key] is None:
            setting[section] = {**setting[section], key: conditions.evaluate(expression, setting)}
    return setting


def _derived(schema: dict) -> list[tuple[str, str, str]]:
    """(section, key, expression) of every key whose null means a value derived from others."""
    return [
        (section, key, sub["null_means"])
        for section, spec in schema["properties"].items()
        for key, sub in (spec.get("properties") or {}).items()
        if "null_means" in sub
    ]


@dataclass
class Run:
    id: str
    experiment: str
    setting: dict
    variant: dict = field(default_factory=dict)  # the grid values other than the seed
    tuning: str = (
        ""  # the tuning (fedrepro.configure.tuning) whose candidate this run is; "" for an experiment's own run
    )

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


def resolve(raw: dict, where: str = "setting") -> dict:
    """A complete, validated run setting from a partial one: every key the run reads, with its value
    (defaults and derived defaults filled), so training reads it without defaults of its own. Resolving
    a resolved setting gives it back. Its name hashes identity.identity_setting of it."""
    setting = split_algorithm(copy.deepcopy(raw))
    try:  # a method of the user's own package brings its settings fragment, checked against the method API
        registry.admit([setting["algorithm"], *setting["plugins"]])
    except FedreproError as err:
        raise ConfigError(f"{where}: {err}") from None
    validate(setting, "setting.schema.yaml", where)
    _refuse_unread_pretrained(raw, setting, where)
    check_data_transforms(setting, where)
    setting = derive_defaults(prune(setting))
    check_compatible(setting, where)
    if setting["partition"]["kind"] == "file":
        check_partition_file(setting, where)
    return setting


def variant_label(point: dict) -> dict:
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
