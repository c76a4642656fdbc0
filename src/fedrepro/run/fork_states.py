"""A run as a parent of runs that share its first rounds (docs/forks.md): at each round a child forks from, it
keeps its complete state (a checkpoint plus the last models its children's parts need) in
``fork/kept-<round>.pt``, and trains on. A child starts from that state through the path a checkpoint resume
takes, and ends with the numbers it would have had trained from round 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from fedrepro.errors import FedreproError
from fedrepro.identity import stable_hash
from fedrepro.run import checkpoint
from fedrepro.run.observers import Observer


class ForkError(FedreproError):
    """A fork state that cannot serve this run; the message names the file."""


class ForkStates(Observer):
    """``keep``: the rounds at which this run keeps its state for children (round -> file); ``history_length``:
    the number of last global models the children's parts need (IMA's window); ``forked_from``: the run and round
    this run started from."""

    saves = ("history", "forked_from")

    def __init__(self, keep: dict[int, Path] | None = None, history_length: int = 0):
        self.keep = dict(keep or {})
        self.history_length = history_length
        self.history: list[torch.Tensor] = []
        self.forked_from: dict | None = None
        self.ended_diverged = False

    def state(self) -> dict:
        return {"history": list(self.history), "forked_from": self.forked_from}

    def restore(self, state: dict) -> None:
        self.history = (
            [h.clone() for h in state.get("history", [])][-self.history_length :] if self.history_length else []
        )
        self.forked_from = state.get("forked_from")

    def round_done(self, trainer, row, diverged):
        done = row["round"]
        if self.history_length:
            self.history = (
                [*self.history[-(self.history_length - 1) :], trainer.model.flat.clone()]
                if self.history_length > 1
                else [trainer.model.flat.clone()]
            )
        self.keep_states(trainer, done, diverged)

    def keep_states(self, trainer, done: int, diverged: bool) -> None:
        """Write the fork state of every kept round reached; a run that diverged before a kept round writes
        its state at the divergence there, since a child would diverge in the same round."""
        for round_, path in self.keep.items():
            if round_ == done or (diverged and round_ > done):
                if len(self.history) < min(self.history_length, done):
                    # resumed from a checkpoint written without the models a child needs: keep nothing,
                    # the fork step trains the prefix again (fedrepro fork)
                    print(
                        f"warning: round {round_}: {len(self.history)} of the {self.history_length} last models "
                        f"a child needs are kept; no fork state written",
                        file=sys.stderr,
                    )
                    continue
                checkpoint.save(self.fork_state(trainer, done, diverged), path, digest=True)

    @staticmethod
    def fork_state(trainer, next_round: int, diverged: bool = False) -> dict:
        """What a child needs to start at ``next_round`` as if it had trained rounds 0..next_round-1 itself:
        the parent's complete state, its setting (the child checks it shares the prefix) and its last models."""
        return {
            **trainer.state(next_round),
            "fork": {"run": trainer.paths.id, "round": next_round, "setting": trainer.setting, "diverged": diverged},
        }

    def start(self, trainer, path: str | Path, accepts) -> None:
        """Start from a parent's fork state; ``accepts(parent_setting, round)`` says whether this run shares
        the parent's rounds 0..round-1 (the settings' fork declarations decide that)."""
        try:
            state = checkpoint.load(path, trainer.device)
        except checkpoint.CheckpointError as err:
            raise ForkError(str(err)) from None
        fork = state.get("fork")
        if not fork or int(state["next_round"]) != fork["round"]:
            raise ForkError(f"{path}: not a fork state")
        if stable_hash(fork["setting"]) != state["setting_hash"] or not accepts(fork["setting"], fork["round"]):
            raise ForkError(f"{path}: run {fork['run']} does not share its first {fork['round']} rounds with this run")
        trainer.restore(state)
        for part in trainer.algorithm.parts().values():
            part.start_from_fork(state.get("history", []))
        self.forked_from = {"run": fork["run"], "round": fork["round"]}
        self.ended_diverged = bool(fork.get("diverged"))
