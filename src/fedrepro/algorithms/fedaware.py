"""FedAWARE (Zeng et al., AISTATS 2025): the min-norm point of the clients' update momenta.

    m_i <- (1 - alpha) m_i + alpha Delta_i      for i in the cohort; the others keep theirs (stale)
    v_i  = m_i / ||m_i||  (code, `normalize`)   or  v_i = m_i  (paper)
    lambda = argmin_{lambda in simplex} || sum_i lambda_i v_i ||^2        over all clients seen so far
    d = sum_i lambda_i v_i,                      x <- x - eta_g d

With `warmup` (code) the server takes plain FedAvg steps until every client has been sampled
once; without it, AWARE runs from round 0 over the clients seen so far (a never-seen client has
no momentum yet: counting it as 0 would put 0 in the hull and stall the method at d = 0).

FedAWARE-NA (Fig. 4, `weights: static`) keeps the momenta but drops the adaptive weights. The
paper does not state its weights; our reading is the static data-size weights of FedAvg over the
clients seen so far, on the raw momenta (`normalize` belongs to the min-norm solve):
    d = sum_i p_i m_i,   p_i = n_i / sum_j n_j   over seen clients.
"""

from __future__ import annotations

import torch

from fedrepro.minnorm import min_norm_weights
from fedrepro.parts import Aggregator, Algorithm, Part, RoundUpdates
from fedrepro.server import ServerSGD


class ClientMomenta(Part):
    """One moving average of the uploaded updates per client, kept on the device (N x P)."""

    state = ("momenta", "seen", "sizes")

    def __init__(
        self,
        num_clients: int,
        dim: int,
        device,
        alpha: float,
        normalize: bool,
        warmup: bool,
        max_iter: int = 1000,
        tol: float = 1e-6,
        dtype=torch.float32,
        weights: str = "minnorm",
    ):
        if weights not in ("minnorm", "static"):
            raise ValueError(f"fedaware.weights must be minnorm or static, got '{weights}'")
        self.alpha, self.normalize, self.warmup, self.weights = alpha, normalize, warmup, weights
        self.max_iter, self.tol = max_iter, tol
        self.momenta = torch.zeros(num_clients, dim, device=device, dtype=dtype)
        self.seen = torch.zeros(num_clients, dtype=torch.bool, device=device)
        # n_i of every client seen, for the static (FedAWARE-NA) weights
        self.sizes = torch.zeros(num_clients, device=device, dtype=dtype)

    def update(self, updates: RoundUpdates) -> None:
        ids = updates.clients
        self.momenta[ids] = torch.lerp(self.momenta[ids], updates.deltas, self.alpha)
        self.seen[ids] = True
        self.sizes[ids] = updates.sizes.to(self.sizes)

    @property
    def ready(self) -> bool:
        return bool(self.seen.all()) if self.warmup else bool(self.seen.any())

    def direction(self, info: dict, prefix: str = "") -> torch.Tensor:
        """d = sum_i lambda_i v_i at the min-norm lambda; lambda and the solve go into ``info``."""
        if self.weights == "static":
            lam = torch.where(self.seen, self.sizes, torch.zeros_like(self.sizes))
            lam = lam / lam.sum()
            info[prefix + "lambda"] = lam
            info[prefix + "support"] = int((lam > 0).sum())
            return lam @ self.momenta
        seen = self.seen.nonzero().squeeze(1)
        rows = self.momenta if len(seen) == len(self.seen) else self.momenta[seen]
        norms = rows.norm(dim=1)
        # Normalising through the Gram matrix avoids a second N x P copy of the momenta.
        scale = torch.where(norms > 0, norms, torch.ones_like(norms)) if self.normalize else torch.ones_like(norms)
        gram = (rows @ rows.T) / torch.outer(scale, scale)
        solved = min_norm_weights(gram, self.max_iter, self.tol)
        d = (solved.weights / scale) @ rows
        lam = torch.zeros(len(self.seen), device=d.device, dtype=d.dtype)
        lam[seen] = solved.weights
        info[prefix + "lambda"] = lam
        info[prefix + "support"] = int((lam > 0).sum())
        info[prefix + "min_norm_sq"] = solved.value
        info[prefix + "fw_iters"] = solved.iterations
        info[prefix + "fw_gap"] = solved.gap
        return d


def momenta_from(section: dict, ctx, weights: str = "minnorm") -> ClientMomenta:
    """The clients' momenta of a section of the fedaware keys; ``weights``: how they are combined (FedAWARE's
    own section chooses, the +aware plug-in's projection is minnorm's)."""
    return ClientMomenta(
        ctx.num_clients,
        ctx.dim,
        ctx.device,
        section["alpha"],
        section["normalize"],
        section["warmup"],
        section["fw_max_iter"],
        section["fw_tol"],
        weights=weights,
    )


class AwareAggregator(Aggregator):
    subparts = ("momenta",)

    def __init__(self, momenta: ClientMomenta):
        self.momenta = momenta

    def __call__(self, x: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        self.momenta.update(updates)
        if not self.momenta.ready:
            updates.info["aware_warmup"] = 1
            updates.info["weights"] = updates.weights
            return updates.weighted_mean()
        updates.info["aware_warmup"] = 0
        return self.momenta.direction(updates.info)


def build(setting, ctx) -> Algorithm:
    section = setting["fedaware"]
    return Algorithm(
        "fedaware", AwareAggregator(momenta_from(section, ctx, section["weights"])), ServerSGD(setting["server"]["lr"])
    )
