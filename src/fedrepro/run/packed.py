"""Packed runs: several federated runs in one process, their rounds' clients trained as one computation.

Each run keeps everything of its own: its setting, partition, batch-order streams, server state, checkpoints,
fork states, metrics and summary; each runs its own unchanged ``Trainer.run`` loop. The runs take turns, one at
a time in a fixed order (each in its own thread, only one of which is ever running): a run goes until it has
planned its next round's local training (``Trainer.train_cohort``), then hands the turn on. When every run still
training has planned, the pack trains all those plans: the runs whose clients compute the same program (the same
model architecture and training data, no client terms, nothing drawn from torch's global generator, the same
local rule and learning rate this round) as one batched computation, runs x clients stacked, each row starting
from its own run's model and BatchNorm statistics; every other run its own round, batched where it can be.

* **Streams.** torch's global generator is each run's own: its state is put back when the run takes its turn
  and kept when it hands it on, so a run draws (dropout, augmentation, a server part's draws) exactly as alone.
* **Equal to alone.** A stacked row is the batched path's computation on the same numbers, so a run's result
  equals the run trained alone within the bound batched and sequential agree within (tests/run/test_packed.py).
* **Stops alone.** A run that diverges, fails or finishes ends its loop and leaves the turn order; the pack goes
  on with the others. A killed pack resumes each run from its own checkpoint (the loop is ``Trainer.run``).
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field

import torch

from fedrepro.parts import RoundUpdates
from fedrepro.run.batchable import dropout_layers
from fedrepro.run.batched import BatchedSGD
from fedrepro.run.process import main_thread


@dataclass
class _Member:
    trainer: object
    rng: torch.Tensor
    cuda_rng: torch.Tensor | None = None
    plan: object = None  # the round it has planned and waits to have trained
    result: RoundUpdates | None = None
    done: bool = False
    outcome: object = None  # its summary, or the exception that ended it
    thread: threading.Thread | None = field(default=None, repr=False)


class PackedRuns:
    """Trainers (already built, in the order they take turns) trained as one pack."""

    def __init__(self, trainers: list, max_together: int = 256):
        if not trainers:
            raise ValueError("a pack needs at least one run")
        self.members = []
        for trainer in trainers:
            trainer.pack = self
            trainer.cohort_mode = "on"  # a pack trains batched wherever a run can, on every device
            cuda = torch.cuda.get_rng_state(trainer.device) if trainer.device.type == "cuda" else None
            self.members.append(_Member(trainer, torch.get_rng_state(), cuda))
        self.max_together = max_together
        self._turn = 0
        self._cond = threading.Condition()
        self._engines: dict[str, BatchedSGD] = {}
        self.stacked_rounds = 0  # rounds in which more than one run trained in one computation

    # ---------------------------------------------------------------- the turns

    def _by(self, trainer) -> _Member:
        return next(m for m in self.members if m.trainer is trainer)

    def _take_turn(self, me: _Member) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.members[self._turn] is me)
        torch.set_rng_state(me.rng)
        if me.cuda_rng is not None:
            torch.cuda.set_rng_state(me.cuda_rng, me.trainer.device)

    def _hand_on(self, me: _Member) -> None:
        """Keep ``me``'s streams; train the pending plans if every run still training has one; pass the turn."""
        me.rng = torch.get_rng_state()
        if me.cuda_rng is not None:
            me.cuda_rng = torch.cuda.get_rng_state(me.trainer.device)
        live = [m for m in self.members if not m.done]
        if live and all(m.plan is not None and m.result is None for m in live):
            self._train_pending(live)
        with self._cond:
            if live and all(m.result is not None for m in live):
                self._turn = self.members.index(live[0])  # a new cycle: each in order takes its updates
            elif live:  # the next run still to plan (a later one in order: the cycle wraps only after a step)
                n = len(self.members)
                self._turn = next(
                    i % n
                    for i in range(self.members.index(me) + 1, self.members.index(me) + n + 1)
                    if not self.members[i % n].done
                )
            self._cond.notify_all()

    def train(self, trainer, plan) -> RoundUpdates:
        """``Trainer.train_cohort`` of a run in this pack: hand the plan in and wait for its updates."""
        me = self._by(trainer)
        me.plan, me.result = plan, None
        self._hand_on(me)
        self._take_turn(me)
        result, me.plan, me.result = me.result, None, None
        if isinstance(result, BaseException):
            raise result
        return result

    def _member_main(self, me: _Member, run_kwargs: dict) -> None:
        self._take_turn(me)
        try:
            me.outcome = me.trainer.run(**run_kwargs)
        except BaseException as err:  # noqa: BLE001 (a run that fails stops alone)
            me.outcome = err
        finally:
            me.done, me.plan = True, None
            self._hand_on(me)

    def run(self, **run_kwargs) -> list:
        """Every run's ``Trainer.run(**run_kwargs)``; each one's summary, or the exception that ended it."""
        return self.run_each(lambda trainer: run_kwargs)

    def run_each(self, kwargs_of) -> list:
        """Every run's ``Trainer.run(**kwargs_of(trainer))`` (a run's own fork state, say)."""
        previous = signal.signal(signal.SIGTERM, self._on_sigterm) if main_thread() else None
        try:
            for m in self.members:
                kwargs = {"progress": False, **kwargs_of(m.trainer)}
                m.thread = threading.Thread(target=self._member_main, args=(m, kwargs), daemon=True)
                m.thread.start()
            for m in self.members:
                m.thread.join()
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        return [m.outcome for m in self.members]

    def _on_sigterm(self, signum, frame):
        for m in self.members:  # each run checkpoints and stops at its next round's end
            m.trainer.stop_requested = True

    # ---------------------------------------------------------------- the pack's step

    def _train_pending(self, live: list[_Member]) -> None:
        groups: dict[tuple, list[_Member]] = {}
        for m in live:
            key = self.stack_key(m.trainer, m.plan)
            groups.setdefault(key if key is not None else ("alone", id(m)), []).append(m)
        for key, members in groups.items():
            try:
                if key[0] == "alone" or len(members) == 1:
                    for m in members:
                        self._alone(m)
                else:
                    self._stacked(key, members)
                    self.stacked_rounds += 1
            except Exception as err:  # noqa: BLE001 (the runs of this computation fail; the others go on)
                for m in members:
                    if m.result is None:
                        m.result = err

    def _alone(self, m: _Member) -> None:
        trainer, plan = m.trainer, m.plan
        torch.set_rng_state(m.rng)  # its own draws (dropout, crops) from its own stream
        if m.cuda_rng is not None:
            torch.cuda.set_rng_state(m.cuda_rng, trainer.device)
        if trainer.train_together(plan.cohort):
            m.result = trainer.batched.train(
                plan.t, plan.cohort, plan.x, plan.lr, plan.epochs, plan.batches, trainer.model.buffers
            )
        else:
            m.result = trainer.train_sequentially(plan)
        m.rng = torch.get_rng_state()
        if m.cuda_rng is not None:
            m.cuda_rng = torch.cuda.get_rng_state(trainer.device)

    @staticmethod
    def stack_key(trainer, plan) -> tuple | None:
        """What runs must share to train in one computation this round; None: this run trains alone."""
        module, train = trainer.model.module, trainer.inputs.train
        if (
            trainer.algorithm.corrections
            or trainer.algorithm.objective is not None
            or dropout_layers(module)
            or train.augment
            or trainer.client_momentum is not None
            or not trainer.train_together(plan.cohort)
        ):
            return None
        return (
            repr(module),
            _data_key(train),
            str(trainer.device),
            trainer.local.momentum,
            trainer.local.weight_decay,
            trainer.setting["step_graph"],  # a run's step is part of what it is: only runs of one step stack
            plan.lr,
        )

    def _stacked(self, key: tuple, members: list[_Member]) -> None:
        first = members[0].trainer
        engine_key = (key[0], key[-2])  # the architecture and the step_graph
        if engine_key not in self._engines:
            self._engines[engine_key] = first.batched.sgd_like(first.model.module, first.local, self.max_together)
        engine = self._engines[engine_key]
        engine.rule = first.local
        plans = [
            p for m in members for p in m.trainer.batched.plans(m.plan.t, m.plan.cohort, m.plan.epochs, m.plan.batches)
        ]
        rows = [len(m.plan.cohort) for m in members]
        device = first.device
        clients = torch.cat([torch.as_tensor(m.plan.cohort, device=device) for m in members])
        starts = torch.cat([m.plan.x.expand(n, -1) for m, n in zip(members, rows)])
        has_buffers = len(first.model.buffers) > 0
        buffers = (
            torch.cat([m.trainer.model.buffers.expand(n, -1) for m, n in zip(members, rows)]) if has_buffers else None
        )
        was = first.model.module.training
        first.model.module.train()
        try:
            finals, client_buffers, steps, losses = engine.train(
                min(m.plan.t for m in members), first.inputs.train, clients, plans, starts, key[-1], buffers
            )
        finally:
            first.model.module.train(was)
        lo = 0
        for m, n in zip(members, rows):
            hi, trainer = lo + n, m.trainer
            mine = clients[lo:hi]
            updates = RoundUpdates(
                m.plan.t,
                mine,
                m.plan.x - finals[lo:hi],
                trainer.inputs.client_sizes[mine],
                torch.tensor(steps[lo:hi], dtype=torch.float32, device=device),
                losses[lo:hi],
                m.plan.lr,
                buffers=None if client_buffers is None else client_buffers[lo:hi],
            )
            if client_buffers is not None:
                trainer.model.buffers.copy_(updates.weights @ client_buffers[lo:hi])
            m.result = updates
            lo = hi


def _data_key(train) -> tuple:
    """Runs stack only on the same training data: the same tensors (the same storage: a pack loads each data set
    once and gives it to every run that trains on it)."""
    tensors = tuple(
        (name, value.data_ptr(), tuple(value.shape))
        for name, value in sorted(vars(train).items())
        if isinstance(value, torch.Tensor)
    )
    return (type(train).__name__, tensors)
