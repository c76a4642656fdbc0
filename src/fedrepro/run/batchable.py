"""Whether a model, data set and method can train a round's clients together (``fedrepro.run.batched``).

A method's client term batches when it declares a batched form (``parts.ClientHook.batched_forms``) beside its
sequential one; an objective with per-step or per-epoch work declares their batched forms too. Anything else
trains one client after another.
"""

from __future__ import annotations

from torch import nn

from fedrepro.parts import ClientObjective


def dropout_layers(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]


def unsupported(module: nn.Module, data, corrections, objective) -> list[str]:
    """Why this model, data set and method cannot train batched (empty: they can)."""
    why = []
    if not data.batched_cohort:  # declared by every data set (data.base.Dataset)
        why.append(f"{type(data).__name__} batches cannot be vmapped over")
    if data.augment and not hasattr(data, "augment_draws"):
        why.append(f"{type(data).__name__} augments without drawing its randomness ahead")
    odd = [type(m).__name__ for m in dropout_layers(module) if type(m) is not nn.Dropout]
    if odd:
        why.append(f"dropout layers other than nn.Dropout ({', '.join(odd)})")
    if any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats and m.momentum is None
        for m in module.modules()
    ):
        why.append("a BatchNorm with momentum=None (its average counts the batches of the shared module)")
    for hook in corrections:
        if "step" not in hook.batched_forms:
            why.append(f"{type(hook).__name__} has no batched form")
    if objective is not None:
        if "step" not in objective.batched_forms:
            why.append(f"{type(objective).__name__} has no batched form")
        for name in ("after_step", "end_epoch"):
            if _overrides(objective, name) and name not in objective.batched_forms:
                why.append(f"{type(objective).__name__}.{name} has no batched form")
    return why


FORMS = {
    "step": "batched",
    "begin": "batched_begin",
    "end": "batched_end",
    "after_step": "batched_after_step",
    "end_epoch": "batched_end_epoch",
}


def check_declared(hooks) -> None:
    """Each hook's declared batched forms are forms there are, and it defines them (checked once, when a
    run's batched path is built): a declaration without its method is a bug in the part, named here."""
    for hook in hooks:
        name = type(hook).__name__
        unknown = set(hook.batched_forms) - set(FORMS)
        if unknown:
            raise TypeError(f"{name}.batched_forms names {sorted(unknown)}; the forms are {sorted(FORMS)}")
        missing = [FORMS[f] for f in sorted(hook.batched_forms) if not callable(getattr(hook, FORMS[f], None))]
        if missing:
            raise TypeError(f"{name} declares batched forms it does not define: {', '.join(missing)}")


def _overrides(obj, name: str) -> bool:
    return getattr(type(obj), name) is not getattr(ClientObjective, name)
