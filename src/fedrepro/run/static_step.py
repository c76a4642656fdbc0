"""The static-shape batched step (the setting ``step_graph``): every step of a group keeps all its K rows.

The batched path (``run/batched.py``) gathers, at step s, the rows whose batch s has a given size and vmaps over
them: the number of rows changes from step to step (clients finish at different steps, a short last batch has its
own call). Here every call has all K rows of the group, and a (K,) mask says which rows take this step:

* **Masked rows.** A row without a batch s of this size computes on a stand-in batch (a live row's samples,
  augmentation draws and, for dropout, a mask of ones), and its result is thrown away: ``torch.where`` keeps its
  parameters, momentum and BatchNorm statistics as they were and its loss adds 0. vmap keeps rows independent, so
  a live row computes what it computes among fewer rows; a masked row draws nothing (the draws are made ahead,
  in the sequential order, ``run/batched_draws.py``) and counts no BatchNorm batch.
* **Fixed shapes.** A group's calls see (K, b) batches for the batch sizes b its clients take (the full batch size
  and the clients' short last batches), a 0-dim learning rate (a new learning rate is not a new graph) and the
  same parameter and buffer stacks, so ``torch.compile`` captures one graph per (K, b) and reuses it every step
  and round. ``step_graph: compile`` compiles the step with ``mode="reduce-overhead"``: on CUDA its graphs are
  replayed as CUDA graphs (one launch a step instead of one per kernel).
* **Scope.** Runs without client terms (no gradient correction, no client objective), as a pack stacks them; a
  run whose method has client terms is refused when its trainer is built (``unsupported``).

The update is LocalSGD's (g = grad + wd x; b = mu b + g; x -= lr b) computed out of place, so a row's numbers
equal the batched path's up to the rounding of ``lr * b`` (a multiply, then a subtract, where ``add_(alpha=-lr)``
may fuse them): within the bound batched and sequential agree within (tests/run/test_static_step.py).
"""

from __future__ import annotations

import torch
from torch import nn

from fedrepro.run.batched import BatchedSGD
from fedrepro.run.batched_draws import GroupState
from fedrepro.run.client import LocalSGD

# the setting's values: none (the batched path as it is), static (masked full-row steps, not compiled: the same
# shapes and numbers as compile, on any device), compile (those steps under torch.compile(mode="reduce-overhead"))
STEP_GRAPHS = ("none", "static", "compile")
# dynamo compiles one graph per (K, b) of the step function; a run sees the full batch size and its clients'
# short last batches, at most batch_size of them, for each group size K: more than dynamo's default of 8
RECOMPILE_LIMIT = 256


def unsupported(corrections, objective) -> list[str]:
    """Why a method's client terms keep it off the static-shape step (empty: they do not)."""
    terms = [type(h).__name__ for h in [*corrections, *([objective] if objective is not None else [])]]
    return [f"client terms ({', '.join(terms)}) have no static-shape step"] if terms else []


