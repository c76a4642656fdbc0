"""Server-FT (FedLAW's baseline, Li et al. ICML 2023, Table 3): fine-tune the FedAvg model on the
server's labelled proxy set with cross-entropy.

    w   <- x - eta_g sum_i p_i Delta_i                           (FedAvg)
    w   <- w - server step on CE(f(b; w), y_b)   for each proxy batch b, serverft.server_epochs passes (2)
    d    = x - w,   x <- x - 1 * d

Server optimiser (code): SGD with the client's lr (undecayed), momentum and weight decay, its momentum
kept across rounds (proxy.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedrepro.algorithms.proxy import ProxyTraining, build_proxy_algorithm
from fedrepro.parts import Algorithm


class ProxyFineTune(ProxyTraining):
    def loss(self, w: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(w, self.proxy_x[index]), self.proxy_y[index])


def build(setting, ctx) -> Algorithm:
    return build_proxy_algorithm("serverft", ProxyFineTune, setting, ctx)
