"""Models by name, with the exact layers of the papers' code (see docs/algorithms.md for sources).

A family is a module and its fragment: ``models/<family>.py`` holds the classes and ``BUILDERS`` (name ->
builder), ``models/<family>.yaml`` the facts of each model (fedrepro.catalog). ``build`` finds a model's
family from the fragments and imports only that module (Pythia's brings transformers' model code).
"""

from __future__ import annotations

import importlib

from torch import nn

from fedrepro.catalog import DATASETS, MODELS


def build(name: str, dataset: str, pretrained: dict | None = None, batchnorm: str = "running_stats") -> nn.Module:
    """``pretrained`` (the setting's section: weights path) is read by pretrained models only,
    ``batchnorm`` (running_stats | batch_stats) by models with BatchNorm only."""
    if name not in MODELS:
        raise ValueError(f"unknown model '{name}'; known: {', '.join(sorted(MODELS))}")
    facts = MODELS[name]
    options = {}
    if facts.get("batchnorm"):
        if batchnorm not in ("running_stats", "batch_stats"):
            raise ValueError(f"batchnorm = {batchnorm!r}; allowed: running_stats, batch_stats")
        options["running_stats"] = batchnorm == "running_stats"
    if facts.get("pretrained"):
        options["pretrained"] = pretrained
    builder = importlib.import_module(f"{__name__}.{facts['family']}").BUILDERS[name]
    return builder(DATASETS[dataset]["shape"], DATASETS[dataset]["num_classes"], **options)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
