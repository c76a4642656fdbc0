"""FedNova (Wang et al., 2020): normalised averaging, which removes the objective inconsistency that
unequal local work causes in FedAvg.

A local solver whose update is a linear combination of its gradients, Delta_i = lr G_i a_i, is
normalised by ||a_i||_1 before averaging, and the average is rescaled by tau_eff:

    d = tau_eff * sum_{i in S} p_i Delta_i / ||a_i||_1,        x <- x - eta_g d
    p_i = n_i / n_S over the cohort;   tau_eff = sum_{i in S} p_i ||a_i||_1   (or sum p_i tau_i)

||a_i||_1 follows the official code's per-step recursion, from the client lr, momentum rho and
proximal mu (FedNova-Prox: fednova.mu > 0):
    plain SGD: ||a||_1 = tau
    momentum:  c <- rho c + 1; a <- a + c          => sum_{k=1..tau} (1 - rho^k) / (1 - rho)
    proximal:  a <- (1 - lr mu) a + 1             => (1 - (1 - lr mu)^tau) / (lr mu)
tau_eff 'auto' is the official code's rule: sum p_i tau_i when mu > 0, else sum p_i ||a_i||_1.

Optional server momentum as in the official code (gmf): v <- beta v + d / lr, x <- x - eta_g lr v.

Optional cross-client variance reduction (FedNova-VR, paper sec. V; fednova.vr): every local gradient
of round t gets the constant c_i = sum_j p_j d_j^(t-1) - d_i^(t-1), where d_i = G_i a_i / ||a_i||_1 is
client i's normalised (uncorrected) gradient of round t-1. The correction enters the gradient before
the momentum buffer and the proximal recursion, so it is weighted by a_i like the gradients and
    Delta_i / (lr ||a_i||_1) = d_i + c_i   =>   d_i = Delta_i / (lr ||a_i||_1) - c_i   (server side).
Round 1 has no previous d: c_i = 0. Full participation only (the registry refuses participation < 1).
"""

from __future__ import annotations

import torch

from fedrepro.algorithms.fedprox import ProximalTerm
from fedrepro.parts import Aggregator, Algorithm, ClientRun, GradientCorrection, RoundUpdates, ServerOptimizer
from fedrepro.server import ServerSGD


def a_norm(steps: int, lr: float, rho: float = 0.0, mu: float = 0.0) -> float:
    """||a_i||_1 after `steps` local steps, by the official FedNova code's recursion."""
    norm, counter, eta_mu = 0.0, 0.0, lr * mu
    for _ in range(int(steps)):
        if rho:
            counter = counter * rho + 1
            norm += counter
        if eta_mu:
            norm = norm * (1 - eta_mu) + 1
        if not rho and not eta_mu:
            norm += 1
    return norm


