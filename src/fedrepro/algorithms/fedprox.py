"""FedProx (Li et al., 2020): each client minimises F_i(x) + mu/2 ||x - x_global||^2.

    client gradient: g + mu (x - x_global);   server: FedAvg's weighted mean, x <- x - eta_g d
"""
import torch

from fedrepro.parts import Algorithm, ClientRun, GradientCorrection
from fedrepro.server import ServerSGD, WeightedMean


class ProximalTerm(GradientCorrection):
    def __init__(self, mu: float):
        self.mu = mu

    def __call__(self, grad: torch.Tensor, run: ClientRun) -> None:
        grad.add_(run.model.flat - run.x_global, alpha=self.mu)


def build(setting, ctx) -> Algorithm:
    return Algorithm("fedprox", WeightedMean(), ServerSGD(setting["server"]["lr"]),
                     corrections=[ProximalTerm(setting["fedprox"]["mu"])])
