"""Local training of one client: minibatch SGD on the flat parameter vector.

The update rule is PyTorch's SGD (g = grad + wd * x; b = mu * b + g; x -= lr * b), with the
client-objective corrections (proximal, SCAFFOLD, FedDyn) added to the minibatch gradient first.
The momentum buffer b starts at zero every round (the papers' reading), or, with
``client.keep_momentum``, continues from where the client's last round left it (FedLAW's code
creates each client's ``torch.optim.SGD`` once, so its buffer persists across rounds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedrepro import streams
from fedrepro.data import TensorDataset
from fedrepro.parts import ClientObjective, ClientRun, GradientCorrection


def client_generator(seed: int, round_: int, client: int) -> torch.Generator:
    """The shuffling RNG of one client in one round; a resumed run draws the same batches."""
    return streams.generator("batches", seed, round_, client)


def holdout_split(part: np.ndarray, fraction: float, seed: int, client: int) -> tuple[np.ndarray, np.ndarray]:
    """(trained on, held out) of one client: its samples shuffled by a generator seeded by (run seed,
    client), the first floor(fraction * n) held out and the rest trained on, as FedLAW's code splits
    each client (shuffle, then ``int(valid_ratio * n)`` held out). The seed is shared by every method of
    a comparison, so all of them hold out the same samples."""
    rng = streams.rng("holdout", seed, client)
    order = np.asarray(part)[rng.permutation(len(part))]
    held = int(fraction * len(part))
    return order[held:], order[:held]


def num_steps(n_samples: int, epochs: int, batch_size: int) -> int:
    return epochs * -(-n_samples // batch_size)


@dataclass
class LocalResult:
    steps: int
    loss: torch.Tensor  # mean minibatch loss, on the device (no sync)


@dataclass
class LocalSGD:
    momentum: float = 0.0
    weight_decay: float = 0.0

    def step(self, x: torch.Tensor, grad: torch.Tensor, lr: float, buf: torch.Tensor | None) -> None:
        """PyTorch's SGD update, in place, on one flat vector or a (K, P) stack of them (the cohort path):
        g = grad + wd * x;  b = mu * b + g;  x -= lr * b. ``grad`` and ``buf`` are overwritten."""
        if self.weight_decay:
            grad.add_(x, alpha=self.weight_decay)
        if buf is not None:
            grad = buf.mul_(self.momentum).add_(grad)
        x.add_(grad, alpha=-lr)

    def train(
        self,
        run: ClientRun,
        data: TensorDataset,
        index: torch.Tensor,
        epochs: int,
        batch_size: int,
        generator: torch.Generator,
        corrections: list[GradientCorrection] = (),
        objective: ClientObjective | None = None,
        momentum_buffer: torch.Tensor | None = None,
    ) -> LocalResult:
        """Train ``run.model`` from ``run.x_global`` on the samples ``index`` of ``data``. ``momentum_buffer``:
        this client's buffer kept from its earlier rounds, updated in place; None starts from zero."""
        model = run.model
        model.flat.copy_(run.x_global)
        hooks = [*corrections, *([objective] if objective is not None else [])]
        for hook in hooks:
            hook.begin(run)
        buf = None
        if self.momentum:
            buf = torch.zeros_like(model.flat) if momentum_buffer is None else momentum_buffer
        loss_sum = torch.zeros((), device=model.flat.device)
        n = len(index)
        for _ in range(epochs):
            # no generator: the client's stored order every epoch (client.shuffle: none)
            order = index if generator is None else index[torch.randperm(n, generator=generator).to(index.device)]
            for start in range(0, n, batch_size):
                x, y = data.batch(order[start : start + batch_size])
                if objective is None:
                    loss_sum += model.loss_and_grad(F.cross_entropy, x, y)
                else:
                    loss_sum += objective(run, x, y)
                g = model.grad
                for c in corrections:
                    c(g, run)
                self.step(model.flat, g, run.lr, buf)
                run.steps += 1
                if objective is not None:
                    objective.after_step(run)
            if objective is not None:
                objective.end_epoch(run)
        for hook in hooks:
            hook.end(run)
        return LocalResult(run.steps, loss_sum / max(run.steps, 1))
