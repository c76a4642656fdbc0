"""The xAWARE plug-in (FedAWARE, Proposition 3.1): keep the host method's step size, take AWARE's direction.

    s = x - host_optimizer(x, d~)             the host's own step (eta_g, momentum, Adam, ...)
    x <- x - (<s, d> / ||d||^2) d              d: the AWARE direction of the host's uploaded updates

The projection wraps the host's server optimizer rather than transforming d~ before it: the
reference code updates the host's internal state (FedAvgM's velocity, FedYogi's and FedAMS's
moments) with the un-projected d~ and projects only the final step. For plain SGD hosts the two
placements coincide, since projecting is linear. Until the momenta are ready (every client seen
once, with `aware.warmup`) the host's step is taken unchanged, as the reference code does.
"""

from __future__ import annotations

import torch

from fedrepro.algorithms.fedaware import ClientMomenta, momenta_from
from fedrepro.parts import Algorithm, RoundUpdates, ServerOptimizer


class ProjectOntoAware(ServerOptimizer):
    subparts = ("host", "momenta")

    def __init__(self, host: ServerOptimizer, momenta: ClientMomenta):
        self.host, self.momenta = host, momenta

    def __call__(self, x: torch.Tensor, d_host: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        self.momenta.update(updates)
        x_host = self.host(x, d_host, updates)
        if not self.momenta.ready:
            updates.info["aware_projected"] = 0
            return x_host
        d = self.momenta.direction(updates.info, prefix="aware_")
        updates.info["aware_projected"] = 1
        return x - project(x - x_host, d, updates.info)


def project(step: torch.Tensor, d: torch.Tensor, info: dict | None = None) -> torch.Tensor:
    """(<step, d> / ||d||^2) d; zero when d = 0 (0 lies in the hull: AWARE sees no common direction)."""
    dd = d.dot(d)
    scale = step.dot(d) / dd if dd > 0 else torch.zeros((), device=d.device)
    if info is not None:
        info["aware_scale"] = float(scale)
        info["aware_cosine"] = float(step.dot(d) / (step.norm() * dd.sqrt()).clamp_min(1e-30))
    return scale * d


def apply(algorithm: Algorithm, setting, ctx) -> None:
    algorithm.optimizer = ProjectOntoAware(algorithm.optimizer, momenta_from(setting["aware"], ctx))
