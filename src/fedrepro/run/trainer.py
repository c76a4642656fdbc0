"""One federated run: a short loop of named steps, after Flower's configure/aggregate split.

    for t in rounds:
        plan    <- configure_round(t)        # the cohort, drawn from (seed, t): the same clients for every method;
                                             # the global model, the lr, each client's epochs and batch size
        updates <- train_cohort(plan)        # Delta_i = x - LocalTrain_i(x), one client after another or batched
        x       <- aggregate(plan, updates)  # the method's server step: aggregator, optimiser, post-step hooks
        row     <- observe(plan, updates, x) # metrics; observers keep snapshots, cosines, Hessian columns
        observers: metrics rows, fork states, checkpoints (each declares the state it keeps)

The run's inputs (data, partition, splits) are built before the loop (``fedrepro.run.inputs``); the setting
reaches the trainer resolved, and the trainer never reads the settings' schema or grids.
"""
from __future__ import annotations

import math
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedrepro import algorithms, data, external, identity, models
from fedrepro.errors import FedreproError
from fedrepro.flat import FlatModel
from fedrepro.identity import partition_id, stable_hash
from fedrepro.parts import ClientRun, RoundUpdates
from fedrepro.run import checkpoint, inputs as run_inputs, rows
from fedrepro.run.batched_rounds import BatchedRounds, ClientData
from fedrepro.run.client import LocalSGD, client_generator
from fedrepro.run.cohorts import code_pairing, sample_cohort
from fedrepro.run.fork_states import ForkStates
from fedrepro.run.observers import Checkpoints, Cosines, HessianLog, MetricsRows, Observer, Preempted, Snapshots
from fedrepro.run.process import main_thread, pick_device, set_precision
from fedrepro.run.provenance import device_line, run_provenance
from fedrepro.run.rundir import RunDir
from fedrepro.schedule import cohort_size


@dataclass
class RoundPlan:
    """What ``configure_round`` decides for round t: who trains, from which model, with which lr, epochs and
    batch size (a plug-in may draw a client's epochs or batch size: +random_epochs, +random_batch)."""
    t: int
    cohort: np.ndarray     # the sampled clients in ascending id order, the order they train in
    x: torch.Tensor        # the global model the clients start from
    lr: float
    epochs: list[int]
    batches: list[int]


