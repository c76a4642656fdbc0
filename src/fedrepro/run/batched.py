"""A round's clients trained together: one vmapped step advances every client still training.

The sequential loop (``client.LocalSGD``, one client after another) is the reference; this path gives
the same clients the same computation, batched over a (K, P) stack of their flat parameters:

* **Masked steps.** Each client's batches are drawn from its own generator exactly as ``LocalSGD``
  draws them (its epochs, its batch size, its last partial batch). At step s the clients that still have
  a batch s take it; a client that has finished stops changing. Clients whose batch s has the same size
  share one vmapped call (a short last batch, or +random_batch's sizes, gets its own call), so every
  forward pass sees exactly the samples it sees alone: BatchNorm's batch statistics and the mean loss are
  those of the client's own batch, never of padding.
* **Client terms.** A method's gradient correction or objective batches when it has a ``batched`` form
  next to its sequential one, in the method's own file (the math stays there):

      GradientCorrection.batched(grad, view)              grad (k, P) of the rows ``view`` names, in place
      ClientObjective.batched(view, inputs, labels)       fills view.grad (k, P), returns the losses (k,)

  A hook declares which forms it has (``batched_forms``: "step", "begin", "end", ...; checked once when the
  run's batched path is built). ``begin`` and ``end`` run client by client with a ``ClientRun`` whose model
  is the client's row, in cohort order, before and after the batched training; a hook that keeps per-client
  state between them and its gradient term instead declares and defines ``batched_begin(cohort)`` /
  ``batched_end(cohort)``. An ``end``
  may change only its own client's state (as every method's does): no client of the round reads it.
  An objective whose loss adds a term on the model's features (FedFA's anchor loss) passes a
  ``parts.FeatureTerm`` to ``loss_and_grad``, which vmaps it with the forward pass and returns the features
  too. An objective with per-step or per-epoch work (``after_step``, ``end_epoch``) needs their batched forms
  too (``batched_after_step(view)``, ``batched_end_epoch(view)``); without them the round is sequential.
* **Optimiser state.** The momentum buffers are a (K, P) stack: zeros, or the rows of the kept client
  momentum (``client.keep_momentum``), written back after the round.
* **BatchNorm.** Every client starts from the global running statistics (a (K, B) stack, updated by its
  own forward passes); the engine averages the final ones as it does after the sequential loop.
* **Randomness.** Dropout masks and on-device augmentation draw from torch's global generator in the
  sequential path, client after client, step after step. Before a group of clients trains, this path
  makes the same calls in that order (per client: per step the augmentation draws, then per forward pass
  each dropout layer's mask) and stores what they return; the batched steps then apply the stored crops
  and masks. So the global generator ends where the sequential loop leaves it, and every client sees the
  crops and masks it sees alone. Each mask is drawn by ``F.dropout`` on ones of the layer's input shape,
  which consumes the generator as the layer's own call does and gives the factor it multiplies by.

The results equal the sequential path's up to the summation order of batched kernels (a vmapped matmul
adds in another order than K single ones); losses, BatchNorm statistics and everything elementwise are
the same operations on the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedrepro.flat import learnt_buffers
from fedrepro.parts import ClientRun, FeatureTerm
from fedrepro.run.batchable import dropout_layers
from fedrepro.run.batched_draws import GroupState
from fedrepro.run.client import LocalSGD

# ---------------------------------------------------------------- the clients' schedules


@dataclass
class ClientPlan:
    """One client's batches in the order it takes them, as ``LocalSGD.train`` draws them."""

    batches: list[torch.Tensor]
    epoch_ends: frozenset[int]  # the steps after which an epoch ends

    @classmethod
    def draw(cls, index: torch.Tensor, epochs: int, batch_size: int, generator: torch.Generator | None):
        n, batches, ends = len(index), [], []
        for _ in range(epochs):
            # the same randperm call as LocalSGD.train: the client's generator gives the same orders
            order = index if generator is None else index[torch.randperm(n, generator=generator).to(index.device)]
            batches.extend(order[start : start + batch_size] for start in range(0, n, batch_size))
            ends.append(len(batches) - 1)
        return cls(batches, frozenset(ends))


