"""Grids as trees: runs that share their first rounds train them once.

A plug-in that acts only from some round on declares it in its fragment (``fork: acts_from``, and the
host's last models it needs then, ``needs_models``). Two runs share rounds 0..t-1 when one's setting,
with such plug-ins removed, is the other's, and each removed plug-in acts from t or later: everything
that determines those rounds (cohorts, batches and every other stream drawn from (seed, round, client),
the lr schedule, evaluation, the logged rows) is then the same, so the child can start from the
parent's state after t rounds and end with the numbers it would have had trained from round 0.

    parent  trains every round; after round t it keeps its state in fork/kept-<t>.pt (engine)
    fork    rule: moves it to fork/<t>.pt, a temporary output (or trains the prefix if it is missing)
    child   resumes from fork/<t>.pt through the checkpoint path and trains rounds t..R-1

The pairs are derived here from the settings of an invocation's runs (every params file it names), not
listed by hand. Light: YAML declarations and settings only, for the Snakefile and the planner;
``WorkflowForks`` answers the workflow's rules for one invocation.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from fedrepro.configure import conditions, registry
from fedrepro.configure.settings import prune
from fedrepro.identity import run_id, stable_hash
from fedrepro.run.rundir import RunDir


@dataclass(frozen=True)
class Fork:
    parent: str  # the run that trains the shared rounds
    round: int  # rounds shared: the child starts at this 0-indexed round
    history: int  # the parent's last global models the child's parts need at that round


def late_plugins(setting: dict) -> dict[str, tuple[int, int]]:
    """The setting's plug-ins that act only from some round on: name -> (that round, models needed then)."""
    late = {}
    for name in setting["plugins"]:
        fork = registry.PLUGINS.get(name, {}).get("fork")
        if fork:
            late[name] = (
                int(conditions.evaluate(fork["acts_from"], setting)),
                int(conditions.evaluate(str(fork.get("needs_models", 0)), setting)),
            )
    return late


def prefix_parents(setting: dict) -> list[tuple[dict, int, int]]:
    """The settings whose runs share this run's first rounds: (setting, rounds shared, models needed),
    the longest prefix first. Removing a plug-in also removes the sections only it reads (settings.prune)."""
    late, found = late_plugins(setting), []
    for size in range(1, len(late) + 1):
        for removed in itertools.combinations(sorted(late), size):
            parent = prune({**setting, "plugins": [p for p in setting["plugins"] if p not in removed]})
            rounds = min(late[p][0] for p in removed)
            if rounds > 0:
                found.append((parent, rounds, max(late[p][1] for p in removed)))
    return sorted(found, key=lambda f: -f[1])


def shares_prefix(child: dict, parent: dict, rounds: int) -> bool:
    """Whether ``child`` may start from ``parent``'s state after ``rounds`` rounds."""
    key = stable_hash(parent)
    return any(stable_hash(p) == key and shared >= rounds for p, shared, _ in prefix_parents(child))


def assign(runs) -> dict[str, Fork]:
    """Each run that shares a prefix with another run of ``runs`` (settings.Run), with its longest one.
    A parent that itself forked at or after that round did not train it: the fork goes to the run that did."""
    by_setting = {stable_hash(run.setting): run for run in runs}
    forks: dict[str, Fork] = {}
    for run in runs:
        for parent_setting, rounds, models in prefix_parents(run.setting):
            parent = by_setting.get(stable_hash(parent_setting))
            if parent is not None and parent.id != run.id:
                forks[run.id] = Fork(parent.id, rounds, models)
                break
    for child, fork in forks.items():
        while fork.parent in forks and forks[fork.parent].round >= fork.round:
            fork = Fork(forks[fork.parent].parent, fork.round, fork.history)
        forks[child] = fork
    return forks


def kept(forks: dict[str, Fork]) -> dict[str, tuple[list[int], int]]:
    """Per parent: the rounds it keeps a fork state at, and how many of its last models each holds."""
    rounds: dict[str, set[int]] = {}
    history: dict[str, int] = {}
    for fork in forks.values():
        rounds.setdefault(fork.parent, set()).add(fork.round)
        history[fork.parent] = max(history.get(fork.parent, 0), fork.history)
    return {parent: (sorted(r), history[parent]) for parent, r in rounds.items()}


