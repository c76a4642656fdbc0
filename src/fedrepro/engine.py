"""One federated run: the round loop, its metrics, checkpoints and summary.

    for t in rounds:
        cohort  <- drawn from a generator seeded by (seed, t)   # same clients for every method
        Delta_i <- x - LocalTrain_i(x)                           # client objective of the method
        x       <- algorithm.server_step(x, updates)             # aggregator, optimizer, post-step hooks
        log metrics; checkpoint every k rounds
"""
from __future__ import annotations

import functools
import math
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fedrepro import algorithms, checkpoint, data, identity, metrics, models, partition, streams
from fedrepro.client import LocalSGD, client_generator, holdout_split, lr_schedule as client_lr_schedule
from fedrepro.cohort import CohortSGD, equal_steps, random_layers
# scoring lives below the engine, where the methods that score models use it too
from fedrepro.evaluation import eval_mode, evaluate, proxy_indices, split_test  # noqa: F401
from fedrepro.identity import cohort_size, partition_id, partition_setting, stable_hash
from fedrepro.flat import FlatModel
from fedrepro.parts import ClientRun, RoundUpdates
from fedrepro.provenance import device_line, run_provenance
from fedrepro.rundir import RunDir

LAST_ROUNDS = 10  # the papers report the mean test accuracy of the last 10 rounds


# Variables through which a scheduler hands a job its GPUs (Slurm's, then the CUDA runtime's).
GPU_GRANT_VARIABLES = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES")


def granted_gpus(environ=None) -> str | None:
    """The GPUs this job was given (``NAME=value``), or None. An empty or ``-1`` CUDA_VISIBLE_DEVICES
    hides every GPU on purpose, so it grants none."""
    import os
    environ = os.environ if environ is None else environ
    for name in GPU_GRANT_VARIABLES:
        value = environ.get(name, "").strip()
        if value and value not in ("-1", "NoDevFiles"):
            return f"{name}={value}"
    return None


def pick_device(name: str, environ=None) -> torch.device:
    """``auto`` is CUDA when torch sees it; a job that was given a GPU but sees no CUDA fails
    instead of training silently on the CPU (a driver older than torch's CUDA, a broken module)."""
    if name == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    grant = granted_gpus(environ)
    if name == "cuda" or grant:
        why = f"this job was given a GPU ({grant})" if grant else "device: cuda was asked for"
        built = torch.version.cuda or "none: a CPU-only build"
        raise RuntimeError(
            f"{why}, but torch {torch.__version__} (built for CUDA {built}) sees no CUDA device. Check "
            "`nvidia-smi` and that the driver supports this CUDA version; set device: cpu to train on the CPU "
            "on purpose")
    return torch.device("cpu")




def cohort_draw(seed: int, round_: int, num_clients: int, k: int, warmup: str = "none") -> np.ndarray:
    """The k clients of a round in the order they were drawn, from (seed, round) alone: the same for every
    method of a comparison, and on resume. Uniform without replacement (numpy's ``choice`` order, uniformly
    random), or, with ``warmup: permutation``, FedAWARE's exploration in rounds 0 .. ceil(N/k) - 1
    (``exploration_draws``) and uniform afterwards."""
    rng = streams.rng("cohort", seed, round_)
    if warmup == "permutation" and round_ < math.ceil(num_clients / k):
        chunk = exploration_draws(seed, num_clients, k)[round_]
        others = np.setdiff1d(np.arange(num_clients), chunk)
        return np.concatenate([chunk, rng.choice(others, size=k - len(chunk), replace=False)])
    return rng.choice(num_clients, size=k, replace=False)