# ---------------------------------------------------------------- what hooks see


@dataclass
class CohortRun:
    """The clients of a group, for ``batched_begin`` / ``batched_end``: row j is client ``clients[j]``."""

    round: int
    clients: torch.Tensor  # (K,) ids, on the device
    x: torch.Tensor  # (K, P) the clients' parameters
    x_global: torch.Tensor  # (P,)
    lr: float
    steps: list[int]  # steps each client has taken (all of them at batched_end)
    module: nn.Module


@dataclass
class StepView:
    """The clients taking one batched step together (rows of the group that share a batch size)."""

    round: int
    rows: torch.Tensor | None  # their rows in the group; None: every row
    clients: torch.Tensor  # (k,) their ids
    x: torch.Tensor  # (k, P) their parameters, updated in place by the step
    x_global: torch.Tensor
    lr: float
    grad: torch.Tensor  # (k, P) the gradient the objective fills and the corrections change
    module: nn.Module
    _forward: object = field(repr=False, default=None)

    def take(self, stacked: torch.Tensor) -> torch.Tensor:
        """The rows of a (K, ...) per-group tensor that belong to this step's clients."""
        return stacked if self.rows is None else stacked[self.rows]

    def loss_and_grad(self, inputs: torch.Tensor, labels: torch.Tensor, term: FeatureTerm | None = None):
        """Cross-entropy forward and backward of every row at its current ``x`` on its own batch; the
        gradients land in ``grad``, the (k,) losses are returned (detached), BatchNorm statistics move.
        With a ``term``: its loss on the features (the input of ``term.tap``) is added to each row's, and
        (losses, features (k, b, ...) detached) is returned."""
        return self._forward(self, inputs, labels, term)


class _RowModel:
    """What a per-client ``begin``/``end`` reads of ``run.model``: the client's row as ``flat``."""

    def __init__(self, flat: torch.Tensor, module: nn.Module):
        self.flat, self.module, self.numel = flat, module, flat.numel()


# ---------------------------------------------------------------- the engine


