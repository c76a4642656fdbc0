"""One federated run: the round loop, its metrics, checkpoints and summary.

    for t in rounds:
        cohort  <- drawn from a generator seeded by (seed, t)   # same clients for every method
        Delta_i <- x - LocalTrain_i(x)                           # client objective of the method
        x       <- algorithm.server_step(x, updates)             # aggregator, transforms, optimizer, hooks
        log metrics; checkpoint every k rounds
"""
from __future__ import annotations

import dataclasses
import json
import math
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedrepro import algorithms, checkpoint, data, metrics, models, partition, registry
from fedrepro.client import LocalSGD, client_generator, lr_schedule as client_lr_schedule
from fedrepro.cohort import CohortSGD, equal_steps
from fedrepro.config import ROOT, cohort_size, partition_id, stable_hash
from fedrepro.flat import FlatModel
from fedrepro.parts import RoundUpdates

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


def device_line(device: torch.device, resumed_at: int | None) -> str:
    """The first line of every train log: where it runs, with what, and whether it resumed."""
    where = str(device)
    if device.type == "cuda":
        where += f" ({torch.cuda.get_device_name(device)})"
    cuda = torch.version.cuda or "none"
    start = f"resumed at round {resumed_at}" if resumed_at is not None else "fresh start"
    return f"fedrepro train: device {where}; torch {torch.__version__}, CUDA {cuda}; {start}"


def sample_cohort(seed: int, round_: int, num_clients: int, k: int) -> np.ndarray:
    rng = np.random.default_rng([seed, round_])
    return np.sort(rng.choice(num_clients, size=k, replace=False))


@torch.no_grad()
def evaluate(model: torch.nn.Module, test: data.TensorDataset, batch_size: int = 4096) -> tuple[float, float]:
    correct = torch.zeros((), device=test.labels.device)
    loss = torch.zeros((), device=test.labels.device)
    training = model.training
    model.eval()  # dropout off, normalisation on running statistics; training resumes in its own mode
    try:
        for start in range(0, len(test), batch_size):
            index = torch.arange(start, min(start + batch_size, len(test)), device=test.labels.device)
            x, y = test.batch(index)
            logits = model(x)
            loss += torch.nn.functional.cross_entropy(logits, y, reduction="sum")
            correct += (logits.argmax(1) == y).sum()
    finally:
        model.train(training)
    return float(correct) / len(test), float(loss) / len(test)


class Preempted(Exception):
    """SIGTERM arrived (Slurm preemption or time limit): a checkpoint was saved."""


@dataclass
class RunPaths:
    root: Path

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.csv"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def model(self) -> Path:
        return self.root / "model.pt"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint.pt"

    @property
    def cosines(self) -> Path:
        return self.root / "cosines.npz"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict:
    import torchvision
    from fedrepro import __version__
    return {"python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__,
            "numpy": np.__version__, "fedrepro": __version__}


