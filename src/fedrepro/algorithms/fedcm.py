"""FedCM (Xu et al., 2021, "Federated Learning with Client-level Momentum").

Every local step of every client mixes its minibatch gradient with the server's estimate of the
previous round's average gradient:

    client i:  g <- alpha g + (1 - alpha) G_{t-1}
    server:    d = sum_{i in S} n_i / n_S * Delta_i,   x <- x - eta_g d
               G_t = sum_{i in S} n_i / n_S * Delta_i / (lr_t tau_i)      (G_0 = 0)

Dividing each Delta_i by its own lr * tau_i makes G a per-step gradient even when clients take
different step counts; with equal tau it is the paper's Delta / (eta_l K).
"""

import torch

from fedrepro.parts import Algorithm, ClientRun, GradientCorrection, RoundUpdates
from fedrepro.server import ServerSGD, WeightedMean


class ClientMomentum(GradientCorrection):
    batched_forms = frozenset({"step"})  # run/batched.py
    state = ("global_gradient",)

    def __init__(self, alpha: float, dim: int, device=None):
        self.alpha = alpha
        self.global_gradient = torch.zeros(dim, device=device)

    def __call__(self, grad: torch.Tensor, run: ClientRun) -> None:
        grad.mul_(self.alpha).add_(self.global_gradient, alpha=1 - self.alpha)

    def batched(self, grad: torch.Tensor, view) -> None:
        """Every row mixes with the same G_{t-1} (run/batched.py)."""
        grad.mul_(self.alpha).add_(self.global_gradient, alpha=1 - self.alpha)

    def end_round(self, updates: RoundUpdates) -> None:
        scale = updates.weights / (updates.lr * updates.steps)
        self.global_gradient = scale @ updates.deltas


def build(setting, ctx) -> Algorithm:
    return Algorithm(
        "fedcm",
        WeightedMean(),
        ServerSGD(setting["server"]["lr"]),
        corrections=[ClientMomentum(setting["fedcm"]["alpha"], ctx.dim, ctx.device)],
    )
