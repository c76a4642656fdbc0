"""The batched path's front door: what a run's batched rounds train on, declared once, and its round.

``BatchedRounds`` is built once per run from declared inputs: the model, the local rule, the training data and
each client's samples, the method's client hooks, each client's batch-order stream and the kept client momentum.
Whether they can train batched is decided then (``batchable.unsupported``, and each hook's declared forms
checked), not probed every round. ``train`` is one round: the ``RoundUpdates`` the sequential loop
(``Trainer.train_sequentially``) returns, with the same BatchNorm average and kept momentum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from fedrepro.parts import ClientObjective, GradientCorrection, RoundUpdates
from fedrepro.run.batchable import check_declared, unsupported
from fedrepro.run.batched import BatchedSGD, ClientPlan
from fedrepro.run.client import LocalSGD


@dataclass
class ClientData:
    """What clients train on: the training split and each client's samples (indices) and size."""

    train: object  # a data set (data.base.Dataset): batch(index), batched_cohort, augment
    client_index: list[torch.Tensor]
    client_sizes: torch.Tensor


class BatchedRounds:
    """A run's rounds of local training with the round's clients trained together (``run/batched.py``)."""

    def __init__(
        self,
        module: nn.Module,
        rule: LocalSGD,
        clients: ClientData,
        corrections: list[GradientCorrection],
        objective: ClientObjective | None,
        shuffle: Callable[[int, int], torch.Generator | None],
        client_momentum: torch.Tensor | None = None,
        max_together: int = 64,
        step_graph: str = "none",
    ):
        """``shuffle(t, client)``: the client's batch-order stream in round t (None: its stored order);
        ``client_momentum``: (N, P) kept client momentum, read and written in place (None: fresh each round);
        ``step_graph``: the setting of that name (none: ``BatchedSGD``; else ``run/static_step.py``'s step)."""
        hooks = [*corrections, *([objective] if objective is not None else [])]
        check_declared(hooks)
        self.why_not = unsupported(module, clients.train, corrections, objective)
        self.clients, self.corrections, self.objective = clients, list(corrections), objective
        self.shuffle, self.client_momentum = shuffle, client_momentum
        self.step_graph = step_graph
        if step_graph != "none":
            from fedrepro.run import static_step  # only runs that ask for it execute it (identity.OPTIONAL_RUN_CODE)

            self.why_not += static_step.unsupported(corrections, objective)
        self.sgd = self.sgd_like(module, rule, max_together)
        self.rounds_trained = 0

    def sgd_like(self, module: nn.Module, rule: LocalSGD, max_together: int) -> BatchedSGD:
        """An engine of this run's step (``step_graph``) for ``module``: a pack's stacked engine is its runs'."""
        if self.step_graph == "none":
            return BatchedSGD(module, rule, max_together)
        from fedrepro.run import static_step

        return static_step.StaticStepSGD(module, rule, max_together, self.step_graph)

    @property
    def ready(self) -> bool:
        return not self.why_not

    def plans(self, t: int, cohort, epochs: list[int], batches: list[int]) -> list[ClientPlan]:
        index = self.clients.client_index
        return [
            ClientPlan.draw(index[c], e, b, self.shuffle(t, c)) for c, e, b in zip(map(int, cohort), epochs, batches)
        ]

    def train(
        self,
        t: int,
        cohort,
        x: torch.Tensor,
        lr: float,
        epochs: list[int],
        batches: list[int],
        global_buffers: torch.Tensor,
    ) -> RoundUpdates:
        """Round t's clients ``cohort`` trained from ``x`` with their epochs and batch sizes. ``global_buffers``
        (the model's learnt buffers) are every client's start and receive the data-size weighted mean."""
        if self.why_not:
            raise RuntimeError(f"this run cannot train batched: {'; '.join(self.why_not)}")
        device = x.device
        clients = torch.as_tensor(cohort, device=device)
        kept = None if self.client_momentum is None else self.client_momentum[clients]
        start = global_buffers.clone()
        finals, client_buffers, steps, losses = self.sgd.train(
            t,
            self.clients.train,
            clients,
            self.plans(t, cohort, epochs, batches),
            x,
            lr,
            start if len(start) else None,
            kept,
            self.corrections,
            self.objective,
        )
        if kept is not None:
            self.client_momentum[clients] = kept
        updates = RoundUpdates(
            t,
            clients,
            x - finals,
            self.clients.client_sizes[clients],
            torch.tensor(steps, dtype=torch.float32, device=device),
            losses,
            lr,
            buffers=client_buffers,
        )
        if client_buffers is not None:
            global_buffers.copy_(updates.weights @ client_buffers)
        self.rounds_trained += 1
        return updates