class Trainer:
    def __init__(self, setting: dict, run_dir: str | Path, partition_dir: str | Path | None,
                 data_root: str | Path | None, *, datasets: tuple[data.TensorDataset, data.TensorDataset] | None = None,
                 parts: list[np.ndarray] | None = None, module: torch.nn.Module | None = None,
                 forks: ForkStates | None = None):
        """``datasets`` (train, test), ``parts`` and ``module`` replace loading from disk (benchmark, tests);
        ``forks``: the rounds at which to keep a fork state for children."""
        self.setting = setting
        self.paths = RunDir(Path(run_dir))
        self.paths.root.mkdir(parents=True, exist_ok=True)
        self.device = pick_device(setting["device"])
        set_precision(setting["precision"])
        self.inputs = run_inputs.build(setting, self.device, partition_dir, data_root, datasets, parts)
        torch.manual_seed(setting["seed"])
        module = (models.build(setting["model"], setting["dataset"], setting["pretrained"],
                               setting["batchnorm"]) if module is None else module)
        self.model = FlatModel(module, self.device)
        self.algorithm = algorithms.build(setting, num_clients=setting["num_clients"], dim=self.model.numel,
                                          device=self.device, client_sizes=self.inputs.client_sizes,
                                          module=self.model.module, proxy=self.inputs.proxy)
        self.local = LocalSGD(setting["client"]["momentum"], setting["client"]["weight_decay"])
        # client.keep_momentum: every client's SGD momentum buffer lives across rounds (clients x P floats)
        self.client_momentum = (torch.zeros(setting["num_clients"], self.model.numel, device=self.device)
                                if setting["client"]["keep_momentum"] else None)
        # "auto": train a round's clients together (batched.py) where it pays; "on"/"off" force it
        self.cohort_mode = "auto"
        self.batched: BatchedRounds | None = None  # built from the run's declared inputs when first asked
        self.pack = None  # the PackedRuns this run trains in (run/packed.py); None: alone
        if setting["step_graph"] != "none":  # refused before training when the static-shape step cannot take it
            self.train_together(np.arange(2))
            if self.batched.why_not:
                raise FedreproError(f"step_graph: {setting['step_graph']} needs the batched path, but "
                                  f"{'; '.join(self.batched.why_not)}; use step_graph: none")
        self.k = cohort_size(setting)
        self.snapshots, self.cosines, self.metrics = Snapshots(setting), Cosines(setting), MetricsRows()
        self.forks, self.checkpoints = forks or ForkStates(), Checkpoints()
        # in the order they see a round: the row's columns come in this order too
        self.observers = [self.snapshots, HessianLog(setting), self.cosines, self.metrics, self.forks, self.checkpoints]
        self.start_round = 0
        self.elapsed = 0.0
        self.stop_requested = False

    @property
    def rows(self) -> list[dict]:
        return self.metrics.rows

    # ------------------------------------------------------------------ the round's steps

    def client_lr(self, t: int) -> float:
        return self.algorithm.client_plan.lr_of(self.setting)(t)

    def configure_round(self, t: int) -> RoundPlan:
        s = self.setting
        cohort = sample_cohort(s["seed"], t, s["num_clients"], self.k, s["cohort"]["warmup"])
        x = self.model.flat.clone()
        lr = self.client_lr(t)
        self.model.module.train()  # clients train in train mode (dropout on); scoring switches to eval
        return self.plan(t, cohort, x, lr)

    def plan(self, t: int, cohort: np.ndarray, x: torch.Tensor, lr: float) -> RoundPlan:
        """Round t's plan for these clients from ``x``: each client's epochs and batch size."""
        client_plan, index = self.algorithm.client_plan, self.inputs.client_index  # as the method declares it
        epochs, batch = client_plan.epochs_of(self.setting), client_plan.batch_of(self.setting)
        return RoundPlan(t, cohort, x, lr, [epochs(t, int(c)) for c in cohort],
                         [batch(t, int(c), len(index[c])) for c in cohort])

    def train_cohort(self, plan: RoundPlan) -> RoundUpdates:
        if self.pack is not None:
            return self.pack.train(self, plan)
        if self.train_together(plan.cohort):
            return self.batched.train(plan.t, plan.cohort, plan.x, plan.lr, plan.epochs, plan.batches,
                                      self.model.buffers)
        return self.train_sequentially(plan)

    def train_sequentially(self, plan: RoundPlan) -> RoundUpdates:
        """The reference path: one client after another on the one shared model."""
        t, cohort, x, lr = plan.t, plan.cohort, plan.x, plan.lr
        deltas = torch.empty(len(cohort), self.model.numel, device=self.device)
        steps = torch.empty(len(cohort), device=self.device)
        losses = torch.empty(len(cohort), device=self.device)
        # BatchNorm running statistics: every client starts from the global ones; the weighted mean of
        # its final ones (data-size weights, as the official FedAvg codes) is the next global statistics
        global_buffers = self.model.buffers.clone()
        client_buffers = torch.empty(len(cohort), len(global_buffers), device=self.device)
        for j, c in enumerate(cohort):
            self.model.buffers.copy_(global_buffers)
            run = ClientRun(t, int(c), self.model, x, lr)
            result = self.local.train(run, self.inputs.train, self.inputs.client_index[c], plan.epochs[j],
                                      plan.batches[j], self.shuffle_generator(t, int(c)), self.algorithm.corrections,
                                      self.algorithm.objective,
                                      None if self.client_momentum is None else self.client_momentum[c])
            torch.sub(x, self.model.flat, out=deltas[j])
            client_buffers[j] = self.model.buffers
            steps[j] = result.steps
            losses[j] = result.loss
        clients = torch.as_tensor(cohort, device=self.device)
        updates = RoundUpdates(t, clients, deltas, self.inputs.client_sizes[clients], steps, losses, lr,
                               buffers=client_buffers if len(global_buffers) else None)
        self.model.buffers.copy_(updates.weights @ client_buffers)
        return updates

    def shuffle_generator(self, t: int, client: int) -> torch.Generator | None:
        """The client's batch-order stream; ``client.shuffle: reseeded`` gives every client in every round the
        same one (a probe of the batch order's weight; no official code reseeds per client)."""
        if self.setting["client"]["shuffle"] == "reseeded":
            return client_generator(self.setting["seed"], 0, 0)
        if self.setting["client"]["shuffle"] == "none":
            return None
        return client_generator(self.setting["seed"], t, client)

    def train_together(self, cohort: np.ndarray) -> bool:
        """The batched path (batched.py) takes the round unless the model, data or method has no batched
        form; "auto" takes it on CUDA, where it measurably pays."""
        static = self.setting["step_graph"] != "none"  # a static-shape step is asked for on every device
        if self.cohort_mode == "off" or (self.cohort_mode == "auto" and self.device.type != "cuda" and not static):
            return False
        if self.batched is None:
            self.batched = BatchedRounds(
                self.model.module, self.local, ClientData(self.inputs.train, self.inputs.client_index,
                                                          self.inputs.client_sizes),
                self.algorithm.corrections, self.algorithm.objective, self.shuffle_generator, self.client_momentum,
                step_graph=self.setting["step_graph"])
        return len(cohort) > 1 and self.batched.ready

    def aggregate(self, plan: RoundPlan, updates: RoundUpdates) -> torch.Tensor:
        s = self.setting
        if s["cohort"]["assignment"] == "code":
            # after the snapshots and the BatchNorm average, which the code pairs right: only the server's
            # bookkeeping (momenta, data-size weights, per-client state) credits upload j to credited[j]
            credited = torch.as_tensor(code_pairing(s["seed"], plan.t, s["num_clients"], self.k, s["cohort"]["warmup"]),
                                       device=self.device)
            updates.clients, updates.sizes = credited, self.inputs.client_sizes[credited]
        x_new = self.algorithm.server_step(plan.x, updates)
        self.model.flat.copy_(x_new)
        return x_new

    def observe(self, plan: RoundPlan, updates: RoundUpdates, x_new: torch.Tensor) -> dict:
        row = rows.update_row(plan.t, plan.cohort, plan.lr, plan.x, x_new, updates, self.inputs)
        for observer in self.observers:
            observer.stepped(self, plan, updates, x_new, row)
        row.update(rows.score_row(plan.t, self.setting, self.model.module, self.inputs))
        return row

    def round(self, t: int) -> dict:
        tic = time.perf_counter()
        plan = self.configure_round(t)
        updates = self.train_cohort(plan)
        for observer in self.observers:
            observer.trained(self, plan, updates)
        x_new = self.aggregate(plan, updates)
        row = self.observe(plan, updates, x_new)
        row["seconds"] = time.perf_counter() - tic
        return row

    # ------------------------------------------------------------------ state

    def state(self, next_round: int) -> dict:
        """The trainer's state and every observer's declared state: what a resume or a child starts from."""
        state = {"next_round": next_round, "x": self.model.flat, "buffers": self.model.buffers,
                 "algorithm": self.algorithm.state_dict(), "elapsed": self.elapsed,
                 "setting_hash": stable_hash(self.setting), "client_momentum": self.client_momentum,
                 # the global torch streams: dropout and on-device augmentation draw from them
                 "torch_rng": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        for observer in self.observers:
            kept = observer.state()
            assert set(kept) == set(observer.saves), f"{type(observer).__name__} saves {sorted(kept)}, " \
                                                     f"declares {sorted(observer.saves)}"
            state.update(kept)
        return state

    def restore(self, state: dict) -> None:
        """Continue from a saved state: a checkpoint of this run or a parent's fork state."""
        self.model.flat.copy_(state["x"])
        if "buffers" in state:  # checkpoints written before the trainer carried buffers hold none
            self.model.buffers.copy_(state["buffers"])
        self.algorithm.load_state_dict(state["algorithm"])
        if self.client_momentum is not None:
            self.client_momentum.copy_(state["client_momentum"])
        self.elapsed = float(state["elapsed"])
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"].cpu())
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"].cpu(), self.device)
        for observer in self.observers:
            observer.restore(state)
        self.start_round = int(state["next_round"])

    # ------------------------------------------------------------------ run

    def run(self, checkpoint_every: int = 10, progress: bool = True, stop_after: int | None = None,
            tracker=None, fork_from: str | Path | None = None, accepts=None) -> dict:
        """``tracker`` (tracking.LiveRun) hears of the start, each round and the end; it must never raise.
        ``fork_from``: a parent's fork state to start from when there is no checkpoint of this run."""
        from tqdm import tqdm

        self.checkpoints.every = checkpoint_every
        resumed = self.checkpoints.resume(self)
        if not resumed and fork_from is not None:
            self.forks.start(self, fork_from, accepts)
        forked = self.forks.forked_from is not None
        tracker = tracker or _Untracked()
        # the tracker logs each row once the metrics rows hold it, before a fork state or checkpoint is written
        watchers = list(self.observers)
        watchers.insert(watchers.index(self.metrics) + 1, _Tracking(tracker))
        print(device_line(self.device, self.start_round if resumed or forked else None), file=sys.stderr, flush=True)
        tracker.started(self, resumed or forked)  # the shared rounds are logged too
        previous = signal.signal(signal.SIGTERM, self._on_sigterm) if main_thread() else None
        status = "finished"
        last = self.start_round if self.forks.ended_diverged else self.setting["rounds"]
        if self.forks.ended_diverged:  # the parent diverged before the fork round: so does this run, in that round
            status = "diverged"
        bar = tqdm(range(self.start_round, last), desc=self.paths.root.name[:40], disable=not progress,
                   mininterval=2.0, initial=self.start_round, total=self.setting["rounds"])
        try:
            for t in bar:
                row = self.round(t)
                self.elapsed += row["seconds"]
                blew_up = rows.diverged(row, self.model.flat)
                for observer in watchers:
                    observer.round_done(self, row, blew_up)
                if blew_up:
                    status = "diverged"
                    break
                if not math.isnan(row["test_acc"]):
                    bar.set_postfix(acc=f"{row['test_acc']:.4f}", loss=f"{row['train_loss']:.3f}")
                if stop_after is not None and t + 1 >= stop_after:
                    self.checkpoints.save(self, t + 1)
                    tracker.ended(self, "interrupted", None)
                    return {"status": "stopped", "round": t + 1}
        except BaseException as err:
            tracker.ended(self, "interrupted" if isinstance(err, (Preempted, KeyboardInterrupt)) else "failed", None)
            raise
        finally:
            bar.close()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        summary = self.finish(status, resumed)
        tracker.ended(self, status, summary)
        return summary

    def _on_sigterm(self, signum, frame):
        self.stop_requested = True

    def finish(self, status: str, resumed: bool) -> dict:
        import pandas as pd

        frame = pd.DataFrame(self.rows)
        self.paths.write_metrics(frame)
        for observer in self.observers:
            observer.finish(self)
        checkpoint.save({"x": self.model.flat.cpu(), "buffers": self.model.buffers.cpu(),
                         "model": self.setting["model"], "dataset": self.setting["dataset"]}, self.paths.model)
        acc = frame["test_acc"].dropna()
        summary = {
            "run": self.paths.root.name, "status": status, "setting": self.setting,
            "setting_hash": stable_hash(self.setting), "partition": partition_id(self.setting),
            "code_hash": identity.run_code_hash(self.setting),
            "partition_hash": self.inputs.partition_hash,
            "final_acc": float(acc.tail(rows.LAST_ROUNDS).mean()) if status == "finished" else float("nan"),
            "best_acc": float(acc.max()) if len(acc) else float("nan"),
            "final_loss": (float(frame["test_loss"].dropna().tail(rows.LAST_ROUNDS).mean()) if len(acc)
                           else float("nan")),
            "e_ludd": float(frame["e_lud"].mean()),
            # which samples the accuracies (metrics.csv's test_acc/test_loss included) are of
            "scored_on": "validation" if self.setting["evaluation"]["validation"] else "test",
            "rounds_done": len(frame), "runtime_s": self.elapsed, "resumed": resumed,
            # rounds 0..round-1 were trained by that run (its fork state), not again by this one
            "forked_from": self.forks.forked_from,
            "kept_forks": {"rounds": sorted(self.forks.keep), "history": self.forks.history_length},
            **run_provenance(self.device),
            # a method of the user's own package: its module, package and version ({} for fedrepro's methods)
            **external.provenance([self.setting["algorithm"], *self.setting["plugins"]]),
        }
        if self.inputs.class_counts is not None:  # Table 11: client sizes and heterogeneity from these
            summary["client_class_counts"] = self.inputs.class_counts.tolist()
        self.paths.write_summary(summary)
        self.checkpoints.discard(self)
        return summary


class _Tracking(Observer):
    """The tracker hears of each round's row (it keeps no state of the run)."""

    def __init__(self, tracker):
        self.tracker = tracker

    def round_done(self, trainer, row, diverged):
        self.tracker.round_done(trainer, row)


class _Untracked:
    """The tracker of an untracked run."""

    def started(self, trainer, resumed):
        pass

    def round_done(self, trainer, row):
        pass

    def ended(self, trainer, status, summary):
        pass
