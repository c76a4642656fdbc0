"""What a setting's rounds are, read by training and by the settings that derive defaults from it: how many
clients a round samples and the client lr of round t without plug-ins. Torch-free, so the settings floor
resolves defaults that depend on them (``ima.cyclic_lr_max: null``) before a run is named, with the very
formula the run trains with."""

from __future__ import annotations

import math


def cohort_size(setting: dict) -> int:
    """Clients a round samples: floor(participation * N), with a margin for participation's binary rounding."""
    return math.floor(setting["participation"] * setting["num_clients"] + 1e-9)


def client_lr(setting: dict, t: int) -> float:
    """The client lr of round t without plug-ins: lr * lr_decay^t, times lr_milestone_factor for every
    fraction in lr_milestones that t has passed (FedNova: /10 at 50% and 75% of the rounds)."""
    c, rounds = setting["client"], setting["rounds"]
    passed = sum(t >= m * rounds for m in c.get("lr_milestones", ()))
    return c["lr"] * c["lr_decay"] ** t * c.get("lr_milestone_factor", 0.1) ** passed