def sharing(params: dict) -> bool:
    """``share_prefixes``, true unless turned off (``--config share_prefixes=false`` arrives as a string)."""
    value = params.get("share_prefixes", True)
    return value if isinstance(value, bool) else value.lower() == "true"


def of_params(params: dict, runs) -> dict[str, Fork]:
    """The forks of an invocation's runs, none when its params turn sharing off."""
    return assign(runs) if sharing(params) else {}


class WorkflowForks:
    """The forks of one Snakemake invocation, as its train and fork rules ask for them.

    ``runs``: the invocation's runs by id; a table that also finds the final runs of its tunings
    (tuning.RunTable, ``final_ids``) lets a tuned +ima run fork from its tuned host once they are known. A run
    that finished in another invocation (another params file, sharing off, a subset) is answered from its
    summary, which records what its job was given, so that Snakemake sees the inputs and params it recorded
    for it and does not rerun it."""

    def __init__(self, params: dict, runs, runs_dir: str = "results/runs"):
        self.params, self.runs, self.runs_dir = params, runs, runs_dir
        self._forks: dict[tuple, tuple[dict[str, Fork], dict[str, tuple[list[int], int]]]] = {}

    def current(self) -> tuple[dict[str, Fork], dict[str, tuple[list[int], int]]]:
        """(forks, kept) of every run known now, computed once per set of final runs."""
        finals = tuple(self.runs.final_ids()) if hasattr(self.runs, "final_ids") else ()
        if finals not in self._forks:
            runs = {**self.runs, **{run_id: self.runs[run_id] for run_id in finals}}
            forks = of_params(self.params, list(runs.values()))
            self._forks[finals] = (forks, kept(forks))
        return self._forks[finals]

    def finished_summary(self, run_id: str) -> dict | None:
        run = RunDir(f"{self.runs_dir}/{run_id}")
        return run.read_summary() if run.finished() else None

    def recorded_parents(self) -> dict[str, dict]:
        """Settings of the parents that finished runs of this invocation forked from, where the parent is in no
        params file of it (a subset): the fork rule names their files, so Snakemake must know them."""
        parents = {}
        for run in self.runs.values():
            fork = (self.finished_summary(run.id) or {}).get("forked_from")
            if fork and fork["run"] not in self.runs:
                for setting, _, _ in prefix_parents(run.setting):
                    if run_id(setting) == fork["run"]:
                        parents[fork["run"]] = setting
        return parents

    def of_run(self, run: str) -> tuple[str, int] | None:
        """(parent, round) of the fork state this run starts from, or None."""
        summary = self.finished_summary(run)
        if summary is not None:
            fork = summary.get("forked_from")
            return None if not fork else (fork["run"], fork["round"])
        fork = self.current()[0].get(run)
        return None if fork is None else (fork.parent, fork.round)

    def train_args(self, run: str, fork_file: str | None) -> list[str]:
        """``--keep-forks`` for a parent (the rounds its children start at), ``--fork-from`` for a child."""
        summary = self.finished_summary(run)
        if summary is not None:
            kept_there = summary.get("kept_forks") or {"rounds": [], "history": 0}
            rounds, history = kept_there["rounds"], kept_there["history"]
        else:
            rounds, history = self.current()[1].get(run, ([], 0))
        args = ["--keep-forks", ",".join(map(str, rounds)), "--fork-history", str(history)] if rounds else []
        return args + (["--fork-from", fork_file] if fork_file else [])

    def history(self, run: str, round_: int) -> int:
        """The last models the children starting at this round need (IMA's window); at least what a finished
        parent kept there, so that its children, done in another invocation, see the params they were made with."""
        needs = [f.history for f in self.current()[0].values() if f.parent == run and f.round == round_]
        kept_there = (self.finished_summary(run) or {}).get("kept_forks") or {"rounds": [], "history": 0}
        return max([*needs, kept_there["history"] if round_ in kept_there["rounds"] else 0])
