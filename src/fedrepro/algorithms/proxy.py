"""The server's small labelled proxy set and training on it: shared by FedLAW and the server-side
baselines FedLAW compares with (FedDF, FedBE, Server-FT; Li et al., ICML 2023, section 7).

    proxy set    proxy_size / C test samples of each of the C classes, drawn by a generator seeded by
                 the run's seed (the same set for every method with that seed, and on resume). The
                 hold-out belongs to the comparison (``evaluation.proxy_holdout``): the engine removes it
                 from every run's evaluation set and hands it to the methods that train on it
    batches      shuffled each server epoch by a generator seeded by (seed, round), so a resumed run
                 repeats the same server optimisation
    ProxyTraining  x_avg = x - eta_g sum_i p_i Delta_i (FedAvg), then ``server_epochs`` passes of the
                 server optimiser on loss(w; proxy batch) from w = x_avg; d = x - w (unit server step)
"""

from __future__ import annotations

import torch

from fedrepro import streams
from fedrepro.functional import FunctionalModel
from fedrepro.parts import Aggregator, RoundUpdates


def round_generator(seed: int, round_: int, stream: str = "proxy") -> torch.Generator:
    """The server's batches of a round (FedLAW, FedDF, Server-FT: the proxy stream; FedBE's SWAG sample)."""
    return streams.generator(stream, seed, round_)


def epoch_batches(
    n: int, batch_size: int, generator: torch.Generator, device, balance_labels: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """One pass over the proxy set in shuffled batches (the last one may be smaller). With
    ``balance_labels`` (balanced sampling, FedLAW Table 6's "BS"): n draws with replacement, each sample
    with probability 1 / (C n_class), so every class is drawn equally often in expectation (a class-balanced
    sampler, as torch's WeightedRandomSampler with inverse class-frequency weights)."""
    if balance_labels is None:
        order = torch.randperm(n, generator=generator)
    else:
        labels = balance_labels.cpu()
        weights = 1.0 / torch.bincount(labels)[labels].double()
        order = torch.multinomial(weights, n, replacement=True, generator=generator)
    order = order.to(device)
    return [order[start : start + batch_size] for start in range(0, n, batch_size)]


def proxy_samples(ctx, section: str, size: int):
    """(inputs, labels) of the comparison's held-out proxy set, which the engine provides
    (``evaluation.proxy_holdout``); its size must be the method's ``<section>.proxy_size``."""
    if ctx.proxy is None or len(ctx.proxy[1]) != size:
        held = 0 if ctx.proxy is None else len(ctx.proxy[1])
        raise ValueError(
            f"{section}.proxy_size = {size} but the run holds out {held} proxy samples "
            f"(evaluation.proxy_holdout); set evaluation.proxy_holdout: {size} in the experiment's base"
        )
    return ctx.proxy


def optimizer_settings(cfg: dict) -> dict:
    """The server optimiser of FedDF, FedBE and Server-FT. Its lr, momentum and weight decay are resolved:
    null takes the client's values (proxy.yaml), as the code's central node builds its optimiser like a
    client's (SGD, lr = the initial client lr, never decayed)."""
    pick = {key: cfg[key] for key in ("lr", "momentum", "weight_decay")}
    return {"optimizer": cfg["optimizer"], "betas": tuple(cfg["betas"]), **pick}


class ProxyTraining(Aggregator):
    """FedAvg, then ``server_epochs`` passes of the server optimiser over the proxy set on ``loss``.

    With ``keep_state`` the optimiser's state (SGD momentum buffer, Adam moments) carries over from
    round to round, as the code's central optimiser (built once) does; it is checkpointed."""

    state = ("opt_state",)

    def __init__(
        self,
        net: FunctionalModel,
        proxy_x,
        proxy_y,
        cfg: dict,
        optim: dict,
        server_lr: float = 1.0,
        seed: int = 0,
        stream: str = "proxy",
    ):
        self.net, self.proxy_x, self.proxy_y = net, proxy_x, proxy_y
        self.cfg, self.optim, self.server_lr, self.seed, self.stream = cfg, optim, server_lr, seed, stream
        self.opt_state: dict = {}

    def prepare(self, x: torch.Tensor, x_avg: torch.Tensor, models: torch.Tensor, updates: RoundUpdates) -> None:
        """Per-round set-up before training (the teachers' logits); models: (K, P) client models."""

    def loss(self, w: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        models = x - updates.deltas  # (K, P) the models the clients sent
        x_avg = x - self.server_lr * updates.weighted_mean()  # the FedAvg model
        updates.info["weights"] = updates.weights
        if self.cfg["server_epochs"] == 0:
            return x - x_avg
        self.prepare(x, x_avg, models, updates)
        w = self.train(x_avg, updates)
        updates.info["server_step_norm"] = float((w - x_avg).norm())
        return x - w

    def make_optimizer(self, w: torch.Tensor) -> torch.optim.Optimizer:
        o = self.optim
        if o["optimizer"] == "sgd":
            opt = torch.optim.SGD([w], lr=o["lr"], momentum=o["momentum"], weight_decay=o["weight_decay"])
        else:
            opt = torch.optim.Adam([w], lr=o["lr"], betas=o["betas"], weight_decay=o["weight_decay"])
        if self.cfg["keep_state"] and self.opt_state:
            # Adam's step count stays on the CPU (as torch keeps it unless capturable), the rest with w
            opt.state[w] = {k: (v.cpu() if k == "step" else v.to(w.device)).clone() for k, v in self.opt_state.items()}
        return opt

    def train(self, w0: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        w = w0.clone().requires_grad_(True)
        opt = self.make_optimizer(w)
        generator = round_generator(self.seed, updates.round, self.stream)
        n = len(self.proxy_x)
        for _ in range(self.cfg["server_epochs"]):
            total = torch.zeros((), device=w.device, dtype=w.dtype)
            balance = self.proxy_y if self.cfg["balanced_sampling"] else None
            for index in epoch_batches(n, self.cfg["batch_size"], generator, w.device, balance):
                loss = self.loss(w, index)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += loss.detach() * len(index)
        updates.info["proxy_loss"] = float(total / n)  # mean over the last server epoch
        if self.cfg["keep_state"]:
            self.opt_state = {k: v.detach().clone() for k, v in opt.state[w].items()}
        return w.detach()


def build_proxy_algorithm(name: str, aggregator_cls, setting: dict, ctx, **extra):
    """An Algorithm whose aggregator trains on the proxy set of section ``setting[name]``."""
    from fedrepro.parts import Algorithm
    from fedrepro.server import ServerSGD

    cfg = setting[name]
    if ctx.module is None:
        raise ValueError(f"{name} needs the run's model (server-side training on the proxy set)")
    px, py = proxy_samples(ctx, name, cfg["proxy_size"])
    aggregator = aggregator_cls(
        FunctionalModel(ctx.module),
        px,
        py,
        cfg,
        optimizer_settings(cfg),
        setting["server"]["lr"],
        setting["seed"],
        **extra,
    )
    return Algorithm(name, aggregator, ServerSGD(1.0))