class Trainer:
    def __init__(self, setting: dict, run_dir: str | Path, partition_dir: str | Path | None, data_root: str | Path | None,
                 *, datasets: tuple[data.TensorDataset, data.TensorDataset] | None = None,
                 parts: list[np.ndarray] | None = None, module: torch.nn.Module | None = None):
        """``datasets`` (train, test), ``parts`` and ``module`` replace loading from disk (benchmark, tests)."""
        self.setting = setting
        self.paths = RunPaths(Path(run_dir))
        self.paths.root.mkdir(parents=True, exist_ok=True)
        self.device = pick_device(setting["device"])
        if datasets is None:
            datasets = tuple(data.load(setting["dataset"], data_root, train=split, preprocess=setting.get("preprocess"),
                                       pretrained=setting.get("pretrained")) for split in (True, False))
        self.train, self.test = (d.to(self.device) for d in datasets)
        self.parts = partition.load(partition_dir) if parts is None else parts
        self.partition_hash = partition.content_hash(self.parts)
        if len(self.parts) != setting["num_clients"]:
            raise ValueError(f"partition {partition_dir} has {len(self.parts)} clients, the setting asks for "
                             f"{setting['num_clients']}")
        self.client_index = [torch.as_tensor(p, device=self.device) for p in self.parts]
        self.client_sizes = torch.tensor([len(p) for p in self.parts], dtype=torch.float32, device=self.device)
        torch.manual_seed(setting["seed"])
        module = (models.build(setting["model"], setting["dataset"], setting.get("pretrained")) if module is None
                  else module)
        self.model = FlatModel(module, self.device)
        self.algorithm = algorithms.build(setting, num_clients=setting["num_clients"], dim=self.model.numel,
                                          device=self.device, client_sizes=self.client_sizes,
                                          context=self)
        held_out = getattr(self.algorithm, "proxy_index", None)
        if held_out is not None:  # the server's proxy samples (FedLAW) are no longer test samples
            keep = torch.ones(len(self.test), dtype=torch.bool, device=self.device)
            keep[held_out.to(self.device)] = False
            # replace() keeps the dataset's own class (CIFAR's per-channel normalisation)
            self.test = dataclasses.replace(self.test, images=self.test.images[keep], labels=self.test.labels[keep])
        self.local = LocalSGD(setting["client"]["momentum"], setting["client"]["weight_decay"])
        # "auto": train equal-step cohorts together (cohort.py) where it pays; "on"/"off" force it
        self.cohort_mode = "auto"
        self._cohort_sgd = None
        self.k = cohort_size(setting)
        self.rows: list[dict] = []
        self.cosines: dict[str, np.ndarray] = {}
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
        if self.train_together(cohort, client_epochs):
            return self._cohort_training(t, cohort, x, lr, client_epochs[0])
        for j, c in enumerate(cohort):
            e = client_epochs[j]
            result = self.local.train(self.model, self.train, self.client_index[c], x, lr, e, s["batch_size"],
                                      client_generator(s["seed"], t, int(c)), int(c), self.algorithm.corrections,
                                      self.algorithm.objective, t)
            torch.sub(x, self.model.flat, out=deltas[j])
            steps[j] = result.steps
            losses[j] = result.loss
        clients = torch.as_tensor(cohort, device=self.device)
        return RoundUpdates(t, clients, deltas, self.client_sizes[clients], steps, losses, lr)

    def train_together(self, cohort: np.ndarray, client_epochs: list[int]) -> bool:
        """The vmapped cohort path applies when every client runs the same steps and the method
        changes no client's gradient; "auto" takes it on CUDA, where it measurably pays."""
        if self.cohort_mode == "off" or (self.cohort_mode == "auto" and self.device.type != "cuda"):
            return False
        # on-device augmentation draws from the global RNG client after client; a batched draw
        # would give other crops, so augmented data stays on the sequential path
        return (len(cohort) > 1 and not self.algorithm.corrections and self.algorithm.objective is None
                and not getattr(self.train, "augment", False) and getattr(self.train, "batched_cohort", True)
                and equal_steps([self.client_index[c] for c in cohort], client_epochs))

    def _cohort_training(self, t: int, cohort: np.ndarray, x: torch.Tensor, lr: float, epochs: int) -> RoundUpdates:
        s = self.setting
        if self._cohort_sgd is None:
            self._cohort_sgd = CohortSGD(self.model.module, self.local.momentum, self.local.weight_decay)
        finals, steps, losses = self._cohort_sgd.train(
            self.train, [self.client_index[c] for c in cohort], x, lr, epochs, s["batch_size"],
            [client_generator(s["seed"], t, int(c)) for c in cohort])
        clients = torch.as_tensor(cohort, device=self.device)
        steps_per_client = torch.full((len(cohort),), float(steps), device=self.device)
        return RoundUpdates(t, clients, x - finals, self.client_sizes[clients], steps_per_client, losses, lr)

    def round(self, t: int) -> dict:
        s = self.setting
        tic = time.perf_counter()
        cohort = sample_cohort(s["seed"], t, s["num_clients"], self.k)
        x = self.model.flat.clone()
        lr = self.client_lr(t)
        updates = self.local_training(t, cohort, x, lr)
        x_new = self.algorithm.server_step(x, updates)
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
        for key, value in updates.info.items():
            if key == "pseudo_grad_norm":
                continue
            if isinstance(value, torch.Tensor) and value.numel() > 1:
                row[f"{key}_max"] = float(value.max())
                row[f"{key}_min"] = float(value.min())
            else:
                row[key] = float(value)
        if (t + 1) % 10 == 0 or t == 0:
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
        return {"next_round": next_round, "x": self.model.flat, "algorithm": self.algorithm.state_dict(),
                "rows": self.rows, "elapsed": self.elapsed, "setting_hash": stable_hash(self.setting),
                "cosines": {k: torch.from_numpy(v) for k, v in self.cosines.items()}}

    def save_checkpoint(self, next_round: int) -> None:
        checkpoint.save(self.state(next_round), self.paths.checkpoint)

    def try_resume(self) -> bool:
        if not self.paths.checkpoint.exists():
            return False
        state = checkpoint.load(self.paths.checkpoint, self.device)
        if state["setting_hash"] != stable_hash(self.setting):
            return False
        self.model.flat.copy_(state["x"])
        self.algorithm.load_state_dict(state["algorithm"])
        self.rows = list(state["rows"])
        self.elapsed = float(state["elapsed"])
        self.cosines = {k: v.numpy() for k, v in state["cosines"].items()}
        self.start_round = int(state["next_round"])
        return True

    # ------------------------------------------------------------------ run

    def run(self, checkpoint_every: int = 10, progress: bool = True, stop_after: int | None = None) -> dict:
        from tqdm import tqdm

        resumed = self.try_resume()
        print(device_line(self.device, self.start_round if resumed else None), file=sys.stderr, flush=True)
        previous = signal.signal(signal.SIGTERM, self._on_sigterm) if _main_thread() else None
        status = "finished"
        rounds = range(self.start_round, self.setting["rounds"])
        bar = tqdm(rounds, desc=self.paths.root.name[:40], disable=not progress, mininterval=2.0,
                   initial=self.start_round, total=self.setting["rounds"])
        try:
            for t in bar:
                row = self.round(t)
                self.rows.append(row)
                self.elapsed += row["seconds"]
                if not math.isfinite(row["train_loss"]):
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
                    return {"status": "stopped", "round": done}
        finally:
            bar.close()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        return self.finish(status, resumed)

    def _on_sigterm(self, signum, frame):
        self._stop = True

    def finish(self, status: str, resumed: bool) -> dict:
        import pandas as pd

        frame = pd.DataFrame(self.rows)
        frame.to_csv(self.paths.metrics, index=False)
        if self.cosines:
            np.savez_compressed(self.paths.cosines, **self.cosines)
        checkpoint.save({"x": self.model.flat.cpu(), "model": self.setting["model"],
                         "dataset": self.setting["dataset"]}, self.paths.model)
        acc = frame["test_acc"].dropna()
        summary = {
            "run": self.paths.root.name, "status": status, "setting": self.setting,
            "setting_hash": stable_hash(self.setting), "partition": partition_id(self.setting),
            "code_hash": registry.code_hash(self.setting["algorithm"], self.setting["plugins"]),
            "partition_hash": self.partition_hash,
            "final_acc": float(acc.tail(LAST_ROUNDS).mean()) if status == "finished" else float("nan"),
            "best_acc": float(acc.max()) if len(acc) else float("nan"),
            "final_loss": float(frame["test_loss"].dropna().tail(LAST_ROUNDS).mean()) if len(acc) else float("nan"),
            "e_ludd": float(frame["e_lud"].mean()),
            "rounds_done": len(frame), "runtime_s": self.elapsed, "resumed": resumed,
            "device": str(self.device) + (f" ({torch.cuda.get_device_name()})" if self.device.type == "cuda" else ""),
            "host": platform.node(), "cpu_threads": torch.get_num_threads(),
            "versions": versions(), "git_commit": git_commit(),
        }
        self.paths.summary.write_text(json.dumps(summary, indent=2, default=float))
        self.paths.checkpoint.unlink(missing_ok=True)
        return summary


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def train(setting: dict, run_dir, partition_dir, data_root, checkpoint_every: int = 10, progress: bool = True,
          stop_after: int | None = None) -> dict:
    return Trainer(setting, run_dir, partition_dir, data_root).run(checkpoint_every, progress, stop_after)