class BatchedSGD:
    """Local SGD of a round's clients as vmapped steps over stacked flat parameters and buffers.

    ``max_together`` bounds how many clients share one stack (memory grows with it)."""

    def __init__(self, module: nn.Module, rule: LocalSGD = LocalSGD(), max_together: int = 64):
        self.module, self.rule, self.max_together = module, rule, max_together
        named = list(module.named_parameters())
        self.names = [name for name, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        # BatchNorm's learnt statistics travel per client, in FlatModel.buffers' layout; its batch counters
        # are mutated by every forward pass, so they are passed in too (per-client scratch)
        buffers = dict(module.named_buffers())
        self.buffer_names = learnt_buffers(module)
        self.buffer_shapes = [buffers[n].shape for n in self.buffer_names]
        self.counter_names = [n for n, b in buffers.items() if n.endswith("num_batches_tracked")]
        self.dropouts = dropout_layers(module)
        self._masks: list[torch.Tensor] = []

        def loss(params, bufs, counters, x, y, masks):
            self._masks = list(masks)  # the dropout hooks take them in call order
            tensors = {
                **dict(zip(self.names, params)),
                **dict(zip(self.buffer_names, bufs)),
                **dict(zip(self.counter_names, counters)),
            }
            return F.cross_entropy(functional_call(self.module, tensors, (x,)), y)

        def loss_with_term(params, bufs, counters, x, y, masks):
            term, captured = self._term, []
            hook = term.tap.register_forward_hook(lambda mod, args, out: captured.append(args[0]))
            try:
                value = loss(params, bufs, counters, x, y, masks)
            finally:
                hook.remove()
            extra = term(captured[0], y)  # added after cross-entropy, as the sequential objective adds it
            return (value if extra is None else value + extra), captured[0].detach()

        self._grad = vmap(grad_and_value(loss))
        self._grad_term = vmap(grad_and_value(loss_with_term, has_aux=True))
        self._term = None

    # ---- views into (K, P) and (K, B) stacks
    @staticmethod
    def _split(stacked: torch.Tensor, shapes) -> tuple[torch.Tensor, ...]:
        views, offset = [], 0
        for shape in shapes:
            n = shape.numel()
            views.append(stacked[:, offset : offset + n].view(len(stacked), *shape))
            offset += n
        return tuple(views)

    def _forward(self, view: StepView, inputs: torch.Tensor, labels: torch.Tensor, term=None):
        k = len(view.x)
        state = self._state
        bufs = tuple(view.take(b) for b in state.buffers)
        counters = tuple(torch.zeros(k, dtype=torch.long, device=view.x.device) for _ in self.counter_names)
        masks = state.next_masks(view)
        args = (self._split(view.x, self.shapes), bufs, counters, inputs, labels, masks)
        features = None
        if term is None:
            grads, loss = self._grad(*args)
        else:
            self._term = term
            try:
                grads, (loss, features) = self._grad_term(*args)
            finally:
                self._term = None
        torch.cat([g.reshape(k, -1) for g in grads], dim=1, out=view.grad)
        if view.rows is not None:
            for whole, moved in zip(state.buffers, bufs):
                whole[view.rows] = moved  # a gathered copy moved; the group's stack did not
        state.forwards += k
        return loss.detach() if term is None else (loss.detach(), features)

    # ---- training
    def train(
        self,
        round_: int,
        data,
        clients: torch.Tensor,
        plans: list[ClientPlan],
        x_global: torch.Tensor,
        lr: float,
        buffers: torch.Tensor | None = None,
        momentum: torch.Tensor | None = None,
        corrections=(),
        objective=None,
    ):
        """Train the clients (ids ``clients``, schedules ``plans``) from ``x_global``. ``buffers``: the global
        learnt buffers (every client starts from them); ``momentum``: (K, P) kept buffers, updated in place.
        Returns (final parameters (K, P), final buffers (K, B) or None, steps per client, mean losses (K,)).
        Packed runs (run/packed.py) give each row its own start: ``x_global`` (K, P) and ``buffers`` (K, B)."""
        finals, final_buffers, steps, losses = [], [], [], []
        per_row = x_global.dim() == 2
        for lo in range(0, len(plans), self.max_together):
            hi = lo + self.max_together
            start = x_global[lo:hi] if per_row else x_global
            bufs = buffers[lo:hi] if per_row and buffers is not None else buffers
            f, b, s, l = self._train_group(
                round_,
                data,
                clients[lo:hi],
                plans[lo:hi],
                start,
                lr,
                bufs,
                None if momentum is None else momentum[lo:hi],
                corrections,
                objective,
            )
            finals.append(f)
            final_buffers.append(b)
            steps += s
            losses.append(l)
        return (torch.cat(finals), None if buffers is None else torch.cat(final_buffers), steps, torch.cat(losses))

    def _train_group(self, round_, data, clients, plans, x_global, lr, buffers, kept, corrections, objective):
        k, device = len(plans), x_global.device
        x = x_global.expand(k, -1).clone()
        grad = torch.empty_like(x)
        # one contiguous (K, *shape) tensor per buffer: BatchNorm's batching rule updates a batched running
        # statistic in place only where its rows are contiguous (a column slice of a (K, B) stack is not)
        state = self._state = GroupState(
            ()
            if buffers is None or not len(buffers)
            else tuple(b.contiguous() for b in self._split(buffers.expand(k, -1).clone(), self.buffer_shapes))
        )
        velocity = None
        if self.rule.momentum:
            velocity = torch.zeros_like(x) if kept is None else kept.clone()
        hooks = [*corrections, *([objective] if objective is not None else [])]
        steps = [0] * k
        cohort = CohortRun(round_, clients, x, x_global, lr, steps, self.module)
        self._call(hooks, cohort, "begin")
        forwards = objective.forwards_per_step if objective is not None else 1
        state.draw(self, data, plans, forwards)  # the global generator's draws, in the sequential order
        loss_sum = torch.zeros(k, device=device)
        bn_counters = {n: b for n, b in self.module.named_buffers() if n in self.counter_names}
        with self._dropouts_replaced():
            for s in range(max((len(p.batches) for p in plans), default=0)):
                groups: dict[int, list[int]] = {}
                for j, plan in enumerate(plans):
                    if s < len(plan.batches):  # a finished client takes no step: it stops changing
                        groups.setdefault(len(plan.batches[s]), []).append(j)
                for rows in groups.values():
                    everyone = len(rows) == k
                    idx = None if everyone else torch.as_tensor(rows, device=device)
                    take = (lambda t: t) if everyone else (lambda t: t[idx])
                    view = StepView(
                        round_,
                        idx,
                        take(clients),
                        take(x),
                        x_global,
                        lr,
                        grad if everyone else torch.empty(len(rows), x.shape[1], device=device),
                        self.module,
                        BatchedSGD._forward.__get__(self),
                    )
                    state.step, state.rows_list = s, rows
                    inputs, labels = state.batch(data, [plans[j].batches[s] for j in rows], rows, s)
                    if objective is None:
                        loss = view.loss_and_grad(inputs, labels)
                    else:
                        loss = objective.batched(view, inputs, labels)
                    for c in corrections:
                        c.batched(view.grad, view)
                    buf = None if velocity is None else take(velocity)
                    self.rule.step(view.x, view.grad, lr, buf)
                    loss_sum[rows if not everyone else slice(None)] += loss
                    for j in rows:
                        steps[j] += 1
                    # before the gathered rows go back: an after_step may move them (FedFA's calibration)
                    if objective is not None and "after_step" in objective.batched_forms:
                        objective.batched_after_step(view)
                    ended = [j for j in rows if s in plans[j].epoch_ends]
                    if ended and objective is not None and "end_epoch" in objective.batched_forms:
                        objective.batched_end_epoch(_subview(view, rows, ended, device))
                    if not everyone:  # gathered copies: put the moved rows back
                        x[idx] = view.x
                        if buf is not None:
                            velocity[idx] = buf
        # the shared module's batch counters advance once per client forward pass, as client after client
        for counter in bn_counters.values():
            counter.add_(state.forwards)
        self._call(hooks, cohort, "end")
        if kept is not None:
            kept.copy_(velocity)
        # the mean loss of each client, divided as LocalSGD divides (a 0-dim tensor by its step count)
        losses = torch.stack([loss_sum[j] / max(steps[j], 1) for j in range(k)])
        final_buffers = torch.cat([b.reshape(k, -1) for b in state.buffers], dim=1) if state.buffers else None
        return x, final_buffers, list(steps), losses

    def _call(self, hooks, cohort: CohortRun, name: str) -> None:
        """Each hook's ``batched_<name>(cohort)``, or its ``<name>(run)`` once a client where it declares none."""
        for hook in hooks:
            if name in hook.batched_forms:
                getattr(hook, f"batched_{name}")(cohort)
            else:
                for run in self._runs(cohort):
                    getattr(hook, name)(run)

    def _runs(self, cohort: CohortRun):
        """Each client's ClientRun, in cohort order, its model the client's row."""
        for j, c in enumerate(cohort.clients.tolist()):
            yield ClientRun(
                cohort.round, int(c), _RowModel(cohort.x[j], self.module), cohort.x_global, cohort.lr, cohort.steps[j]
            )

    def _dropouts_replaced(self):
        """Dropout layers in eval mode (they draw nothing) with a hook that multiplies by the stored mask."""
        import contextlib

        @contextlib.contextmanager
        def replaced():
            handles, modes = [], [m.training for m in self.dropouts]
            try:
                for m in self.dropouts:
                    m.eval()
                    handles.append(m.register_forward_hook(lambda mod, args, out: out * self._masks.pop(0)))
                yield
            finally:
                for h in handles:
                    h.remove()
                for m, mode in zip(self.dropouts, modes):
                    m.train(mode)

        return replaced()


def _subview(view: StepView, rows: list[int], chosen: list[int], device) -> StepView:
    """The part of a step's view that ``chosen`` (a subset of ``rows``) names."""
    if chosen == rows:
        return view
    pos = torch.as_tensor([rows.index(j) for j in chosen], device=device)
    group_rows = torch.as_tensor(chosen, device=device)
    return StepView(
        view.round,
        group_rows,
        view.clients[pos],
        view.x[pos],
        view.x_global,
        view.lr,
        view.grad[pos],
        view.module,
        view._forward,
    )