class NormalisedAveraging(Aggregator):
    def __init__(self, rho: float = 0.0, mu: float = 0.0, tau_eff: str = "auto"):
        self.rho, self.mu = rho, mu
        self.tau_eff = ("steps" if mu else "a_norm") if tau_eff == "auto" else tau_eff

    def __call__(self, x: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        p = updates.weights
        norms = torch.tensor(
            [a_norm(s, updates.lr, self.rho, self.mu) for s in updates.steps.tolist()], dtype=p.dtype, device=p.device
        )
        tau_eff = p @ (updates.steps if self.tau_eff == "steps" else norms)
        scale = tau_eff * p / norms
        updates.info.update(weights=p, tau_eff=float(tau_eff), a_norm=norms, nova_scale=scale)
        return scale @ updates.deltas


class LrScaledMomentum(ServerOptimizer):
    """The official FedNova code's server momentum: the buffer holds d / lr, so it is in gradient
    units and the current client lr scales the step (identical to SGD momentum when lr is constant)."""

    state = ("velocity",)

    def __init__(self, lr: float, momentum: float):
        self.lr, self.momentum = lr, momentum
        self.velocity: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, d: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        g = d / updates.lr
        self.velocity = g if self.velocity is None else self.velocity.mul_(self.momentum).add_(g)
        return x - self.lr * updates.lr * self.velocity


class CrossClientVR(GradientCorrection):
    """FedNova-VR's correction g <- g + sum_j p_j d_j^(t-1) - d_i^(t-1). Holds every client's last
    normalised gradient d_i (an N x P matrix, server-held state in this simulation) and their
    p-weighted mean; both start at zero, so round 1 trains uncorrected."""

    batched_forms = frozenset({"begin", "step", "end"})  # run/batched.py
    state = ("d_clients", "d_mean")

    def __init__(self, num_clients: int, dim: int, rho: float = 0.0, mu: float = 0.0, device=None):
        self.num_clients, self.rho, self.mu = num_clients, rho, mu
        self.d_clients = torch.zeros(num_clients, dim, device=device)  # d_i^(t-1)
        self.d_mean = torch.zeros(dim, device=device)  # sum_j p_j d_j^(t-1)
        self.current = torch.zeros(dim, device=device)  # c_i of the client now training

    def begin(self, run: ClientRun) -> None:
        torch.sub(self.d_mean, self.d_clients[run.client], out=self.current)

    def __call__(self, grad: torch.Tensor, run: ClientRun) -> None:
        grad.add_(self.current)

    def end(self, run: ClientRun) -> None:
        # d_i^(t) replaces d_i^(t-1) at once: no other client's c_j reads row i, and d_mean moves
        # only in end_round, after the whole cohort has trained with the same corrections
        norm = a_norm(run.steps, run.lr, self.rho, self.mu)
        self.d_clients[run.client] = (run.x_global - run.model.flat) / (run.lr * norm) - self.current

    # clients trained together (run/batched.py): c_i of every client of the group at once, row by row
    def batched_begin(self, cohort) -> None:
        self.currents = self.d_mean - self.d_clients[cohort.clients]

    def batched(self, grad: torch.Tensor, view) -> None:
        grad.add_(view.take(self.currents))

    def batched_end(self, cohort) -> None:
        for j, client in enumerate(cohort.clients.tolist()):
            norm = a_norm(cohort.steps[j], cohort.lr, self.rho, self.mu)
            self.d_clients[client] = (cohort.x_global - cohort.x[j]) / (cohort.lr * norm) - self.currents[j]
        self.currents = None

    def end_round(self, updates: RoundUpdates) -> None:
        if len(updates.clients) != self.num_clients:
            raise RuntimeError(
                f"fednova.vr needs every client in every round (participation = 1); round "
                f"{updates.round} had {len(updates.clients)} of {self.num_clients}"
            )
        p = torch.zeros(self.num_clients, dtype=self.d_mean.dtype, device=self.d_mean.device)
        p[updates.clients] = updates.weights.to(p.dtype)
        self.d_mean.copy_(p @ self.d_clients)
        # sum_i p_i ||c_i^(t+1)||: the size of next round's corrections (they sum to zero with weights p)
        # (client by client: no second N x P tensor)
        updates.info["vr_correction_norm"] = float(
            sum(p[i] * (self.d_clients[i] - self.d_mean).norm() for i in range(self.num_clients))
        )


def build(setting, ctx) -> Algorithm:
    c, eta_g = setting["fednova"], setting["server"]["lr"]
    aggregator = NormalisedAveraging(setting["client"]["momentum"], c["mu"], c["tau_eff"])
    optimizer = LrScaledMomentum(eta_g, c["server_momentum"]) if c["server_momentum"] else ServerSGD(eta_g)
    corrections = [ProximalTerm(c["mu"])] if c["mu"] else []
    if c["vr"]:
        corrections.append(CrossClientVR(ctx.num_clients, ctx.dim, setting["client"]["momentum"], c["mu"], ctx.device))
    return Algorithm("fednova", aggregator, optimizer, corrections=corrections)