@functools.lru_cache(maxsize=8)
def exploration_draws(seed: int, num_clients: int, k: int) -> tuple[np.ndarray, ...]:
    """FedAWARE's FeedbackSampler exploration, step for step: a shuffled list of all N clients (our
    permutation, seeded by the run's seed, where the code calls ``random.shuffle``); each round takes the
    list's first k and keeps ``list(set(rest) - set(taken))``. That list comes in CPython's set order, which
    is ascending for ids below the set's table size and wraps around it otherwise (the code's seed-1998 run
    draws [96, 97, 98, 99, 89, ...] in its tenth round), so the order is computed with a Python set, as the
    code computes it. A last partial chunk is topped up by ``cohort_draw`` (the code samples fewer)."""
    remaining = [int(i) for i in streams.rng("warmup", seed).permutation(num_clients)]
    draws = []
    while remaining:
        taken = remaining[:k]
        draws.append(np.asarray(taken, dtype=np.int64))
        remaining = list(set(remaining) - set(taken))
    return tuple(draws)


def sample_cohort(seed: int, round_: int, num_clients: int, k: int, warmup: str = "none") -> np.ndarray:
    """The round's clients in ascending id order, the order in which they train (as FedLab's trainers do)."""
    return np.sort(cohort_draw(seed, round_, num_clients, k, warmup))


def code_pairing(seed: int, round_: int, num_clients: int, k: int, warmup: str = "none") -> np.ndarray:
    """``cohort.assignment: code``: the ids FedAWARE's code credits the round's uploads to, the j-th upload
    (clients train in ascending id order) to the j-th id of the sampler's draw (``sampler.last_sampled``,
    unsorted). Round 0 (the head of a shuffled list), every uniform round (numpy's ``choice`` order) and the
    exploration rounds whose set order wraps are permuted; exploration rounds in ascending order are not."""
    return cohort_draw(seed, round_, num_clients, k, warmup)


class Preempted(Exception):
    """SIGTERM arrived (Slurm preemption or time limit): a checkpoint was saved."""


