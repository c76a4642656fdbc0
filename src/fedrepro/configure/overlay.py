"""One command puts a method on a paper's tables: ``--config add_method=trimmedmean`` (or ``add_method:`` in a
params file) adds it to the method axis of every experiment of the params file (``add_method_to``: of those
whose names match these patterns), with the paper's tuning stage.

An experiment's method axis is its ``algorithm`` grid axis, or its ``setting`` axis, when it lists two methods or
more; an experiment without one (an ablation or a figure of one method) is left as it is. Where the experiment tunes
its baselines (``tune`` blocks, fedrepro.configure.tuning), the added method is tuned too, over the search space its
fragment declares (``tune: {<key>: [values]}``), with the budget of the experiment's most-tuned baseline: at
most as many candidates (the first ones, in the fragment's order), the same tuning seeds, criterion, validation
share and plug-ins left out, so that the comparison is fair by construction. A method that declares no search
space runs at its defaults, as a baseline the paper does not tune.
"""

from __future__ import annotations

import copy
import fnmatch

from fedrepro.configure import registry
from fedrepro.configure.schema import ConfigError
from fedrepro.configure.settings import grid_points, split_algorithm
from fedrepro.errors import FedreproError


def names(params: dict, key: str) -> list[str]:
    value = params.get(key) or []
    return [v.strip() for v in (value.split(",") if isinstance(value, str) else value) if v.strip()]


def apply(params: dict, experiments: dict) -> dict:
    """``experiments`` with the added methods on their method axes (copies: grids shared by YAML aliases stay
    apart), or as they are when ``add_method`` is unset."""
    added = names(params, "add_method")
    if not added:
        return experiments
    patterns = names(params, "add_method_to") or ["*"]
    unmatched = [p for p in patterns if not fnmatch.filter(experiments, p)]
    if unmatched:
        raise ConfigError(
            f"add_method_to: {', '.join(unmatched)} matches no experiment; experiments: {', '.join(experiments)}"
        )
    out = {}
    for name, exp in experiments.items():
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            exp = _with_methods(name, copy.deepcopy(exp), added)
        out[name] = exp
    return out


def _with_methods(name: str, exp: dict, added: list[str]) -> dict:
    grid = exp.get("grid", {})
    settings = grid.get("setting") if isinstance(grid.get("setting"), list) else []
    listed = [v["algorithm"] for v in settings if isinstance(v, dict) and "algorithm" in v]
    if isinstance(grid.get("algorithm"), list) and len(grid["algorithm"]) > 1:
        grid["algorithm"] += [a for a in added if a not in grid["algorithm"]]
    elif len(set(listed)) > 1:
        grid["setting"] += [{"algorithm": a} for a in added if a not in listed]
    else:
        return exp  # no method axis (one method): an ablation or a figure of one method
    if exp.get("tune"):
        exp["tune"] = list(exp["tune"]) + [b for a in added for b in _tune_block(name, exp["tune"], a)]
    return exp


def _tune_block(experiment: str, blocks: list[dict], method: str) -> list[dict]:
    """The tune block of ``method`` with the budget of the experiment's most-tuned baseline ([] for a method that
    declares no search space)."""
    base = split_algorithm({"algorithm": method})["algorithm"]
    try:
        registry.admit([base])
    except FedreproError as err:
        raise ConfigError(f"add_method: {err}") from None
    if base not in registry.ALGORITHMS:
        raise ConfigError(
            f"add_method: '{method}' names no method; known: {', '.join(sorted(registry.ALGORITHMS))}, "
            f"or a method of your own package by its entry point or module path"
        )
    space = registry.ALGORITHMS[base].get("tune")
    if not space:
        return []
    reference = max(blocks, key=lambda b: len(grid_points(b["grid"])) * len(b["seeds"]))
    budget = len(grid_points(reference["grid"]))
    candidates = grid_points({key: list(values) for key, values in space.items()})[:budget]
    when = {"algorithm": base, **({"plugins": reference["when"]["plugins"]} if "plugins" in reference["when"] else {})}
    block = {"when": when, "grid": {"setting": candidates}, "seeds": list(reference["seeds"])}
    block.update({k: copy.deepcopy(reference[k]) for k in ("criterion", "validation", "without") if k in reference})
    return [block]
