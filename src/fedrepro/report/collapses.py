"""Collapses: rounds where a run's test accuracy falls far below what it had already reached.

Computed from a run's kept per-round records (metrics.csv), never by the trainer, so the rule can change
without renaming a run. The rule, fixed before it was run on any evidence folder:

  a round t is a collapse round when its test accuracy is more than ``DROP`` (20) points below the run's best
  accuracy of the rounds before t, or when it is at chance (100 / number of classes, plus ``CHANCE_MARGIN``,
  1 point) after the run's best had reached ``LEARNED`` (10) points above chance.

Consecutive collapse rounds form one episode; an episode is told by its lowest round (the accuracy there and
the best before it). A run with an episode is flagged. Every run also records its largest fall below its best
so far, flagged or not, so a fall just short of the threshold is visible too.
"""

from __future__ import annotations

import math

DROP = 20.0  # points below the best of the earlier rounds
CHANCE_MARGIN = 1.0  # points above 100 / num_classes that still count as chance
LEARNED = 10.0  # points above chance the best must have reached for a fall to chance to count
RULE = (
    f"test accuracy more than {DROP:g} points below the run's best of the earlier rounds, or at chance "
    f"(100/classes + {CHANCE_MARGIN:g}) after its best reached {LEARNED:g} points above chance"
)


def detect(rounds, accuracy, num_classes: int = 10) -> dict:
    """The collapse record of one run from its rounds and test accuracies (fractions, as metrics.csv holds
    them; NaN rounds are skipped): ``collapsed``, ``episodes`` (first and last round, the lowest round, its
    accuracy and the best before it, in points) and ``largest_fall`` (points below the best so far, at which
    round), all rounded to 2 decimals."""
    chance = 100.0 / num_classes
    best, best_round = -math.inf, None
    episodes: list[dict] = []
    open_episode = None
    largest = {"drop": 0.0, "round": None, "acc": None, "best": None}
    for rnd, acc in zip(rounds, accuracy):
        if acc is None or (isinstance(acc, float) and math.isnan(acc)):
            continue
        acc = float(acc) * 100.0
        rnd = int(rnd)
        if best > -math.inf:
            drop = best - acc
            if drop > largest["drop"]:
                largest = {"drop": drop, "round": rnd, "acc": acc, "best": best}
            at_chance = acc <= chance + CHANCE_MARGIN and best >= chance + LEARNED
            if drop > DROP or at_chance:
                if open_episode is None:
                    open_episode = {
                        "first_round": rnd,
                        "last_round": rnd,
                        "low_round": rnd,
                        "low_acc": acc,
                        "best_before": best,
                        "best_round": best_round,
                        "to_chance": at_chance,
                    }
                    episodes.append(open_episode)
                open_episode["last_round"] = rnd
                open_episode["to_chance"] = open_episode["to_chance"] or at_chance
                if acc < open_episode["low_acc"]:
                    open_episode.update(low_round=rnd, low_acc=acc)
            else:
                open_episode = None
        if acc > best:
            best, best_round = acc, rnd
    rounded = lambda d: {k: round(v, 2) if isinstance(v, float) else v for k, v in d.items()}
    return {
        "collapsed": bool(episodes),
        "episodes": [rounded(e) for e in episodes],
        "largest_fall": rounded(largest) if largest["round"] is not None else None,
        "rule": RULE,
    }


def of_run(summary: dict, frame) -> dict | None:
    """The collapse record of a kept run (its summary and metrics.csv as a DataFrame); None without accuracies."""
    from fedrepro import catalog

    if frame is None or "test_acc" not in frame or not len(frame):
        return None
    dataset = summary.get("setting", {}).get("dataset")
    classes = catalog.DATASETS.get(dataset, {}).get("num_classes", 10)
    return detect(frame["round"].tolist(), frame["test_acc"].tolist(), classes)


def describe(record: dict | None, limit: int | None = 3) -> str:
    """One line: 'to 10.01% at round 23 (best before 76.84%)' per episode: with a ``limit``, the deepest first
    and a count of the rest; without, every episode in the order of rounds."""
    if not record or not record["collapsed"]:
        return ""
    episodes = record["episodes"] if limit is None else sorted(record["episodes"], key=lambda e: e["low_acc"])[:limit]
    parts = [
        f"to {e['low_acc']:.2f}% at round {e['low_round']} (best before {e['best_before']:.2f}%)" for e in episodes
    ]
    more = len(record["episodes"]) - len(episodes)
    return "; ".join(parts) + (f"; {more} more" if more > 0 else "")