class Trainer:
    def __init__(self, setting: dict, run_dir: str | Path, partition_dir: str | Path | None, data_root: str | Path | None,
                 *, datasets: tuple[data.TensorDataset, data.TensorDataset] | None = None,
                 parts: list[np.ndarray] | None = None, module: torch.nn.Module | None = None):
        """``datasets`` (train, test), ``parts`` and ``module`` replace loading from disk (benchmark, tests)."""
        self.setting = setting
        self.paths = RunDir(Path(run_dir))
        self.paths.root.mkdir(parents=True, exist_ok=True)
        self.device = pick_device(setting["device"])
        if datasets is None:
            datasets = tuple(data.load(setting["dataset"], data_root, train=split, preprocess=setting.get("preprocess"),
                                       pretrained=setting.get("pretrained")) for split in (True, False))
        self.train, self.test = (d.to(self.device) for d in datasets)
        # the partition its path names, not another one copied there (partition.json is compared)
        self.parts = partition.load(partition_dir, partition_setting(setting)) if parts is None else parts
        self.partition_hash = partition.content_hash(self.parts)
        if len(self.parts) != setting["num_clients"]:
            raise ValueError(f"partition {partition_dir} has {len(self.parts)} clients, the setting asks for "
                             f"{setting['num_clients']}")
        # client.holdout: each client trains on the rest and the held-out samples serve nothing (FedLAW's
        # code only logs an accuracy on them); the aggregation weights keep the full n_i, as that code does
        holdout = setting["client"].get("holdout", 0.0)
        trained = [holdout_split(p, holdout, setting["seed"], i)[0] if holdout else p for i, p in enumerate(self.parts)]
        self.client_index = [torch.as_tensor(p, device=self.device) for p in trained]
        self.client_sizes = torch.tensor([len(p) for p in self.parts], dtype=torch.float32, device=self.device)
        # client groups the partition defines (hybrid: balanced, imbalanced): their coherence is logged per round
        self.client_groups = partition.groups(partition_setting(setting))
        torch.manual_seed(setting["seed"])
        module = (models.build(setting["model"], setting["dataset"], setting.get("pretrained"),
                               setting.get("batchnorm", "running_stats")) if module is None else module)
        self.model = FlatModel(module, self.device)
        self.test, self.proxy = split_test(self.test, setting["evaluation"]["proxy_holdout"], setting["seed"])
        self.algorithm = algorithms.build(setting, num_clients=setting["num_clients"], dim=self.model.numel,
                                          device=self.device, client_sizes=self.client_sizes,
                                          module=self.model.module, proxy=self.proxy)
        self.local = LocalSGD(setting["client"]["momentum"], setting["client"]["weight_decay"])
        # client.keep_momentum: every client's SGD momentum buffer lives across rounds (clients x P floats)
        self.client_momentum = (torch.zeros(setting["num_clients"], self.model.numel, device=self.device)
                                if setting["client"].get("keep_momentum") else None)
        # "auto": train equal-step cohorts together (cohort.py) where it pays; "on"/"off" force it
        self.cohort_mode = "auto"
        self._cohort_sgd = None
        self.random_layers = random_layers(self.model.module)  # dropout keeps clients sequential (cohort.py)
        self.k = cohort_size(setting)
        self.rows: list[dict] = []
        self.cosines: dict[str, np.ndarray] = {}
        # figures (docs/figures.md): models and cosine matrices of the rounds the setting lists
        snap = setting.get("snapshots", {})
        from_end = lambda rounds: {r if r > 0 else setting["rounds"] + 1 + r for r in rounds}
        self.snapshot_rounds = from_end(snap.get("rounds", []))
        self.snapshot_clients = snap.get("clients", 2)
        self.cosine_rounds = from_end(snap.get("cosine_rounds", []))
        self.snapshots: dict[str, np.ndarray] = {}
        self.start_round = 0
        self.elapsed = 0.0
        self._stop = False

    # ------------------------------------------------------------------ round

    def client_lr(self, t: int) -> float:
        schedule = getattr(self.algorithm, "lr_schedule", None) or client_lr_schedule(self.setting)
        return schedule(t)

    def local_training(self, t: int, cohort: np.ndarray, x: torch.Tensor, lr: float) -> RoundUpdates:
        s = self.setting
        deltas = torch.empty(len(cohort), self.model.numel, device=self.device)
        steps = torch.empty(len(cohort), device=self.device)
        losses = torch.empty(len(cohort), device=self.device)
        epochs = getattr(self.algorithm, "local_epochs", None)
        client_epochs = [epochs(t, int(c)) if epochs else s["local_epochs"] for c in cohort]
        batch = getattr(self.algorithm, "batch_size", None)  # +random_batch
        client_batches = [batch(t, int(c), len(self.client_index[c])) if batch else s["batch_size"] for c in cohort]
        if batch is None and self.train_together(cohort, client_epochs):
            return self._cohort_training(t, cohort, x, lr, client_epochs[0])
        # BatchNorm running statistics: every client starts from the global ones; the weighted mean of
        # its final ones (data-size weights, as the official FedAvg codes) is the next global statistics
        global_buffers = self.model.buffers.clone()
        client_buffers = torch.empty(len(cohort), len(global_buffers), device=self.device)
        for j, c in enumerate(cohort):
            e = client_epochs[j]
            self.model.buffers.copy_(global_buffers)
            run = ClientRun(t, int(c), self.model, x, lr)
            result = self.local.train(run, self.train, self.client_index[c], e, client_batches[j],
                                      self.shuffle_generator(t, int(c)), self.algorithm.corrections,
                                      self.algorithm.objective,
                                      None if self.client_momentum is None else self.client_momentum[c])
            torch.sub(x, self.model.flat, out=deltas[j])
            client_buffers[j] = self.model.buffers
            steps[j] = result.steps
            losses[j] = result.loss
        clients = torch.as_tensor(cohort, device=self.device)
        updates = RoundUpdates(t, clients, deltas, self.client_sizes[clients], steps, losses, lr,
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

    def train_together(self, cohort: np.ndarray, client_epochs: list[int]) -> bool:
        """The vmapped cohort path applies when every client runs the same steps, the method
        changes no client's gradient and the model has no dropout; "auto" takes it on CUDA, where it
        measurably pays."""
        if self.cohort_mode == "off" or (self.cohort_mode == "auto" and self.device.type != "cuda"):
            return False
        # on-device augmentation draws from the global RNG client after client; a batched draw
        # would give other crops, so augmented data stays on the sequential path
        # kept momentum buffers and BatchNorm running statistics are per-client state the vmapped
        # path does not carry (a vmapped BatchNorm cannot update one module's buffers per client)
        return (len(cohort) > 1 and self.client_momentum is None and not len(self.model.buffers)
                and not self.algorithm.corrections and self.algorithm.objective is None
                and not self.train.augment and self.train.batched_cohort
                and not self.random_layers
                and equal_steps([self.client_index[c] for c in cohort], client_epochs))

    def _cohort_training(self, t: int, cohort: np.ndarray, x: torch.Tensor, lr: float, epochs: int) -> RoundUpdates:
        s = self.setting
        if self._cohort_sgd is None:
            self._cohort_sgd = CohortSGD(self.model.module, self.local)
        finals, steps, losses = self._cohort_sgd.train(
            self.train, [self.client_index[c] for c in cohort], x, lr, epochs, s["batch_size"],
            [self.shuffle_generator(t, int(c)) for c in cohort])
        clients = torch.as_tensor(cohort, device=self.device)
        steps_per_client = torch.full((len(cohort),), float(steps), device=self.device)
        return RoundUpdates(t, clients, x - finals, self.client_sizes[clients], steps_per_client, losses, lr)

    def round(self, t: int) -> dict:
        s = self.setting
        tic = time.perf_counter()
        cohort = sample_cohort(s["seed"], t, s["num_clients"], self.k, s["cohort"]["warmup"])
        x = self.model.flat.clone()
        lr = self.client_lr(t)
        self.model.module.train()  # clients train in train mode (dropout on); scoring switches to eval
        updates = self.local_training(t, cohort, x, lr)
        if t + 1 in self.snapshot_rounds:  # before the server step, which may rescale the deltas in place
            self.snapshots[f"round_{t + 1}_global"] = x.cpu().numpy()
            kept = min(self.snapshot_clients, len(updates.deltas))
            for j in range(kept):
                self.snapshots[f"round_{t + 1}_client_{j}"] = (x - updates.deltas[j]).cpu().numpy()
            # their data sizes, so a figure can average any m of them as the server would (IMA Fig. 4)
            self.snapshots[f"round_{t + 1}_sizes"] = updates.sizes[:kept].double().cpu().numpy()
        if s["cohort"].get("assignment", "per_client") == "code":
            # after the snapshots and the BatchNorm average, which the code pairs right: only the server's
            # bookkeeping (momenta, data-size weights, per-client state) credits upload j to credited[j]
            credited = torch.as_tensor(code_pairing(s["seed"], t, s["num_clients"], self.k, s["cohort"]["warmup"]),
                                       device=self.device)
            updates.clients, updates.sizes = credited, self.client_sizes[credited]
        x_new = self.algorithm.server_step(x, updates)
        if t + 1 in self.snapshot_rounds:
            self.snapshots[f"round_{t + 1}_next"] = x_new.cpu().numpy()
        self.model.flat.copy_(x_new)
        row = {"round": t + 1, "lr": lr, "train_loss": float(updates.losses.mean()),
               "e_lud": float(metrics.e_lud(updates.deltas)),
               "global_norm": float(updates.weighted_mean().norm()),
               "step_norm": float((x_new - x).norm()),
               "pseudo_grad_norm": updates.info.get("pseudo_grad_norm", float("nan")),
               "coherence": float(metrics.coherence(updates.deltas)),
               "update_norm_mean": float(updates.deltas.norm(dim=1).mean()),
               "update_norm_max": float(updates.deltas.norm(dim=1).max()),
               "update_norm_min": float(updates.deltas.norm(dim=1).min())}
        for name, members in self.client_groups.items():
            inside = torch.as_tensor(np.isin(cohort, members), device=updates.deltas.device)
            row[f"coherence_{name}"] = float(metrics.coherence(updates.deltas[inside]))  # nan below 2 clients
        for key, value in updates.info.items():
            if key == "pseudo_grad_norm":
                continue
            if isinstance(value, torch.Tensor) and value.numel() > 1:
                row[f"{key}_max"] = float(value.max())
                row[f"{key}_min"] = float(value.min())
            else:
                row[key] = float(value)
        if (t + 1) % 10 == 0 or t == 0 or t + 1 in self.cosine_rounds:
            self.cosines[f"round_{t + 1}"] = metrics.cosine_matrix(updates.deltas).cpu().numpy()
        last = s["rounds"] - t <= LAST_ROUNDS
        if t % s["eval_every"] == 0 or last:
            row["test_acc"], row["test_loss"] = evaluate(self.model.module, self.test)
        else:
            row["test_acc"] = row["test_loss"] = float("nan")
        row["seconds"] = time.perf_counter() - tic
        return row

    # ------------------------------------------------------------------ checkpoints

    def state(self, next_round: int) -> dict:
        return {"next_round": next_round, "x": self.model.flat, "buffers": self.model.buffers,
                "algorithm": self.algorithm.state_dict(),
                "rows": self.rows, "elapsed": self.elapsed, "setting_hash": stable_hash(self.setting),
                "cosines": {k: torch.from_numpy(v) for k, v in self.cosines.items()},
                "client_momentum": self.client_momentum,
                "snapshots": {k: torch.from_numpy(v) for k, v in self.snapshots.items()}}

    def save_checkpoint(self, next_round: int) -> None:
        checkpoint.save(self.state(next_round), self.paths.checkpoint, digest=True)

    def try_resume(self) -> bool:
        checkpoint.remove_partial(self.paths.root)  # writes a kill interrupted
        if not self.paths.checkpoint.exists():
            return False
        try:
            state = checkpoint.load(self.paths.checkpoint, self.device)
        except checkpoint.CheckpointError as err:
            aside = checkpoint.set_aside(self.paths.checkpoint)
            print(f"warning: {err}; set aside as {aside.name}, starting over", file=sys.stderr)
            return False
        if state["setting_hash"] != stable_hash(self.setting):
            return False
        self.model.flat.copy_(state["x"])
        if "buffers" in state:  # checkpoints written before the engine carried buffers hold none
            self.model.buffers.copy_(state["buffers"])
        self.algorithm.load_state_dict(state["algorithm"])
        if self.client_momentum is not None:
            self.client_momentum.copy_(state["client_momentum"])
        self.rows = list(state["rows"])
        self.elapsed = float(state["elapsed"])
        self.cosines = {k: v.numpy() for k, v in state["cosines"].items()}
        self.snapshots = {k: v.numpy() for k, v in state.get("snapshots", {}).items()}
        self.start_round = int(state["next_round"])
        return True

    # ------------------------------------------------------------------ run

    def run(self, checkpoint_every: int = 10, progress: bool = True, stop_after: int | None = None,
            observer=None) -> dict:
        """``observer`` (tracking.LiveRun) hears of the start, each round and the end; it must never raise."""
        from tqdm import tqdm

        resumed = self.try_resume()
        observer = observer or _Silent()
        print(device_line(self.device, self.start_round if resumed else None), file=sys.stderr, flush=True)
        observer.started(self, resumed)
        previous = signal.signal(signal.SIGTERM, self._on_sigterm) if _main_thread() else None
        status = "finished"
        rounds = range(self.start_round, self.setting["rounds"])
        bar = tqdm(rounds, desc=self.paths.root.name[:40], disable=not progress, mininterval=2.0,
                   initial=self.start_round, total=self.setting["rounds"])
        try:
            for t in bar:
                row = self.round(t)
                row["wall_time"] = time.time()  # when the round ended: MLflow's timestamp for its metrics
                self.rows.append(row)
                observer.round_done(self, row)
                self.elapsed += row["seconds"]
                if diverged(row, self.model.flat):
                    status = "diverged"
                    break
                if not math.isnan(row["test_acc"]):
                    bar.set_postfix(acc=f"{row['test_acc']:.4f}", loss=f"{row['train_loss']:.3f}")
                done = t + 1
                if self._stop:
                    self.save_checkpoint(done)
                    raise Preempted(f"SIGTERM after round {done}; checkpoint saved")
                if checkpoint_every and done % checkpoint_every == 0 and done < self.setting["rounds"]:
                    self.save_checkpoint(done)
                if stop_after is not None and done >= stop_after:
                    self.save_checkpoint(done)
                    observer.ended(self, "interrupted", None)
                    return {"status": "stopped", "round": done}
        except BaseException as err:
            observer.ended(self, "interrupted" if isinstance(err, (Preempted, KeyboardInterrupt)) else "failed", None)
            raise
        finally:
            bar.close()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        summary = self.finish(status, resumed)
        observer.ended(self, status, summary)
        return summary

    def _on_sigterm(self, signum, frame):
        self._stop = True

    def finish(self, status: str, resumed: bool) -> dict:
        import pandas as pd

        frame = pd.DataFrame(self.rows)
        self.paths.write_metrics(frame)
        if self.cosines:
            np.savez_compressed(self.paths.cosines, **self.cosines)
        if self.snapshots:
            np.savez(self.paths.snapshots, **self.snapshots)
        checkpoint.save({"x": self.model.flat.cpu(), "buffers": self.model.buffers.cpu(),
                         "model": self.setting["model"], "dataset": self.setting["dataset"]}, self.paths.model)
        acc = frame["test_acc"].dropna()
        summary = {
            "run": self.paths.root.name, "status": status, "setting": self.setting,
            "setting_hash": stable_hash(self.setting), "partition": partition_id(self.setting),
            "code_hash": identity.code_hash(self.setting["algorithm"], self.setting["plugins"]),
            "partition_hash": self.partition_hash,
            "final_acc": float(acc.tail(LAST_ROUNDS).mean()) if status == "finished" else float("nan"),
            "best_acc": float(acc.max()) if len(acc) else float("nan"),
            "final_loss": float(frame["test_loss"].dropna().tail(LAST_ROUNDS).mean()) if len(acc) else float("nan"),
            "e_ludd": float(frame["e_lud"].mean()),
            "rounds_done": len(frame), "runtime_s": self.elapsed, "resumed": resumed,
            **run_provenance(self.device),
        }
        self.paths.write_summary(summary)
        self.paths.checkpoint.unlink(missing_ok=True)
        return summary


# Quantities a round always computes; NaN in any of them (or inf anywhere) means the run blew up.
# test_loss is NaN by design on rounds without evaluation, so it counts where test_acc is set.
ALWAYS_FINITE = ("train_loss", "step_norm", "global_norm", "update_norm_mean", "update_norm_max")


def diverged(row: dict, x: torch.Tensor) -> bool:
    """Divergence on every quantity that can go non-finite, not the training loss alone: a server step
    can blow up the model (test loss NaN, step norm inf) after a finite local training loss."""
    if any(isinstance(v, float) and math.isinf(v) for v in row.values()):
        return True
    if any(not math.isfinite(row[k]) for k in ALWAYS_FINITE if k in row):
        return True
    if not math.isnan(row.get("test_acc", math.nan)) and not math.isfinite(row.get("test_loss", math.nan)):
        return True
    return not bool(torch.isfinite(x).all())


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` when the parent (Snakemake) dies, even by SIGKILL; SIGTERM makes a run
    save a checkpoint and stop (Trainer._on_sigterm), so no orphan trains on beside the next rerun."""
    import ctypes
    import os

    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


class _Silent:
    """The observer of an untracked run."""

    def started(self, trainer, resumed):
        pass

    def round_done(self, trainer, row):
        pass

    def ended(self, trainer, status, summary):
        pass


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def train(setting: dict, run_dir, partition_dir, data_root, checkpoint_every: int = 10, progress: bool = True,
          stop_after: int | None = None, observer=None) -> dict:
    return Trainer(setting, run_dir, partition_dir, data_root).run(checkpoint_every, progress, stop_after, observer)
