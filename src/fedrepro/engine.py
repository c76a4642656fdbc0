"""One federated run: the round loop, its metrics, checkpoints and summary.

    for t in rounds:
        cohort  <- drawn from a generator seeded by (seed, t)   # same clients for every method
        Delta_i <- x - LocalTrain_i(x)                           # client objective of the method
        x       <- algorithm.server_step(x, updates)             # aggregator, optimizer, post-step hooks
        log metrics; checkpoint every k rounds

A run may be a parent of runs that share its first rounds (docs/forks.md, fedrepro.forks): at each round
such a child forks from, it keeps its complete state (a checkpoint plus the last models its children's
parts need) in ``fork/kept-<round>.pt``, and trains on. A child starts from that state through the path a
checkpoint resume takes, and ends with the numbers it would have had trained from round 0.
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
from fedrepro import batched
# scoring lives below the engine, where the methods that score models use it too
from fedrepro.evaluation import (eval_mode, evaluate, global_train_loss, proxy_indices, score, split_test,  # noqa: F401
                                 validation_set, validation_split)
from fedrepro.catalog import cohort_size
from fedrepro.identity import partition_id, partition_setting, stable_hash
from fedrepro.flat import FlatModel
from fedrepro.functional import FunctionalModel
from fedrepro.parts import ClientRun, RoundUpdates
from fedrepro.provenance import device_line, run_provenance
from fedrepro.rundir import RunDir
from fedrepro.errors import FedreproError, SetupError

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
        raise SetupError(
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


class ForkError(FedreproError):
    """A fork state that cannot serve this run; the message names the file."""


class Preempted(FedreproError):
    """SIGTERM arrived (Slurm preemption or time limit): a checkpoint was saved."""


def swap_labels(train, parts: list[np.ndarray], corruption: dict, num_clients: int):
    """A copy of ``train`` whose samples of the first round(fraction x num_clients) clients have the classes
    ``swap`` = (a, b) exchanged (a becomes b, b becomes a); the partition is disjoint, so no other client
    is touched. The test set keeps its true labels."""
    import copy

    corrupted = round(corruption["fraction"] * num_clients)
    index = torch.as_tensor(np.concatenate([parts[i] for i in range(corrupted)]), device=train.labels.device)
    a, b = corruption["swap"]
    labels = train.labels.clone()
    picked = labels[index]
    labels[index] = torch.where(picked == a, b, torch.where(picked == b, a, picked))
    out = copy.copy(train)
    out.labels = labels
    return out


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
            raise partition.PartitionError(f"partition {partition_dir} has {len(self.parts)} clients, the setting "
                                           f"asks for num_clients = {setting['num_clients']}; rerun its partition step")
        # evaluation.validation (tuning runs): the clients train on the rest, and every evaluation scores the
        # pooled validation samples instead of the test set (evaluation.validation_split)
        validation = setting["evaluation"].get("validation", 0.0)
        if validation:
            self.parts, held = validation_split(self.parts, validation, setting["seed"])
            self.test = validation_set(self.train, held)
        # client.holdout: each client trains on the rest and the held-out samples serve nothing (FedLAW's
        # code only logs an accuracy on them); the aggregation weights keep the full n_i, as that code does
        holdout = setting["client"].get("holdout", 0.0)
        trained = [holdout_split(p, holdout, setting["seed"], i)[0] if holdout else p for i, p in enumerate(self.parts)]
        self.client_index = [torch.as_tensor(p, device=self.device) for p in trained]
        self.train_parts = [torch.as_tensor(p, device=self.device) for p in self.parts]
        if setting.get("corruption"):  # FedLAW Table 8: the first clients' labels with two classes swapped
            self.train = swap_labels(self.train, self.parts, setting["corruption"], setting["num_clients"])
        self.client_sizes = torch.tensor([len(p) for p in self.parts], dtype=torch.float32, device=self.device)
        # FedLAW Fig. 7 / Table 11: each client's class distribution (rows) and the data-size weighted global one
        self.class_counts = None
        if setting.get("log_cohort_classes"):
            labels = self.train.labels.cpu().numpy()
            counts = partition.class_counts(labels, self.parts, int(labels.max()) + 1)
            self.class_counts = counts
            self.class_share = torch.as_tensor(counts / counts.sum(1, keepdims=True).clip(min=1), device=self.device,
                                               dtype=torch.float32)
            self.global_share = self.class_share.T @ (self.client_sizes / self.client_sizes.sum())
        # client groups the partition defines (hybrid: balanced, imbalanced): their coherence is logged per round
        self.client_groups = partition.groups(partition_setting(setting))
        torch.manual_seed(setting["seed"])
        module = (models.build(setting["model"], setting["dataset"], setting.get("pretrained"),
                               setting.get("batchnorm", "running_stats")) if module is None else module)
        self.model = FlatModel(module, self.device)
        self.test, self.proxy = split_test(self.test, setting["evaluation"]["proxy_holdout"], setting["seed"],
                                           setting["evaluation"].get("proxy_long_tail_rho", 1.0))
        self.algorithm = algorithms.build(setting, num_clients=setting["num_clients"], dim=self.model.numel,
                                          device=self.device, client_sizes=self.client_sizes,
                                          module=self.model.module, proxy=self.proxy)
        self.local = LocalSGD(setting["client"]["momentum"], setting["client"]["weight_decay"])
        # client.keep_momentum: every client's SGD momentum buffer lives across rounds (clients x P floats)
        self.client_momentum = (torch.zeros(setting["num_clients"], self.model.numel, device=self.device)
                                if setting["client"].get("keep_momentum") else None)
        # "auto": train a round's clients together (batched.py) where it pays; "on"/"off" force it
        self.cohort_mode = "auto"
        self._batched = None
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
        # forks: the rounds at which this run keeps its state for children (round -> file), the number
        # of last global models the children's parts need (IMA's window), and where this run forked from
        self.keep_forks: dict[int, Path] = {}
        self.history_length = 0
        self.history: list[torch.Tensor] = []
        self.forked_from: dict | None = None
        self.ended_diverged = False

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
        if self.train_together(cohort, client_epochs):
            return batched.train_round(self, t, cohort, x, lr, client_epochs, client_batches)
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
        """The batched path (batched.py) takes the round unless the model, data or method has no batched
        form; "auto" takes it on CUDA, where it measurably pays."""
        if self.cohort_mode == "off" or (self.cohort_mode == "auto" and self.device.type != "cuda"):
            return False
        return len(cohort) > 1 and not batched.unsupported(self.model.module, self.train, self.algorithm.corrections,
                                                           self.algorithm.objective)

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
               "model_norm": float(x_new.norm()),  # ||w_g|| after the server step (FedLAW Fig. 10, left)
               "pseudo_grad_norm": updates.info.get("pseudo_grad_norm", float("nan")),
               "coherence": float(metrics.coherence(updates.deltas)),
               "update_norm_mean": float(updates.deltas.norm(dim=1).mean()),
               "update_norm_max": float(updates.deltas.norm(dim=1).max()),
               "update_norm_min": float(updates.deltas.norm(dim=1).min())}
        for name, members in self.client_groups.items():
            inside = torch.as_tensor(np.isin(cohort, members), device=updates.deltas.device)
            row[f"coherence_{name}"] = float(metrics.coherence(updates.deltas[inside]))  # nan below 2 clients
        if self.class_counts is not None:
            weights = updates.info.get("weights", updates.weights)
            weights = weights if isinstance(weights, torch.Tensor) and weights.numel() == len(cohort) else updates.weights
            cohort_share = self.class_share[updates.clients].T @ weights.to(self.class_share.dtype)
            row.update({f"cohort_class_{c}": float(v) for c, v in enumerate(cohort_share)})
            row["cohort_class_tv"] = float(0.5 * (cohort_share - self.global_share).abs().sum())
        for key, value in updates.info.items():
            if key == "pseudo_grad_norm":
                continue
            if isinstance(value, dict):  # per client: one column per client id (FedLAW's lambda_client)
                row.update({f"{key}_{k}": float(v) for k, v in value.items()})
            elif isinstance(value, torch.Tensor) and value.numel() > 1:
                row[f"{key}_max"] = float(value.max())
                row[f"{key}_min"] = float(value.min())
            else:
                row[key] = float(value)
        every = s.get("hessian", {}).get("every", 0)
        if every and (t == 0 or (t + 1) % every == 0):
            row.update(self.hessian_row())
        if (t + 1) % 10 == 0 or t == 0 or t + 1 in self.cosine_rounds:
            self.cosines[f"round_{t + 1}"] = metrics.cosine_matrix(updates.deltas).cpu().numpy()
        last = s["rounds"] - t <= LAST_ROUNDS
        if t % s["eval_every"] == 0 or last:
            row.update(score(self.model.module, self.test))  # multi-domain: per domain and their mean
        else:
            row["test_acc"] = row["test_loss"] = float("nan")
        every = s["evaluation"]["global_train_loss_every"]
        if every and ((t + 1) % every == 0 or t == 0 or t + 1 == s["rounds"]):
            # the objective every client's samples define (self.parts: a client's held-out samples count)
            row["global_train_loss"] = global_train_loss(self.model.module, self.train, self.train_parts)
        else:
            row["global_train_loss"] = float("nan")
        row["seconds"] = time.perf_counter() - tic
        return row

    def hessian_row(self) -> dict:
        """FedLAW Fig. 10: the top Hessian eigenvalues of the training loss at the current global model."""
        import torch.nn.functional as F

        from fedrepro import hessian
        cfg = self.setting["hessian"]
        g = torch.Generator().manual_seed(self.setting["seed"])
        index = torch.randperm(len(self.train), generator=g)[:cfg["samples"]].to(self.device)
        x, y = self.train.batch(index)
        net = FunctionalModel(self.model.module)
        with eval_mode(self.model.module):
            values, _ = hessian.top_eigen(lambda w: F.cross_entropy(net(w, x), y), self.model.flat, cfg["k"],
                                          cfg["steps"], self.setting["seed"])
        top, last = float(values[0]), float(values[-1])
        return {"hessian_top1": top, "hessian_topk": last, "hessian_ratio": top / last if last else float("nan")}

    # ------------------------------------------------------------------ checkpoints

    def state(self, next_round: int) -> dict:
        state = {"next_round": next_round, "x": self.model.flat, "buffers": self.model.buffers,
                 "algorithm": self.algorithm.state_dict(),
                 "rows": self.rows, "elapsed": self.elapsed, "setting_hash": stable_hash(self.setting),
                 "cosines": {k: torch.from_numpy(v) for k, v in self.cosines.items()},
                 "client_momentum": self.client_momentum,
                 "snapshots": {k: torch.from_numpy(v) for k, v in self.snapshots.items()},
                 # the global torch streams: dropout and on-device augmentation draw from them
                 "torch_rng": torch.get_rng_state(),
                 "history": list(self.history), "forked_from": self.forked_from}
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def save_checkpoint(self, next_round: int) -> None:
        checkpoint.save(self.state(next_round), self.paths.checkpoint, digest=True)

    def restore(self, state: dict) -> None:
        """Continue from a saved state: a checkpoint of this run or a parent's fork state."""
        self.model.flat.copy_(state["x"])
        if "buffers" in state:  # checkpoints written before the engine carried buffers hold none
            self.model.buffers.copy_(state["buffers"])
        self.algorithm.load_state_dict(state["algorithm"])
        if self.client_momentum is not None:
            self.client_momentum.copy_(state["client_momentum"])
        self.rows = list(state["rows"])
        self.elapsed = float(state["elapsed"])
        # a state loaded onto a GPU holds these there too; numpy needs them on the host
        self.cosines = {k: v.cpu().numpy() for k, v in state["cosines"].items()}
        self.snapshots = {k: v.cpu().numpy() for k, v in state.get("snapshots", {}).items()}
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"].cpu())
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"].cpu(), self.device)
        self.history = [h.clone() for h in state.get("history", [])][-self.history_length:] \
            if self.history_length else []
        self.forked_from = state.get("forked_from")
        self.start_round = int(state["next_round"])

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
        self.restore(state)
        return True

    # ------------------------------------------------------------------ forks

    def fork_state(self, next_round: int, diverged: bool = False) -> dict:
        """What a child needs to start at ``next_round`` as if it had trained rounds 0..next_round-1 itself:
        this run's complete state, its setting (the child checks it shares the prefix) and its last models."""
        return {**self.state(next_round), "fork": {"run": self.paths.id, "round": next_round,
                                                   "setting": self.setting, "diverged": diverged}}

    def keep_fork_states(self, done: int, diverged: bool) -> None:
        """Write the fork state of every kept round reached; a run that diverged before a kept round writes
        its state at the divergence there, since a child would diverge in the same round."""
        for round_, path in self.keep_forks.items():
            if round_ == done or (diverged and round_ > done):
                if len(self.history) < min(self.history_length, done):
                    # resumed from a checkpoint written without the models a child needs: keep nothing,
                    # the fork step trains the prefix again (fedrepro fork)
                    print(f"warning: round {round_}: {len(self.history)} of the {self.history_length} last models "
                          f"a child needs are kept; no fork state written", file=sys.stderr)
                    continue
                checkpoint.save(self.fork_state(done, diverged), path, digest=True)

    def start_from_fork(self, path: str | Path, accepts) -> None:
        """Start from a parent's fork state; ``accepts(parent_setting, round)`` says whether this run shares
        the parent's rounds 0..round-1 (fedrepro.forks decides that from the setting's declarations)."""
        try:
            state = checkpoint.load(path, self.device)
        except checkpoint.CheckpointError as err:
            raise ForkError(str(err)) from None
        fork = state.get("fork")
        if not fork or int(state["next_round"]) != fork["round"]:
            raise ForkError(f"{path}: not a fork state")
        if stable_hash(fork["setting"]) != state["setting_hash"] or not accepts(fork["setting"], fork["round"]):
            raise ForkError(f"{path}: run {fork['run']} does not share its first {fork['round']} rounds with this run")
        self.restore(state)
        for part in self.algorithm.parts().values():
            part.start_from_fork(state.get("history", []))
        self.forked_from = {"run": fork["run"], "round": fork["round"]}
        self.ended_diverged = bool(fork.get("diverged"))

    # ------------------------------------------------------------------ run

    def run(self, checkpoint_every: int = 10, progress: bool = True, stop_after: int | None = None,
            observer=None, fork_from: str | Path | None = None, accepts=None) -> dict:
        """``observer`` (tracking.LiveRun) hears of the start, each round and the end; it must never raise.
        ``fork_from``: a parent's fork state to start from when there is no checkpoint of this run."""
        from tqdm import tqdm

        resumed = self.try_resume()
        if not resumed and fork_from is not None:
            self.start_from_fork(fork_from, accepts)
        observer = observer or _Silent()
        print(device_line(self.device, self.start_round if resumed or self.forked_from else None), file=sys.stderr,
              flush=True)
        observer.started(self, resumed or self.forked_from is not None)  # the shared rounds are logged too
        previous = signal.signal(signal.SIGTERM, self._on_sigterm) if _main_thread() else None
        status = "finished"
        last = self.start_round if self.ended_diverged else self.setting["rounds"]
        if self.ended_diverged:  # the parent diverged before the fork round: so does this run, in that round
            status = "diverged"
        rounds = range(self.start_round, last)
        bar = tqdm(rounds, desc=self.paths.root.name[:40], disable=not progress, mininterval=2.0,
                   initial=self.start_round, total=self.setting["rounds"])
        try:
            for t in bar:
                row = self.round(t)
                row["wall_time"] = time.time()  # when the round ended: MLflow's timestamp for its metrics
                self.rows.append(row)
                observer.round_done(self, row)
                self.elapsed += row["seconds"]
                done = t + 1
                if self.history_length:
                    self.history = [*self.history[-(self.history_length - 1):], self.model.flat.clone()] \
                        if self.history_length > 1 else [self.model.flat.clone()]
                if diverged(row, self.model.flat):
                    status = "diverged"
                    self.keep_fork_states(done, diverged=True)
                    break
                self.keep_fork_states(done, diverged=False)
                if not math.isnan(row["test_acc"]):
                    bar.set_postfix(acc=f"{row['test_acc']:.4f}", loss=f"{row['train_loss']:.3f}")
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
            "code_hash": identity.code_hash(self.setting["algorithm"], self.setting["plugins"], self.setting["dataset"],
                                            self.setting["model"]),
            "partition_hash": self.partition_hash,
            "final_acc": float(acc.tail(LAST_ROUNDS).mean()) if status == "finished" else float("nan"),
            "best_acc": float(acc.max()) if len(acc) else float("nan"),
            "final_loss": float(frame["test_loss"].dropna().tail(LAST_ROUNDS).mean()) if len(acc) else float("nan"),
            "e_ludd": float(frame["e_lud"].mean()),
            # which samples the accuracies (metrics.csv's test_acc/test_loss included) are of
            "scored_on": "validation" if self.setting["evaluation"].get("validation") else "test",
            "rounds_done": len(frame), "runtime_s": self.elapsed, "resumed": resumed,
            # rounds 0..round-1 were trained by that run (its fork state), not again by this one
            "forked_from": self.forked_from,
            "kept_forks": {"rounds": sorted(self.keep_forks), "history": self.history_length},
            **run_provenance(self.device),
        }
        if self.class_counts is not None:  # Table 11: client sizes and heterogeneity from these
            summary["client_class_counts"] = self.class_counts.tolist()
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


