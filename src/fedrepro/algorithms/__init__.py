"""Methods as presets of parts. Each module ``<name>.py`` defines ``build(setting, ctx)``;
each plug-in module defines ``apply(algorithm, setting, ctx)``. A method of the user's own package is found
by fedrepro.external and built the same way; what any build returns is checked against the API (``built``)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from fedrepro import external
from fedrepro.external import MethodError
from fedrepro.parts import (
    Aggregator,
    Algorithm,
    ClientObjective,
    ClientPlan,
    GradientCorrection,
    PostStep,
    ServerOptimizer,
)


@dataclass
class BuildContext:
    """What a method may need to know about the run when it is built; methods never see the engine."""

    num_clients: int
    dim: int
    device: torch.device
    client_sizes: torch.Tensor
    # the run's model, whose parameters are views of the flat global vector: for methods that run it on the
    # server (FedLAW's functional forward, the distillation baselines) or read its layers (FedFA's classifier)
    module: torch.nn.Module | None = None
    # the comparison's held-out proxy samples (evaluation.proxy_holdout) as (inputs, labels) on the
    # device, or None; every run of the comparison is scored on the test set without them
    proxy: tuple[torch.Tensor, torch.Tensor] | None = None


def build(setting: dict, num_clients: int, dim: int, device, client_sizes, module=None, proxy=None) -> Algorithm:
    """``module``: the run's model; ``proxy``: the held-out proxy dataset (``engine.split_test``) or None."""
    samples = None if proxy is None else proxy.batch(torch.arange(len(proxy), device=proxy.labels.device))
    ctx = BuildContext(num_clients, dim, device, client_sizes, module, samples)
    algorithm = _module(setting["algorithm"], "algorithm").build(setting, ctx)
    built(algorithm, setting["algorithm"])
    for plugin in setting["plugins"]:
        _module(plugin, "plug-in").apply(algorithm, setting, ctx)
        built(algorithm, f"+{plugin}")
    return algorithm


def built(algorithm, by: str) -> None:
    """What a method's build (or a plug-in's apply) left is a method of the API: each part of its kind, the client
    plan a ClientPlan, the parts' names distinct (the one-line error names the method and the part)."""
    problems = []
    if not isinstance(algorithm, Algorithm):
        raise MethodError(f"'{by}': build returned {type(algorithm).__name__}, not a fedrepro.api.Algorithm")
    for field, kind in (("aggregator", Aggregator), ("optimizer", ServerOptimizer), ("client_plan", ClientPlan)):
        if not isinstance(getattr(algorithm, field), kind):
            problems.append(f"{field} is a {type(getattr(algorithm, field)).__name__}, not a {kind.__name__}")
    for field, kind in (("corrections", GradientCorrection), ("post_steps", PostStep)):
        problems += [
            f"{field}[{i}] is a {type(p).__name__}, not a {kind.__name__}"
            for i, p in enumerate(getattr(algorithm, field))
            if not isinstance(p, kind)
        ]
    if algorithm.objective is not None and not isinstance(algorithm.objective, ClientObjective):
        problems.append(f"objective is a {type(algorithm.objective).__name__}, not a ClientObjective")
    if problems:
        raise MethodError(f"'{by}' does not build a method of the API: {'; '.join(problems)} (docs/methods.md)")
    algorithm.parts()  # two parts of one name are refused there


def _module(name: str, kind: str):
    # settings are validated against the registry before any run; this guards direct library use
    # without importing the registry, so that editing it changes no run's code hash
    outside = external.find(name)  # a method of the user's own package (an entry point or a module path)
    if outside is not None:
        return importlib.import_module(outside.module)
    try:
        return importlib.import_module(f"fedrepro.algorithms.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"fedrepro.algorithms.{name}":
            raise
        raise ValueError(f"unknown {kind} '{name}'") from None
