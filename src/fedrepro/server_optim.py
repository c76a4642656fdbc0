"""Adaptive server optimizers of Reddi et al. (2021, "Adaptive Federated Optimization") and FedAMS
(Wang, Lin & Chen, 2022), on the pseudo-gradient d (Delta_i = x - x_i, so d points downhill):

    m <- beta1 m + (1 - beta1) d
    FedAdam: v <- beta2 v + (1 - beta2) d^2                 x <- x - eta_g m / (sqrt(v) + tau)
    FedYogi: v <- v - (1 - beta2) d^2 sign(v - d^2)         x <- x - eta_g m / (sqrt(v) + tau)
    FedAMS:  v <- beta2 v + (1 - beta2) d^2,
             v_hat <- max(v_hat, v, eps)                    x <- x - eta_g m / sqrt(v_hat)

No bias correction, m_0 = 0, v_0 = `v0` (0 in the reference code of FedAWARE and FedLAW; Reddi
et al. ask v_0 >= tau^2), as in the papers' algorithm boxes and both reference codes.
"""

from __future__ import annotations

import torch

from fedrepro.parts import RoundUpdates, ServerOptimizer


class AdaptiveServer(ServerOptimizer):
    state = ("m", "v")

    def __init__(self, lr: float, beta1: float, beta2: float):
        self.lr, self.beta1, self.beta2 = lr, beta1, beta2
        self.m: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def init_v(self, d: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(d)

    def second_moment(self, d2: torch.Tensor) -> None:
        raise NotImplementedError

    def denominator(self) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, d: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        if self.m is None:
            self.m, self.v = torch.zeros_like(d), self.init_v(d)
        self.m.mul_(self.beta1).add_(d, alpha=1 - self.beta1)
        self.second_moment(d * d)
        step = self.m / self.denominator()
        updates.info["adaptive_step_norm"] = float(step.norm())
        return x - self.lr * step


class ServerAdam(AdaptiveServer):
    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-5, v0: float = 0.0):
        super().__init__(lr, beta1, beta2)
        self.tau, self.v0 = tau, v0

    def init_v(self, d):
        return torch.full_like(d, self.v0)

    def second_moment(self, d2):
        self.v.mul_(self.beta2).add_(d2, alpha=1 - self.beta2)

    def denominator(self):
        return self.v.sqrt() + self.tau


class ServerYogi(ServerAdam):
    def second_moment(self, d2):
        # Yogi moves v towards d^2 by an additive step, so v cannot collapse after one large d
        self.v.sub_((1 - self.beta2) * d2 * torch.sign(self.v - d2))


class ServerAMS(AdaptiveServer):
    state = ("m", "v", "v_hat")

    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.99, eps: float = 1e-8):
        super().__init__(lr, beta1, beta2)
        self.eps = eps
        self.v_hat: torch.Tensor | None = None

    def second_moment(self, d2):
        self.v.mul_(self.beta2).add_(d2, alpha=1 - self.beta2)
        floor = self.v.clamp_min(self.eps)
        self.v_hat = floor if self.v_hat is None else torch.maximum(self.v_hat, floor)

    def denominator(self):
        return self.v_hat.sqrt()
