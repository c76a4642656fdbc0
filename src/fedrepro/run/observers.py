"""What watches a run's rounds without changing them: each observer declares the state it keeps (``saves``,
the keys it adds to a checkpoint and a fork state) and the files it writes when the run ends.

    trained(trainer, plan, updates)            the cohort trained; the server has not stepped yet
    stepped(trainer, plan, updates, x_new, row) the server stepped; an observer may add columns to the row
    round_done(trainer, row, diverged)         the round's row is complete (``row["round"]`` rounds done)
    finish(trainer)                            the run ended: write the observer's files

Observers only read the run's state: none of them draws from a generator the training draws from, so a run
with or without them computes the same numbers (the Hessian draws from its own seeded generators).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from fedrepro import metrics
from fedrepro.errors import FedreproError
from fedrepro.evaluation import eval_mode
from fedrepro.functional import FunctionalModel
from fedrepro.identity import stable_hash
from fedrepro.run import checkpoint


class Preempted(FedreproError):
    """SIGTERM arrived (Slurm preemption or time limit): a checkpoint was saved."""


class Observer:
    saves: tuple[str, ...] = ()

    def state(self) -> dict:
        return {}

    def restore(self, state: dict) -> None:
        pass

    def trained(self, trainer, plan, updates) -> None:
        pass

    def stepped(self, trainer, plan, updates, x_new: torch.Tensor, row: dict) -> None:
        pass

    def round_done(self, trainer, row: dict, diverged: bool) -> None:
        pass

    def finish(self, trainer) -> None:
        pass


class MetricsRows(Observer):
    """metrics.csv's rows, one a round, kept in checkpoints so a resumed run writes every round."""

    saves = ("rows",)

    def __init__(self):
        self.rows: list[dict] = []

    def state(self) -> dict:
        return {"rows": self.rows}

    def restore(self, state: dict) -> None:
        self.rows = list(state["rows"])

    def round_done(self, trainer, row, diverged):
        row["wall_time"] = time.time()  # when the round ended: MLflow's timestamp for its metrics
        self.rows.append(row)


def _from_end(rounds, total: int) -> set[int]:
    """Rounds counted from 1, or from the end when negative (-1: the last)."""
    return {r if r > 0 else total + 1 + r for r in rounds}


class Snapshots(Observer):
    """Figures (docs/figures.md): the global model, the first clients' models and the next global model of the
    rounds the setting's ``snapshots.rounds`` lists."""

    saves = ("snapshots",)

    def __init__(self, setting: dict):
        snap = setting["snapshots"]
        self.rounds = _from_end(snap["rounds"], setting["rounds"])
        self.clients = snap["clients"]
        self.arrays: dict[str, np.ndarray] = {}

    def state(self) -> dict:
        return {"snapshots": {k: torch.from_numpy(v) for k, v in self.arrays.items()}}

    def restore(self, state: dict) -> None:
        # a state loaded onto a GPU holds these there too; numpy needs them on the host
        self.arrays = {k: v.cpu().numpy() for k, v in state.get("snapshots", {}).items()}

    def trained(self, trainer, plan, updates):
        # before the server step, which may rescale the deltas in place
        if plan.t + 1 in self.rounds:
            self.arrays[f"round_{plan.t + 1}_global"] = plan.x.cpu().numpy()
            kept = min(self.clients, len(updates.deltas))
            for j in range(kept):
                self.arrays[f"round_{plan.t + 1}_client_{j}"] = (plan.x - updates.deltas[j]).cpu().numpy()
            # their data sizes, so a figure can average any m of them as the server would (IMA Fig. 4)
            self.arrays[f"round_{plan.t + 1}_sizes"] = updates.sizes[:kept].double().cpu().numpy()

    def stepped(self, trainer, plan, updates, x_new, row):
        if plan.t + 1 in self.rounds:
            self.arrays[f"round_{plan.t + 1}_next"] = x_new.cpu().numpy()

    def finish(self, trainer):
        if self.arrays:
            np.savez(trainer.paths.snapshots, **self.arrays)


