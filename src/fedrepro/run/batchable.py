"""Whether a model, data set and method can train a round's clients together (``fedrepro.run.batched``).

A method's client term batches when it has a ``batched`` form beside its sequential one; an objective with
per-step or per-epoch work needs their batched forms too. Anything else trains one client after another.
"""
from __future__ import annotations

from torch import nn

from fedrepro.parts import ClientObjective


def dropout_layers(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]


def unsupported(module: nn.Module, data, corrections, objective) -> list[str]:
    """Why this model, data set and method cannot train batched (empty: they can)."""
    why = []
    if not getattr(data, "batched_cohort", False):
        why.append(f"{type(data).__name__} batches cannot be vmapped over")
    if getattr(data, "augment", False) and not hasattr(data, "augment_draws"):
        why.append(f"{type(data).__name__} augments without drawing its randomness ahead")
    odd = [type(m).__name__ for m in dropout_layers(module) if type(m) is not nn.Dropout]
    if odd:
        why.append(f"dropout layers other than nn.Dropout ({', '.join(odd)})")
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats and m.momentum is None
           for m in module.modules()):
        why.append("a BatchNorm with momentum=None (its average counts the batches of the shared module)")
    for hook in corrections:
        if not hasattr(hook, "batched"):
            why.append(f"{type(hook).__name__} has no batched form")
    if objective is not None:
        if not hasattr(objective, "batched"):
            why.append(f"{type(objective).__name__} has no batched form")
        for name in ("after_step", "end_epoch"):
            if _overrides(objective, name) and not hasattr(objective, f"batched_{name}"):
                why.append(f"{type(objective).__name__}.{name} has no batched form")
    return why


def _overrides(obj, name: str) -> bool:
    return getattr(type(obj), name) is not getattr(ClientObjective, name)
