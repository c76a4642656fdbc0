"""FedProx (Li et al., 2020): each client minimises F_i(x) + mu/2 ||x - x_global||^2.

client gradient: g + mu (x - x_global);   server: FedAvg's weighted mean, x <- x - eta_g d
(``mean: uniform``: the plain mean over the cohort, as FedAWARE's code aggregates its FedProx)
"""

import torch

from fedrepro.parts import Algorithm, ClientRun, GradientCorrection
from fedrepro.server import ServerSGD, UniformMean, WeightedMean


class ProximalTerm(GradientCorrection):
    batched_forms = frozenset({"step"})  # run/batched.py

    def __init__(self, mu: float):
        self.mu = mu

    def __call__(self, grad: torch.Tensor, run: ClientRun) -> None:
        grad.add_(run.model.flat - run.x_global, alpha=self.mu)

    def batched(self, grad: torch.Tensor, view) -> None:
        """The same term for the (k, P) rows of clients training together (run/batched.py)."""
        grad.add_(view.x - view.x_global, alpha=self.mu)


def build(setting, ctx) -> Algorithm:
    mean = UniformMean() if setting["fedprox"]["mean"] == "uniform" else WeightedMean()
    return Algorithm(
        "fedprox", mean, ServerSGD(setting["server"]["lr"]), corrections=[ProximalTerm(setting["fedprox"]["mu"])]
    )
