"""FedDyn (Acar et al., 2021): a dynamic regulariser that makes each client's stationary point the
global one. Client i minimises F_i(x) - <l_i, x> + alpha/2 ||x - x_global||^2, so

    client i:  g <- g - l_i + alpha (x - x_global)           (every local step)
               l_i <- l_i - alpha (x_i - x_global) = l_i + alpha Delta_i
    server:    h <- h + (alpha/N) sum_{i in S} Delta_i        (h = -alpha/N sum of (x_i - x))
               x <- mean_{i in S} x_i - h / alpha,  i.e.  d = (1/|S|) sum_{i in S} Delta_i + h / alpha

l_i (the client's gradient state, N x P) and h start at zero. eta_g multiplies d (the paper has none;
1 reproduces it).

`feddyn.form: fedlaw_code` is the variant FedLAW's code runs as its FedDyn baseline: the penalty is
alpha/2 ||x - x_global|| (the norm, whose gradient is alpha/2 times a unit vector), and the server uses
data-size weights p_i over the cohort instead of 1/|S| and 1/N:
    h <- h + alpha sum_{i in S} p_i Delta_i,      d = sum_{i in S} p_i Delta_i + h / alpha
"""

import torch

from fedrepro.parts import Aggregator, Algorithm, ClientRun, GradientCorrection, RoundUpdates
from fedrepro.server import ServerSGD, UniformMean, WeightedMean


class DynamicRegulariser(GradientCorrection):
    batched_forms = frozenset({"step"})  # run/batched.py
    state = ("grad_state",)

    def __init__(self, alpha: float, num_clients: int, dim: int, device=None, squared: bool = True):
        self.alpha, self.squared = alpha, squared
        self.grad_state = torch.zeros(num_clients, dim, device=device)

    def __call__(self, grad: torch.Tensor, run: ClientRun) -> None:
        grad.sub_(self.grad_state[run.client])
        offset = run.model.flat - run.x_global
        if self.squared:
            grad.add_(offset, alpha=self.alpha)
        else:  # gradient of alpha/2 ||x - x_global||; zero at x = x_global (no sync: stays on the device)
            grad.add_(offset * (self.alpha / 2 / offset.norm().clamp_min(1e-30)))

    def batched(self, grad: torch.Tensor, view) -> None:
        """The same term for the (k, P) rows of clients training together (run/batched.py): each row's own
        l_i and, in the norm form, its own ||x - x_global||."""
        grad.sub_(self.grad_state[view.clients])
        offset = view.x - view.x_global
        if self.squared:
            grad.add_(offset, alpha=self.alpha)
        else:
            grad.add_(offset * (self.alpha / 2 / offset.norm(dim=1, keepdim=True).clamp_min(1e-30)))

    def end(self, run: ClientRun) -> None:
        self.grad_state[run.client] += self.alpha * (run.x_global - run.model.flat)


class DynamicAggregate(Aggregator):
    state = ("h",)

    def __init__(self, alpha: float, num_clients: int, dim: int, device=None, data_weighted: bool = False):
        self.alpha, self.num_clients, self.data_weighted = alpha, num_clients, data_weighted
        self.h = torch.zeros(dim, device=device)
        self.mean = WeightedMean() if data_weighted else UniformMean()

    def __call__(self, x: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        if self.data_weighted:
            self.h += self.alpha * updates.weighted_mean()
        else:
            self.h += updates.deltas.sum(0) * (self.alpha / self.num_clients)
        updates.info["feddyn_h_norm"] = float(self.h.norm())
        return self.mean(x, updates) + self.h / self.alpha


def build(setting, ctx) -> Algorithm:
    alpha = setting["feddyn"]["alpha"]
    fedlaw_code = setting["feddyn"]["form"] == "fedlaw_code"
    return Algorithm(
        "feddyn",
        DynamicAggregate(alpha, ctx.num_clients, ctx.dim, ctx.device, data_weighted=fedlaw_code),
        ServerSGD(setting["server"]["lr"]),
        corrections=[DynamicRegulariser(alpha, ctx.num_clients, ctx.dim, ctx.device, squared=not fedlaw_code)],
    )
