"""Training a whole cohort at once: one vmapped SGD step advances every client of the round.

When every sampled client runs the same number of local steps with the same batch sizes (equal
client sizes, as shards and IID splits give) and the method adds nothing client-specific to the
gradient, the K local trainings are K independent copies of the same computation. Stacking the
K parameter vectors into one (K, P) buffer and vmapping ``functional_call`` over it turns K small
launches per layer into one batched launch, which is what small models on a GPU are bound by.

Each client keeps its own shuffling generator and draws exactly the batches it would draw when
trained alone (``client.LocalSGD``), and the update is the same function (``LocalSGD.step`` on the stack),
so both paths give the same result up to the summation order of the batched kernels. Models with
dropout stay on the sequential path: a vmapped dropout draws one mask batch from the global generator,
which no client trained alone would draw, so the two paths could not agree.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedrepro.client import LocalSGD
from fedrepro.data import TensorDataset


def equal_steps(indices: list[torch.Tensor], epochs: list[int]) -> bool:
    """True when all clients see the same batch-size sequence (same sample count and epochs)."""
    return len(set(len(i) for i in indices)) == 1 and len(set(epochs)) == 1


def random_layers(module: nn.Module) -> list[str]:
    """Names of the layers that draw random numbers in train mode (dropout with p > 0)."""
    return [name or type(m).__name__ for name, m in module.named_modules()
            if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]


class CohortSGD:
    """Local SGD of K clients as one vmapped computation over stacked flat parameters.

    ``max_together`` bounds how many clients share one stacked buffer (memory grows with K).
    """

    def __init__(self, module: nn.Module, rule: LocalSGD = LocalSGD(), max_together: int = 64):
        # Under vmap a dropout layer draws one batched mask from the global generator, not each
        # client's own sequence as when trained alone, so the two paths would differ; refuse it.
        if random_layers(module):
            raise ValueError(f"the vmapped cohort path cannot train a model with Dropout layers "
                             f"({', '.join(random_layers(module))}): train its clients one after another")
        self.module = module
        self.rule = rule  # the same update as a client trained alone
        self.max_together = max_together
        named = list(module.named_parameters())
        self.names = [name for name, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]

        def loss(params: tuple[torch.Tensor, ...], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(functional_call(self.module, dict(zip(self.names, params)), (x,)), y)

        # over clients: their own parameters and their own batch
        self._step = vmap(grad_and_value(loss), in_dims=(0, 0, 0))

    def _views(self, stacked: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per-parameter (K, *shape) views into the (K, P) buffer."""
        views, offset = [], 0
        for shape, n in zip(self.shapes, self.numels):
            views.append(stacked[:, offset:offset + n].view(len(stacked), *shape))
            offset += n
        return tuple(views)

    def train(self, data: TensorDataset, indices: list[torch.Tensor], x_global: torch.Tensor, lr: float,
              epochs: int, batch_size: int, generators: list[torch.Generator]) -> tuple[torch.Tensor, int, torch.Tensor]:
        """Return the clients' final parameters (K, P), the steps each took, and their mean losses (K,)."""
        finals, losses = [], []
        steps = 0
        for lo in range(0, len(indices), self.max_together):
            hi = lo + self.max_together
            final, steps, loss = self._train_group(data, indices[lo:hi], x_global, lr, epochs, batch_size,
                                                   generators[lo:hi])
            finals.append(final)
            losses.append(loss)
        return torch.cat(finals), steps, torch.cat(losses)

    def _train_group(self, data, indices, x_global, lr, epochs, batch_size, generators):
        k, n = len(indices), len(indices[0])
        stacked = x_global.expand(k, -1).clone()
        grad = torch.empty_like(stacked)
        velocity = torch.zeros_like(stacked) if self.rule.momentum else None
        params = self._views(stacked)
        index = torch.stack(indices)
        loss_sum = torch.zeros(k, device=stacked.device)
        steps = 0
        for _ in range(epochs):
            # the same randperm calls, client by client, as LocalSGD makes: the same batches
            order = torch.stack([torch.arange(n) if g is None else torch.randperm(n, generator=g)
                                 for g in generators]).to(index.device)
            order = torch.gather(index, 1, order)
            for start in range(0, n, batch_size):
                x, y = data.batch(order[:, start:start + batch_size])
                grads, loss = self._step(params, x, y)
                loss_sum += loss.detach()
                torch.cat([g.reshape(k, -1) for g in grads], dim=1, out=grad)
                self.rule.step(stacked, grad, lr, velocity)
                steps += 1
        return stacked, steps, loss_sum / max(steps, 1)
