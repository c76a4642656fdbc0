"""Methods as presets of parts. Each module ``<name>.py`` defines ``build(setting, ctx)``;
each plug-in module defines ``apply(algorithm, setting, ctx)``."""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from fedrepro.parts import Algorithm


@dataclass
class BuildContext:
    """What a method may need to know about the run when it is built."""
    num_clients: int
    dim: int
    device: torch.device
    client_sizes: torch.Tensor
    trainer: object = None  # the engine, for methods that evaluate or train on the server (FedLAW)


def build(setting: dict, num_clients: int, dim: int, device, client_sizes, context=None) -> Algorithm:
    ctx = BuildContext(num_clients, dim, device, client_sizes, context)
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
