"""SCAFFOLD (Karimireddy et al., 2020), option II, with server learning rate eta_g.

    client i:  g <- g - c_i + c                              (every local step)
               c_i+ = c_i - c + (x - x_i) / (tau_i * lr)     (tau_i: the client's own step count)
    server:    x <- x - eta_g (1/|S|) sum_{i in S} Delta_i
               c <- c + (1/N) sum_{i in S} (c_i+ - c_i)       (= |S|/N times the cohort mean)

c and every c_i start at zero; the N x P matrix of c_i is server-held state in this simulation.
"""

import torch

from fedrepro.parts import Algorithm, ClientRun, GradientCorrection, RoundUpdates
from fedrepro.server import ServerSGD, UniformMean


class ControlVariates(GradientCorrection):
    batched_forms = frozenset({"step"})  # run/batched.py
    state = ("c", "c_clients")

    def __init__(self, num_clients: int, dim: int, device=None):
        self.num_clients = num_clients
        self.c = torch.zeros(dim, device=device)
        self.c_clients = torch.zeros(num_clients, dim, device=device)
        self.c_change = torch.zeros(dim, device=device)  # sum of this round's c_i+ - c_i

    def __call__(self, grad: torch.Tensor, run: ClientRun) -> None:
        grad.sub_(self.c_clients[run.client]).add_(self.c)

    def batched(self, grad: torch.Tensor, view) -> None:
        """The same correction for the (k, P) rows of clients training together (run/batched.py); ``end`` runs
        client by client there too, and c moves only in end_round."""
        grad.sub_(self.c_clients[view.clients]).add_(self.c)

    def end(self, run: ClientRun) -> None:
        old = self.c_clients[run.client]
        new = old - self.c + (run.x_global - run.model.flat) / (run.steps * run.lr)
        self.c_change += new - old
        self.c_clients[run.client] = new

    def end_round(self, updates: RoundUpdates) -> None:
        # the server's c only moves after the whole cohort has trained with the same c
        self.c += self.c_change / self.num_clients
        self.c_change.zero_()
        updates.info["control_norm"] = float(self.c.norm())


def build(setting, ctx) -> Algorithm:
    return Algorithm(
        "scaffold",
        UniformMean(),
        ServerSGD(setting["server"]["lr"]),
        corrections=[ControlVariates(ctx.num_clients, ctx.dim, ctx.device)],
    )
