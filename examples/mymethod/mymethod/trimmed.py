"""Coordinate-wise trimmed mean of the cohort's updates (Yin et al., 2018), with FedAvg's server step.

    d_j = mean of the client updates' coordinate j without its floor(beta K) largest and smallest values
    x <- x - eta_g d

beta = trimmedmean.fraction (0: the plain mean over the cohort).
"""

import torch

from fedrepro import api

API_VERSION = 1


class TrimmedMean(api.Aggregator):
    name = "trimmed_mean"

    def __init__(self, fraction: float):
        self.fraction = fraction

    def __call__(self, x: torch.Tensor, updates: api.RoundUpdates) -> torch.Tensor:
        k = len(updates.deltas)
        cut = int(self.fraction * k)
        if cut == 0 or k - 2 * cut < 1:
            return updates.deltas.mean(0)
        ordered = updates.deltas.sort(dim=0).values
        updates.info["trimmed_per_side"] = cut
        return ordered[cut : k - cut].mean(0)


def build(setting, ctx: api.BuildContext) -> api.Algorithm:
    return api.Algorithm(
        "trimmedmean", TrimmedMean(setting["trimmedmean"]["fraction"]), api.ServerSGD(setting["server"]["lr"])
    )