def fork_state(setting: dict, run_dir, round_: int, history: int, out, partition_dir, data_root) -> str:
    """The state of run ``run_dir`` after ``round_`` rounds, with its last ``history`` models, at ``out``: the
    one the run kept while it trained (moved, not copied), else that prefix trained again, which gives the
    same bytes (a run that finished before a child asked for this round, or a kept state already used)."""
    import os
    import shutil

    paths, out = RunDir(Path(run_dir)), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = paths.kept_fork(round_)
    if kept.exists():
        try:
            state = checkpoint.load(kept)
            usable = (state.get("fork", {}).get("round") == round_ and state["setting_hash"] == stable_hash(setting)
                      and len(state.get("history", [])) >= min(history, round_))
        except checkpoint.CheckpointError as err:
            print(f"warning: {err}; training the prefix again", file=sys.stderr)
            usable = False
        if usable:
            os.replace(kept, out)
            return "kept"
    scratch = out.parent / f".prefix-{round_}"
    trainer = Trainer(setting, scratch / paths.id, partition_dir, data_root)  # the fork state names the run
    trainer.keep_forks, trainer.history_length = {round_: out}, history
    trainer.run(checkpoint_every=10, progress=False, stop_after=round_)
    shutil.rmtree(scratch, ignore_errors=True)
    if not out.exists():
        raise ForkError(f"{out}: training {paths.id}'s first {round_} rounds wrote no fork state")
    return "trained"


def train(setting: dict, run_dir, partition_dir, data_root, checkpoint_every: int = 10, progress: bool = True,
          stop_after: int | None = None, observer=None, keep_forks: list[int] = (), history: int = 0,
          fork_from: str | Path | None = None, accepts=None) -> dict:
    """``keep_forks``: rounds at which to keep a fork state for children (with the last ``history`` models);
    ``fork_from``: a parent's fork state to start from (``accepts`` checks the parent's setting)."""
    trainer = Trainer(setting, run_dir, partition_dir, data_root)
    trainer.keep_forks = {int(r): trainer.paths.kept_fork(int(r)) for r in keep_forks}
    trainer.history_length = history
    return trainer.run(checkpoint_every, progress, stop_after, observer, fork_from, accepts)