class StaticStepSGD(BatchedSGD):
    """``BatchedSGD`` whose every step computes all K rows of a group, the rows without a batch masked.

    ``graph``: "static" or "compile"; ``backend``: torch.compile's backend for "compile" (None: inductor with
    mode="reduce-overhead"; "eager" or "aot_eager" capture the graph without generating code, as the CPU tests do)."""

    def __init__(
        self,
        module: nn.Module,
        rule: LocalSGD = LocalSGD(),
        max_together: int = 64,
        graph: str = "static",
        backend: str | None = None,
    ):
        if graph not in STEP_GRAPHS[1:]:
            raise ValueError(f"step_graph: {graph!r} is not a static-shape step; allowed: {', '.join(STEP_GRAPHS[1:])}")
        super().__init__(module, rule, max_together)
        self.graph = graph
        self.shapes_compiled: set[tuple[int, int]] = set()  # the (K, b) the step has been called with
        step = self._masked_step
        if graph == "compile":
            import torch._dynamo

            limit = torch._dynamo.config.recompile_limit
            torch._dynamo.config.recompile_limit = max(limit, RECOMPILE_LIMIT)
            options = {"backend": backend} if backend else {"mode": "reduce-overhead"}
            step = torch.compile(step, dynamic=False, fullgraph=True, **options)
        self._step = step

    def _masked_step(self, x, velocity, bufs, inputs, labels, masks, live, lr):
        """One local SGD step of all K rows; the rows ``live`` (K,) names take it, the others keep their state.
        Pure: returns (x, velocity, buffers, losses) and changes none of its inputs."""
        k = x.shape[0]
        moved = tuple(b.clone() for b in bufs)  # BatchNorm moves these in place; ``bufs`` stay as they were
        counters = tuple(torch.zeros(k, dtype=torch.long, device=x.device) for _ in self.counter_names)
        grads, loss = self._grad(self._split(x, self.shapes), moved, counters, inputs, labels, tuple(masks))
        g = torch.cat([g.reshape(k, -1) for g in grads], dim=1)
        if self.rule.weight_decay:
            g = torch.add(g, x, alpha=self.rule.weight_decay)
        v_new = None
        if velocity is not None:
            v_new = velocity * self.rule.momentum + g
            g = v_new
        row = live.view(k, 1)
        x_out = torch.where(row, x - lr * g, x)
        v_out = None if velocity is None else torch.where(row, v_new, velocity)
        b_out = tuple(torch.where(live.view(k, *[1] * (b.dim() - 1)), m, b) for m, b in zip(moved, bufs))
        return x_out, v_out, b_out, torch.where(live, loss.detach(), torch.zeros_like(loss))

    def _train_group(self, round_, data, clients, plans, x_global, lr, buffers, kept, corrections, objective):
        why = unsupported(corrections, objective)
        if why:
            raise RuntimeError(f"step_graph: {self.graph}: {'; '.join(why)}")
        k, device = len(plans), x_global.device
        x = x_global.expand(k, -1).clone()
        state = self._state = GroupState(
            ()
            if buffers is None or not len(buffers)
            else tuple(b.contiguous() for b in self._split(buffers.expand(k, -1).clone(), self.buffer_shapes))
        )
        velocity = None
        if self.rule.momentum:
            velocity = torch.zeros_like(x) if kept is None else kept.clone()
        steps = [0] * k
        state.draw(self, data, plans, 1)  # the global generator's draws, in the sequential order
        loss_sum = torch.zeros(k, device=device)
        lr_t = torch.tensor(lr, dtype=x.dtype, device=device)  # a tensor: a new learning rate is no new graph
        bn_counters = [b for n, b in self.module.named_buffers() if n in self.counter_names]
        with self._dropouts_replaced():
            for s in range(max((len(p.batches) for p in plans), default=0)):
                groups: dict[int, list[int]] = {}
                for j, plan in enumerate(plans):
                    if s < len(plan.batches):  # a finished client is masked: it stops changing
                        groups.setdefault(len(plan.batches[s]), []).append(j)
                for size, rows in groups.items():
                    live = torch.zeros(k, dtype=torch.bool, device=device)
                    live[rows] = True
                    inputs, labels = self._full_batch(state, data, plans, rows, s)
                    masks = self._full_masks(state, rows, s, k, size, device)
                    self.shapes_compiled.add((k, size))
                    new_x, new_v, new_bufs, loss = self._step(
                        x, velocity, state.buffers, inputs, labels, masks, live, lr_t
                    )
                    # copied out at once: a CUDA graph's outputs are overwritten by its next replay
                    x.copy_(new_x)
                    if velocity is not None:
                        velocity.copy_(new_v)
                    for whole, moved in zip(state.buffers, new_bufs):
                        whole.copy_(moved)
                    loss_sum += loss
                    for j in rows:
                        steps[j] += 1
                    state.forwards += len(rows)
        for counter in bn_counters:  # once per client forward pass, as client after client
            counter.add_(state.forwards)
        if kept is not None:
            kept.copy_(velocity)
        losses = torch.stack([loss_sum[j] / max(steps[j], 1) for j in range(k)])
        final_buffers = torch.cat([b.reshape(k, -1) for b in state.buffers], dim=1) if state.buffers else None
        return x, final_buffers, list(steps), losses

    @staticmethod
    def _full_batch(state: GroupState, data, plans, rows: list[int], s: int):
        """The (K, b, ...) inputs of step s: the live rows' batches, a masked row the first live row's stand-in."""
        live = set(rows)
        source = [j if j in live else rows[0] for j in range(len(plans))]
        index = torch.stack([plans[j].batches[s] for j in source])
        if (rows[0], s) in state.augment:
            return data.batch_drawn(index, [state.augment[(j, s)] for j in source])
        return data.batch(index)

    @staticmethod
    def _full_masks(state: GroupState, rows: list[int], s: int, k: int, size: int, device) -> tuple:
        """Per dropout call a (K, b, ...) stack: a live row's stored mask, a masked row's ones (it draws nothing)."""
        if not state.masks:
            return ()
        live = set(rows)
        out = []
        for i, (_, shape) in enumerate(state.dropout_calls):
            ones = torch.ones((size, *shape), device=device)
            out.append(torch.stack([state.masks[(j, s)][0][i] if j in live else ones for j in range(k)]))
        return tuple(out)
