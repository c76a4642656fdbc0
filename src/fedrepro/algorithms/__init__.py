"""Methods as presets of parts. Each module ``<name>.py`` defines ``build(setting, ctx)``;
each plug-in module defines ``apply(algorithm, setting, ctx)``."""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from fedrepro.parts import Algorithm


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
    for plugin in setting["plugins"]:
        _module(plugin, "plug-in").apply(algorithm, setting, ctx)
    return algorithm


def _module(name: str, kind: str):
    # settings are validated against the registry before any run; this guards direct library use
    # without importing the registry, so that editing it changes no run's code hash
    try:
        return importlib.import_module(f"fedrepro.algorithms.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"fedrepro.algorithms.{name}":
            raise
        raise ValueError(f"unknown {kind} '{name}'") from None
