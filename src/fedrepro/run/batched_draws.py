"""The random draws a batched round makes ahead (``fedrepro.run.batched``): dropout masks and on-device
augmentation drawn from torch's global generator in the order the sequential path draws them (per client:
per step the augmentation draws, then per forward pass each dropout layer's mask), stored, and applied by the
batched steps. The global generator ends where the sequential loop leaves it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GroupState:
    """Per group: the clients' BatchNorm buffers, the stored random draws, and a forward count."""

    def __init__(self, buffers: tuple[torch.Tensor, ...]):
        self.buffers = buffers  # per learnt buffer, (K, *shape)
        self.forwards = 0
        self.augment: dict[tuple[int, int], object] = {}  # (client row, step) -> augmentation draws
        self.masks: dict[tuple[int, int], list[list[torch.Tensor]]] = {}  # -> per forward, per dropout call
        self.dropout_calls: list[tuple[float, torch.Size]] = []  # (p, input shape past the batch dimension)
        self.step, self.rows_list, self.forward_no = 0, [], {}

    def draw(self, engine, data, plans, forwards: int) -> None:
        """Make the sequential path's global-generator draws, in its order, and keep them."""
        augment = bool(getattr(data, "augment", False))
        if not augment and not engine.dropouts:
            return
        if engine.dropouts:
            self.dropout_calls = dropout_calls(engine.module, engine.dropouts, data, plans)
        for j, plan in enumerate(plans):
            for s, batch in enumerate(plan.batches):
                b = len(batch)
                if augment:
                    self.augment[(j, s)] = data.augment_draws(b)
                if engine.dropouts:
                    self.masks[(j, s)] = [
                        [
                            F.dropout(torch.ones((b, *shape), device=batch.device), p, True)
                            for p, shape in self.dropout_calls
                        ]
                        for _ in range(forwards)
                    ]

    def batch(self, data, indices: list[torch.Tensor], rows: list[int], step: int):
        """The (k, b, ...) inputs and labels of the rows' batches, with their stored augmentation."""
        index = torch.stack(indices)
        for j in rows:
            self.forward_no[j] = 0
        if (rows[0], step) in self.augment:
            return data.batch_drawn(index, [self.augment[(j, step)] for j in rows])
        return data.batch(index)

    def next_masks(self, view) -> tuple[torch.Tensor, ...]:
        """The stored masks of the rows' next forward pass of this step, one (k, b, ...) stack per call."""
        if not self.masks:
            return ()
        rows = self.rows_list
        f = self.forward_no[rows[0]]
        for j in rows:
            self.forward_no[j] += 1
        per_row = [self.masks[(j, self.step)][f] for j in rows]
        return tuple(torch.stack([m[i] for m in per_row]) for i in range(len(self.dropout_calls)))


def dropout_calls(module: nn.Module, dropouts: list[nn.Module], data, plans) -> list[tuple[float, torch.Size]]:
    """The dropout layers' calls in one forward pass, in order, and each one's input shape past the batch
    dimension: a one-sample forward in eval mode (no dropout draws, no BatchNorm update)."""
    calls = []
    handles = [m.register_forward_hook(lambda mod, args, out: calls.append((mod, args[0].shape[1:]))) for m in dropouts]
    sample = next(p.batches[0][:1] for p in plans if p.batches)
    was = module.training
    devices = [sample.device] if sample.device.type == "cuda" else []
    try:
        module.eval()
        # an augmenting data set draws for this batch: the generator is put back as it was
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            module(data.batch(sample)[0])
    finally:
        module.train(was)
        for h in handles:
            h.remove()
    return [(m.p, shape) for m, shape in calls]
