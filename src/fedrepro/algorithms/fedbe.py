"""FedBE (Chen & Chao, ICLR 2021) as FedLAW's code runs it: FedDF's distillation with a Bayesian
ensemble of teachers, {FedAvg model, the K clients, one SWAG-Gaussian sample}, logits averaged uniformly.

SWAG-Gaussian sample, per parameter tensor l (a layer's weight or bias), from g_i = x_i - x:
    u_i = g_i[l] / ||g_i[l]||                      (0 where ||g_i[l]|| = 0; the code divides by 0)
    m   = mean_i u_i,   v = max(mean_i u_i^2 - m^2, 1e-5)
    s   = m + fedbe.swag_scale * sqrt(v) * eps,   eps ~ N(0, I) from a generator seeded by (seed, round)
    w_swag[l] = x[l] + s * mean_i ||g_i[l]||
Then distil as FedDF from the FedAvg model for fedbe.server_epochs (100) passes; d = x - w.
"""

from __future__ import annotations

import torch

from fedrepro.algorithms.feddf import EnsembleDistillation
from fedrepro.algorithms.proxy import build_proxy_algorithm, round_generator
from fedrepro.parts import Algorithm, RoundUpdates

VAR_CLAMP = 1e-5  # the code's SWAG_server var_clamp (its second clamp at 1e-6 never binds)


def swag_sample(x: torch.Tensor, models: torch.Tensor, slices, scale: float, eps: torch.Tensor) -> torch.Tensor:
    """One Gaussian SWAG sample around x from the client models (K, P), per parameter slice."""
    sample = torch.empty_like(x)
    for _, s in slices:
        g = models[:, s] - x[s]  # (K, n_l)
        norms = g.norm(dim=1, keepdim=True)
        u = torch.where(norms > 0, g / norms.clamp_min(torch.finfo(g.dtype).tiny), torch.zeros_like(g))
        mean = u.mean(0)
        var = (u.square().mean(0) - mean.square()).clamp_min(VAR_CLAMP)
        sample[s] = x[s] + (mean + scale * var.sqrt() * eps[s]) * norms.mean()
    return sample


class BayesianEnsembleDistillation(EnsembleDistillation):
    def teachers(self, x, x_avg, models, updates: RoundUpdates) -> list[torch.Tensor]:
        generator = round_generator(self.seed, updates.round, "swag")
        eps = torch.randn(x.shape, generator=generator, dtype=x.dtype).to(x.device)
        swag = swag_sample(x, models, self.net.slices(), self.cfg["swag_scale"], eps)
        fresh = self.codes_statistics  # the code's FedAvg and SWAG teachers: new modules in train mode
        return [(x_avg, None, fresh), *self.client_teachers(models, updates), (swag, None, fresh)]


def build(setting, ctx) -> Algorithm:
    return build_proxy_algorithm("fedbe", BayesianEnsembleDistillation, setting, ctx)
