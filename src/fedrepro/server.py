"""Server parts shared by several methods: the data-size weighted mean and SGD with eta_g."""

from __future__ import annotations

import torch

from fedrepro.parts import Aggregator, RoundUpdates, ServerOptimizer


class WeightedMean(Aggregator):
    """FedAvg: d = sum_i (n_i / sum_j n_j) Delta_i over the cohort."""

    def __call__(self, x: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        updates.info["weights"] = updates.weights
        return updates.weighted_mean()


class UniformMean(Aggregator):
    """d = (1/|S|) sum_i Delta_i over the cohort (SCAFFOLD's and FedDyn's papers and codes)."""

    def __call__(self, x: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        updates.info["weights"] = torch.full_like(updates.sizes, 1.0 / len(updates.sizes))
        return updates.deltas.mean(0)


class ServerSGD(ServerOptimizer):
    """x <- x - eta_g * v with v = beta * v + d (FedAvgM when beta > 0; no dampening)."""

    state = ("velocity",)

    def __init__(self, lr: float = 1.0, momentum: float = 0.0):
        self.lr, self.momentum = lr, momentum
        self.velocity: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, d: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        if self.momentum:
            self.velocity = d.clone() if self.velocity is None else self.velocity.mul_(self.momentum).add_(d)
            d = self.velocity
        return x - self.lr * d
