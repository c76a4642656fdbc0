"""FedGMA (Tenison et al., 2023) as IMA's code runs it: a sign-agreement (AND) mask applied after
FedAvg's weighted mean, with a small server step of its own.

    s      = sum_{i in S} sign(Delta_i)                         (per coordinate; m = |S|)
    M_i    = [sign(Delta_i) agrees with sign(s)] and [|s| > eps * m]
    x_new  = (x - sum_i p_i Delta_i) + eta_gma (1/m) sum_i M_i * Delta_i
    i.e.   d = sum_i p_i Delta_i - eta_gma (1/m) sum_i M_i * Delta_i,   x <- x - eta_g d  (eta_g = 1)

The code treats w_i - x as the "gradient" and subtracts it, so its masked correction moves the model
back toward x on the coordinates every client agrees on; we keep that sign (see docs/algorithms.md).
With eta_gma = 1e-4 the correction is ~1e-5 of the update and FedGMA is FedAvg up to rounding, which
is what IMA's Table 1 shows.
"""

import torch

from fedrepro.parts import Aggregator, Algorithm, RoundUpdates
from fedrepro.server import ServerSGD


class MaskedAveraging(Aggregator):
    def __init__(self, lr: float, threshold: float):
        self.lr, self.threshold = lr, threshold

    def __call__(self, x: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        updates.info["weights"] = updates.weights
        deltas, m = updates.deltas, len(updates.deltas)
        s = torch.sign(deltas).sum(0)
        # the code compares (w_i - x > 0) with (its sign sum > 0): a tie s = 0 is never kept
        # (|s| > eps m fails) and a zero Delta_i adds nothing, so this is "signs agree"
        agree = (deltas < 0) == (s < 0)
        keep = s.abs() > self.threshold * m
        correction = (deltas * (agree & keep)).sum(0) / m
        updates.info["gma_kept"] = keep.float().mean()
        return updates.weighted_mean() - self.lr * correction


def build(setting, ctx) -> Algorithm:
    c = setting["fedgma"]
    return Algorithm("fedgma", MaskedAveraging(c["lr"], c["threshold"]), ServerSGD(setting["server"]["lr"]))
