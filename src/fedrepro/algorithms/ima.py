"""The +ima plug-in (Zhou et al., 2023): from round t_s, the global model is the mean of the last P
aggregated models, and clients start from it.

    w_t  = the host method's new global model of round t (pre-IMA; kept for every round, also before t_s)
    x_{t+1} = (1/P) sum_{i=0}^{P-1} w_{t-i}     for t >= t_s          (rounds 0-indexed, as in the code)

The window holds the host's outputs, never IMA's, so this is a sliding window, not an EMA.
IMA also decays the client lr faster from t_s on (`decay`, the schemes of the paper's Table 3):
  exponential  lr_0 d^t before t_s, lr_0 d^{t_s} r^{t - t_s} after (d = client.lr_decay, r = ima.lr_decay; code)
  constant     ima.constant_lr from t_s on
  cyclic       linear from ima.cyclic_lr_max (the paper's 1e-2; null: the lr at t_s, the code's) down to
               ima.constant_lr within each cycle of ima.cycle_rounds (SWA's shape; the code's formula climbs
               back above its maximum in each cycle's second half, specs/ima.md 1.3 note 1)
  epoch        the lr keeps its schedule; local epochs drop by one every ima.cycle_rounds rounds, floor 1
  none         no extra decay
"""

from __future__ import annotations

import torch

from fedrepro.parts import Algorithm, PostStep, RoundUpdates


class WindowAverage(PostStep):
    state = ("models",)

    def __init__(self, window: int, start: int):
        self.window, self.start = window, start
        self.models: list[torch.Tensor] = []  # oldest first, at most `window`

    def __call__(self, x: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        self.models = self.models[-(self.window - 1) :] if self.window > 1 else []
        self.models.append(x.clone())
        if updates.round < self.start:
            # nothing logged either: before t_s a run is its host's, row for row (its FMA sibling's rounds
            # serve as its own, fedrepro.configure.forks)
            return x
        averaged = torch.stack(self.models).mean(0)
        updates.info["ima_active"] = 1
        updates.info["ima_shift"] = float((averaged - x).norm())
        return averaged

    def start_from_fork(self, history: list[torch.Tensor]) -> None:
        """Forked from the host run at t_s: the host's last P-1 models are those this window would hold."""
        needed = self.window - 1
        if len(history) < needed:
            raise ValueError(
                f"+ima with window {self.window} needs the host's last {needed} models at the fork "
                f"round; the fork state holds {len(history)}"
            )
        self.models = [h.clone() for h in history[len(history) - needed :]] if needed else []


def lr_schedule(base, ima: dict, start: int):
    """The client lr of round t: the host's schedule before t_s, the chosen IMA scheme after."""
    lr_start = base(start)

    def schedule(t: int) -> float:
        if t < start or ima["decay"] in ("none", "epoch"):
            return base(t)
        if ima["decay"] == "exponential":
            return lr_start * ima["lr_decay"] ** (t - start)
        if ima["decay"] == "constant":
            return ima["constant_lr"]
        if ima["decay"] == "cyclic":
            top = ima["cyclic_lr_max"]  # resolved: null is the host's lr at t_s (ima.yaml)
            frac = ((t - start) % ima["cycle_rounds"] + 1) / ima["cycle_rounds"]
            return (1 - frac) * top + frac * ima["constant_lr"]
        raise ValueError(f"ima.decay = {ima['decay']!r} is unknown")

    return schedule


def apply(algorithm: Algorithm, setting, ctx) -> None:
    ima = setting["ima"]
    start = ima["start_round"]  # resolved: null is 0.75 R (ima.yaml)
    algorithm.post_steps.append(WindowAverage(ima["window"], start))
    plan = algorithm.client_plan
    plan.lr_schedule = lr_schedule(plan.lr_of(setting), ima, start)
    if ima["decay"] == "epoch":
        host_epochs = plan.epochs_of(setting)

        def local_epochs(t: int, client_id: int) -> int:
            drop = 0 if t < start else (t - start) // ima["cycle_rounds"]  # first drop at t_s + cycle (code)
            return max(1, host_epochs(t, client_id) - drop)

        plan.local_epochs = local_epochs
