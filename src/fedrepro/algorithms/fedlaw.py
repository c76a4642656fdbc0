"""FedLAW (Li et al., ICML 2023): learn the aggregation weights lambda and the global shrinking
factor gamma on a small labelled proxy set held by the server.

    w_i     = x - eta_g Delta_i                      (the client models when eta_g = 1)
    x_new   = gamma * sum_i lambda_i w_i,   gamma = exp(theta),  lambda = softmax(z)
    (theta, z) = argmin  CE(f(proxy; x_new))         Adam(betas 0.5, 0.999), StepLR(20, 0.5), from
                                                     theta = 0, z = log(n_i / n_S)  (gamma = 1, data-size lambda)

In the parts model this is an aggregator returning d = x - x_new with a unit server step, so the
sign convention x <- x - d holds. Variants (`fedlaw.variant`):
  fedlaw        gamma and lambda learned                          (Eq. 8-9)
  adaptive_gws  gamma learned, lambda = data sizes                (Eq. 5)
  attentive     lambda learned, gamma = fedlaw.gamma (1)          (Eq. 7)
  fixed_gamma   gamma = fedlaw.gamma, lambda = data sizes; no proxy set (Table 1's global weight shrinking)
  (any)         fedlaw.learn_rounds = N > 0 learns only in rounds 1..N, then aggregates as FedAvg (gamma 1,
                data-size lambda): Fig. 5's early-stopped attentive LAW
  swa           FedLAW (SWA), section 6.1: two stages of server_epochs // 2, lambda with stochastic weight
                averaging of z, then gamma with lambda fixed (the code's order; fedlaw.swa_order: gamma_first
                is the paper's)
The proxy set is class-balanced, drawn from the test set with a generator seeded by the run's seed;
it is the comparison's hold-out (``evaluation.proxy_holdout``), removed from every method's evaluation
set by the engine, which hands it to FedLAW.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedrepro import metrics
from fedrepro.algorithms.proxy import epoch_batches, proxy_samples, round_generator as _generator
from fedrepro.functional import FunctionalModel
from fedrepro.parts import Aggregator, Algorithm, RoundUpdates
from fedrepro.server import ServerSGD

LEARNS = {
    "fedlaw": (True, True),
    "adaptive_gws": (True, False),
    "attentive": (False, True),
    "fixed_gamma": (False, False),
    "swa": (True, True),
}  # (gamma, lambda)


class LearnedAggregation(Aggregator):
    def __init__(
        self,
        module: torch.nn.Module,
        proxy_x: torch.Tensor | None,
        proxy_y: torch.Tensor | None,
        cfg: dict,
        server_lr: float = 1.0,
        seed: int = 0,
    ):
        self.module, self.proxy_x, self.proxy_y = module, proxy_x, proxy_y
        self.cfg, self.server_lr, self.seed = cfg, server_lr, seed
        self.learn_gamma, self.learn_lambda = LEARNS[cfg["variant"]]
        self.net = FunctionalModel(module)
        # a list records (stage, epoch, theta, z, lr) per server epoch: theta and z at its end, the lr it ran with
        self.trace: list | None = None

    def forward(self, w: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        """The module's output with the flat parameter vector w (differentiable in w)."""
        return self.net(w, inputs)

    def __call__(self, x: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        models = x - self.server_lr * updates.deltas  # (K, P)
        theta = torch.tensor(
            0.0 if self.learn_gamma else float(np.log(self.cfg["gamma"])), device=x.device, dtype=x.dtype
        )
        z = torch.log(updates.weights)
        # early stopping (Fig. 5, middle): from round learn_rounds + 1 on, gamma = 1 and data-size lambda (FedAvg)
        stopped = 0 < self.cfg["learn_rounds"] <= updates.round
        if stopped:
            theta = torch.zeros_like(theta)
        elif self.cfg["variant"] == "swa" and self.cfg["server_epochs"] > 0:
            theta, z = self.fit_swa(z, models, updates)
        elif (self.learn_gamma or self.learn_lambda) and self.cfg["server_epochs"] > 0:
            theta, z = self.fit(theta, z, models, updates)
        gamma, lam = float(theta.exp()), torch.softmax(z, 0)
        x_new = gamma * (lam @ models)
        updates.info.update(
            {
                "gamma": gamma,
                "weights": lam,
                "lambda_coherence": float(metrics.coherence(updates.deltas, lam)),
                "gws_norm": float(abs(1 - gamma) * x.norm()),  # ||(1 - gamma) x||, a norm: gamma > 1 grows x
                "global_grad_norm": float(gamma * self.server_lr * (lam @ updates.deltas).norm()),
            }
        )
        if self.cfg["log_client_weights"]:  # Fig. 5 (right): lambda of each client of the cohort, by client id
            updates.info["lambda_client"] = dict(zip(updates.clients.tolist(), lam.tolist()))
        return x - x_new

    def fit(self, theta, z, models, updates):
        theta = theta.clone().requires_grad_(self.learn_gamma)
        z = z.clone().requires_grad_(self.learn_lambda)
        cfg = self.cfg
        opt = torch.optim.Adam(
            [v for v in (theta, z) if v.requires_grad], lr=cfg["server_lr"], betas=tuple(cfg["betas"])
        )
        schedule = torch.optim.lr_scheduler.StepLR(opt, cfg["lr_step_epochs"], cfg["lr_step_factor"])
        generator = _generator(self.seed, updates.round)
        for epoch in range(cfg["server_epochs"]):
            self.epoch(theta, z, models, opt, generator, updates)
            self.record("fedlaw", epoch, theta, z, opt)
            schedule.step()
        return theta.detach(), z.detach()

    def epoch(self, theta, z, models, opt, generator, updates) -> None:
        """One pass over the proxy set: an optimiser step on CE(f(b; gamma sum_i lambda_i w_i)) per batch."""
        n = len(self.proxy_y)
        total = torch.zeros((), device=self.proxy_y.device)
        balance = self.proxy_y if self.cfg["balanced_sampling"] else None
        for index in epoch_batches(n, self.cfg["batch_size"], generator, self.proxy_y.device, balance):
            w = theta.exp() * (torch.softmax(z, 0) @ models)
            loss = F.cross_entropy(self.forward(w, self.proxy_x[index]), self.proxy_y[index])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.detach() * len(index)
        updates.info["proxy_loss"] = float(total / n)  # mean over the last server epoch

    def record(self, stage, epoch, theta, z, opt) -> None:
        if self.trace is not None:
            self.trace.append((stage, epoch, float(theta.detach()), z.detach().clone(), opt.param_groups[0]["lr"]))

    def fit_swa(self, z0, models, updates):
        """FedLAW (SWA), two stages of server_epochs // 2 each (code): lambda with SWA of its logits z
        (Adam, cosine lr, from epoch swa_start + 1 on SWALR and a running mean of z), gamma alone
        (Adam, StepLR). fedlaw.swa_order: lambda_first (code), gamma_first (paper section 6.1)."""
        cfg, generator = self.cfg, _generator(self.seed, updates.round)
        epochs = cfg["server_epochs"] // 2
        theta, z = torch.zeros((), device=z0.device, dtype=z0.dtype), z0.clone()
        stages = ["lambda", "gamma"] if cfg["swa_order"] == "lambda_first" else ["gamma", "lambda"]
        for stage in stages:
            learn = theta.clone().requires_grad_(True) if stage == "gamma" else z.clone().requires_grad_(True)
            opt = torch.optim.Adam([learn], lr=cfg["server_lr"], betas=tuple(cfg["betas"]))
            if stage == "gamma":
                schedule = torch.optim.lr_scheduler.StepLR(opt, cfg["lr_step_epochs"], cfg["lr_step_factor"])
            else:
                schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg["swa_cosine_epochs"])
                swa_schedule = torch.optim.swa_utils.SWALR(
                    opt, swa_lr=cfg["swa_lr"], anneal_epochs=cfg["swa_anneal_epochs"]
                )
                average, averaged = z0.clone(), 0  # the code's AveragedModel starts as a copy of z0
            for epoch in range(epochs):
                th, zz = (learn, z) if stage == "gamma" else (theta, learn)
                self.epoch(th, zz, models, opt, generator, updates)
                self.record(stage, epoch, th, zz, opt)
                if stage == "lambda" and epoch > cfg["swa_start"]:
                    average += (learn.detach() - average) / (averaged + 1)
                    averaged += 1
                    swa_schedule.step()
                else:
                    schedule.step()
            if stage == "gamma":
                theta = learn.detach()
            else:
                z = average
                updates.info["swa_averaged"] = averaged
        return theta, z


def build(setting, ctx) -> Algorithm:
    cfg = setting["fedlaw"]
    if ctx.module is None:
        raise ValueError("fedlaw needs the run's model (server-side training on the proxy set)")
    learns = any(LEARNS[cfg["variant"]])
    proxy = proxy_samples(ctx, "fedlaw", cfg["proxy_size"]) if learns else (None, None)
    aggregator = LearnedAggregation(ctx.module, *proxy, cfg, setting["server"]["lr"], setting["seed"])
    return Algorithm("fedlaw", aggregator, ServerSGD(1.0))
