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
listed by hand. Light: YAML declarations and settings only, for the Snakefile and the planner.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from fedrepro import registry
from fedrepro.identity import stable_hash
from fedrepro.spec import conditions
from fedrepro.spec.settings import prune


@dataclass(frozen=True)
class Fork:
    parent: str   # the run that trains the shared rounds
    round: int    # rounds shared: the child starts at this 0-indexed round
    history: int  # the parent's last global models the child's parts need at that round


def late_plugins(setting: dict) -> dict[str, tuple[int, int]]:
    """The setting's plug-ins that act only from some round on: name -> (that round, models needed then)."""
    late = {}
    for name in setting["plugins"]:
        fork = registry.PLUGINS.get(name, {}).get("fork")
        if fork:
            late[name] = (int(conditions.evaluate(fork["acts_from"], setting)),
                          int(conditions.evaluate(str(fork.get("needs_models", 0)), setting)))
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