class Cosines(Observer):
    """The clients' pairwise update cosines of round 1, every tenth round and ``snapshots.cosine_rounds``."""

    saves = ("cosines",)

    def __init__(self, setting: dict):
        self.rounds = _from_end(setting["snapshots"]["cosine_rounds"], setting["rounds"])
        self.matrices: dict[str, np.ndarray] = {}

    def state(self) -> dict:
        return {"cosines": {k: torch.from_numpy(v) for k, v in self.matrices.items()}}

    def restore(self, state: dict) -> None:
        self.matrices = {k: v.cpu().numpy() for k, v in state["cosines"].items()}

    def stepped(self, trainer, plan, updates, x_new, row):
        t = plan.t
        if (t + 1) % 10 == 0 or t == 0 or t + 1 in self.rounds:
            self.matrices[f"round_{t + 1}"] = metrics.cosine_matrix(updates.deltas).cpu().numpy()

    def finish(self, trainer):
        if self.matrices:
            np.savez_compressed(trainer.paths.cosines, **self.matrices)


class HessianLog(Observer):
    """FedLAW Fig. 10: the top Hessian eigenvalues of the training loss at the new global model, in round 1 and
    every ``hessian.every`` rounds."""

    def __init__(self, setting: dict):
        self.config, self.seed = setting["hessian"], setting["seed"]

    def stepped(self, trainer, plan, updates, x_new, row):
        every = self.config["every"]
        if every and (plan.t == 0 or (plan.t + 1) % every == 0):
            row.update(self.top_eigenvalues(trainer))

    def top_eigenvalues(self, trainer) -> dict:
        import torch.nn.functional as F

        from fedrepro.run import hessian

        cfg, model, train = self.config, trainer.model, trainer.inputs.train
        g = torch.Generator().manual_seed(self.seed)
        index = torch.randperm(len(train), generator=g)[: cfg["samples"]].to(trainer.device)
        x, y = train.batch(index)
        net = FunctionalModel(model.module)
        with eval_mode(model.module):
            values, _ = hessian.top_eigen(
                lambda w: F.cross_entropy(net(w, x), y), model.flat, cfg["k"], cfg["steps"], self.seed
            )
        top, last = float(values[0]), float(values[-1])
        return {"hessian_top1": top, "hessian_topk": last, "hessian_ratio": top / last if last else float("nan")}


class Checkpoints(Observer):
    """A checkpoint every ``every`` rounds and on SIGTERM, so a killed job resumes where it stopped. It holds
    the trainer's state and every observer's declared state; a checkpoint of another setting is not resumed."""

    def __init__(self, every: int = 10):
        self.every = every

    def save(self, trainer, next_round: int) -> None:
        checkpoint.save(trainer.state(next_round), trainer.paths.checkpoint, digest=True)

    def round_done(self, trainer, row, diverged):
        if diverged:
            return
        done = row["round"]
        if trainer.stop_requested:
            self.save(trainer, done)
            raise Preempted(f"SIGTERM after round {done}; checkpoint saved")
        if self.every and done % self.every == 0 and done < trainer.setting["rounds"]:
            self.save(trainer, done)

    def resume(self, trainer) -> bool:
        """Restore the run's checkpoint when there is one of this setting."""
        path = trainer.paths.checkpoint
        checkpoint.remove_partial(trainer.paths.root)  # writes a kill interrupted
        if not path.exists():
            return False
        try:
            state = checkpoint.load(path, trainer.device)
        except checkpoint.CheckpointError as err:
            aside = checkpoint.set_aside(path)
            print(f"warning: {err}; set aside as {aside.name}, starting over", file=sys.stderr)
            return False
        if state["setting_hash"] != stable_hash(trainer.setting):
            return False
        trainer.restore(state)
        return True

    def discard(self, trainer) -> None:
        """The run's summary is written: its checkpoint serves nothing more."""
        trainer.paths.checkpoint.unlink(missing_ok=True)
