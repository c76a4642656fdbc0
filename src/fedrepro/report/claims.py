"""A paper's qualitative claims as checks on its table, counted on the paper's numbers and on ours.

A table of params/paper_results.yaml lists its claims under ``checks``. Each check compares cells
of that table along one ``axis`` (``rows``, ``columns`` or ``cells``: which labels are compared), once
per line of the other axis (``lines``: patterns restricting those, default all):

  beats  every label matching ``winner`` against every label matching ``loser``, by more than
         ``margin`` (default 0). Patterns pair by what their ``*`` stands for ("*, +IMA" with
         "*, FMA"); a pattern without ``*`` pairs with every label the other side matches.
  ties   as beats, but a comparison holds when the two are within ``tolerance`` of each other.
  best   per line, the best of the ``winner`` labels beats every other label of the line.
  order  per line and per neighbouring pair of the ``order`` labels: the first is at least as good.
  in_range  per line, every label matching ``winner`` has a value ``within`` [low, high] ("the ratio
         remains steady at around 19", "the coherence stays above zero"): a claim of a value, not of an
         ordering; the bounds are the tolerance, stated with the check.

  gain_ratio   per pair of labels as beats pairs them, the gain (winner minus loser) on the first of the
         two ``lines`` divided by the gain on the second lies ``within`` [low, high] ("participation 0.05
         gives about twice the gain of 0.2"); one comparison per pair.
  gain_spread  per pair, the gains on all ``lines`` lie within ``tolerance`` of each other ("the gain
         stays stable over E"); one comparison per pair.
  gain_size    per pair, the gain on every one of ``lines`` lies ``within`` [low, high] ("a gain of around
         5 points"); one comparison per pair.

  gain_order   the gain of the ``first`` pair of labels ([winner, loser]) is larger than the gain of the
         ``second`` pair by more than ``margin`` (default 0), on each line, or (``average: true``) of their
         gains averaged over the lines ("a greater gain with IMA on PACS than Digit Five"): one comparison.
         ``first`` may list several pairs ([[w, l], ...]): each is one comparison with ``second`` ("a smaller
         benefit at alpha 0.1" than at every other alpha).

``average: true`` (gain kinds) averages the gains of all pairs on each line first, and makes one comparison
of those mean gains: for a claim the paper makes of "the gain" over its methods, not of each method. It
waits until every pair has its cells.

``axis: cells`` compares single cells across rows and columns, each labelled "row | column"
("FedAMS | C100 ×AWARE Acc" beats "* | C100 Raw Acc"), on one line.
``among`` (patterns) restricts the compared labels, e.g. ``best`` among some rows only.
``stated`` (where the paper says it, e.g. "Fig. 6b, text"): the paper prints no numbers for the claim
(a figure, a sentence); its cells are left empty in the table and the check is counted on ours only,
the paper's side reading "stated in ..." instead of a count.
``better: lower`` flips the direction (rounds to a target accuracy); two cells that never reached the
target (inf) are no evidence either way, so such a comparison does not hold. Patterns are literal
text except ``*``. A check is counted on each side separately over the comparisons whose cells that
side has: "paper 16/16, ours 11/12 (4 not run yet)" says the claim holds in the paper's numbers,
and how far it holds in ours so far. ``agree`` counts, of the comparisons both sides make, those where
ours holds exactly when the paper's numbers do. A cell of ours whose every run diverged counts as the worst
possible value, so a claim that needs it fails rather than waiting for it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from fedrepro.report.paper import Cell

KINDS = ("beats", "ties", "best", "order", "in_range", "gain_ratio", "gain_spread", "gain_size", "gain_order")
ACROSS_LINES = ("gain_ratio", "gain_spread", "gain_size")  # kinds that compare gains of one pair across lines


@dataclass
class Count:
    holds: int = 0
    total: int = 0

    def __str__(self) -> str:
        return f"{self.holds}/{self.total}"


@dataclass
class Verdict:
    text: str
    paper: Count
    ours: Count
    pending: int  # comparisons the paper makes that we cannot make yet (a cell not run)
    outside: int = 0  # comparisons with a cell the params file (a subset) does not run at all
    stated: str = ""  # where the paper states a claim it prints no numbers for (then paper is 0/0)
    # of the comparisons both sides make, those where ours holds exactly when the paper's numbers hold: a
    # claim the paper itself breaks in one column is confirmed by ours breaking it in that column too
    agree: Count = field(default_factory=Count)
    # the paper's own numbers on the comparisons ours makes (where it printed every involved cell): what the
    # paper's numbers give beside ours, on the same cells
    paper_on_ours: Count = field(default_factory=Count)

    @property
    def paper_side(self) -> str:
        return f"stated in {self.stated} (no numbers)" if self.stated else str(self.paper)

    def __str__(self) -> str:
        tail = f" ({self.pending} not run yet)" if self.pending else ""
        tail += f" ({self.outside} outside this params file)" if self.outside else ""
        return f"{self.text}: paper {self.paper_side}, ours {self.ours}{tail}"


def _captures(pattern: str, label: str) -> tuple | None:
    regex = "".join("(.*)" if part == "*" else re.escape(part) for part in re.split(r"(\*)", pattern))
    found = re.fullmatch(regex, label)
    return found.groups() if found else None


def _select(labels: list[str], patterns) -> dict[str, tuple]:
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    out = {}
    for label in labels:
        for pattern in patterns:
            groups = _captures(pattern, label)
            if groups is not None:
                out[label] = groups
                break
    return out


def _comparisons(check: dict, labels: list[str]) -> list[tuple[list[str], list[str]]]:
    """Per line, the (better, worse) label groups whose values the check compares."""
    kind = check["kind"]
    if kind in ("beats", "ties") + ACROSS_LINES:
        winners, losers = _select(labels, check["winner"]), _select(labels, check["loser"])
        return [
            ([w], [l])
            for w, wg in winners.items()
            for l, lg in losers.items()
            if w != l and (wg == lg or not wg or not lg)
        ]
    if kind == "best":
        winners = list(_select(labels, check["winner"]))
        return [(winners, [l for l in labels if l not in winners])]
    if kind == "in_range":
        return [([w], []) for w in _select(labels, check["winner"])]
    if kind == "order":
        unknown = [l for l in check["order"] if l not in labels]
        if unknown:
            raise ValueError(f"check '{check['text']}': order names {', '.join(unknown)}, not labels of the table")
        order = check["order"]
        return [([a], [b]) for a, b in zip(order, order[1:])]
    raise ValueError(f"check kind '{kind}' is not one of {', '.join(KINDS)}")


def _gains_hold(check: dict, gains: list[float]) -> bool:
    """gain_ratio: gains = [first line's, second line's]; gain_spread, gain_size: one gain per line."""
    if not all(math.isfinite(g) for g in gains):
        return False
    if check["kind"] == "gain_size":
        low, high = check["within"]
        return all(low <= g <= high for g in gains)
    if check["kind"] == "gain_ratio":
        low, high = check["within"]
        if gains[1] <= 0:  # a gain against none (or a loss) is infinitely larger; no gain against none is not
            return gains[0] > 0 and high == math.inf
        return low <= gains[0] / gains[1] <= high
    return max(gains) - min(gains) <= check["tolerance"]


def _holds(check: dict, better: list[float], worse: list[float]) -> bool:
    sign = -1 if check.get("better", "higher") == "lower" else 1
    if check["kind"] == "ties":
        return abs(better[0] - worse[0]) <= check["tolerance"]
    if check["kind"] == "in_range":
        low, high = check["within"]  # a value never reached (inf) or a diverged cell is outside any range
        return math.isfinite(better[0]) and low <= better[0] <= high
    best = max(sign * v for v in better)
    if best == -math.inf:  # nothing on the winning side reached anything
        return False
    if check["kind"] == "order":
        return best >= sign * worse[0]
    return all(best > sign * v + check.get("margin", 0) for v in worse)


def _ours(cell: Cell, check: dict) -> float | None:
    """Our value of a cell: the mean over seeds; the worst value when every run diverged."""
    if cell.ours_mean is None and cell.diverged:
        return math.inf if check.get("better", "higher") == "lower" else -math.inf
    return cell.ours_mean


def evaluate(check: dict, table: str, joined: list[Cell]) -> Verdict:
    grid = {(c.row, c.column): c for c in joined if c.table == table}
    rows = list(dict.fromkeys(c.row for c in joined if c.table == table))
    columns = list(dict.fromkeys(c.column for c in joined if c.table == table))
    axis = check.get("axis", "columns")
    if axis not in ("rows", "columns", "cells"):
        raise ValueError(f"check axis '{axis}' must be rows, columns or cells")
    if axis == "cells":  # one line; each cell is a label "row | column"
        labels, lines = [f"{r} | {c}" for r in rows for c in columns if (r, c) in grid], [""]
    else:
        labels, lines = (columns, rows) if axis == "columns" else (rows, columns)
    if "among" in check:
        labels = list(_select(labels, check["among"]))
    if "lines" in check:
        lines = list(_select(lines, check["lines"]))

    def cell(line: str, label: str) -> Cell:
        if axis == "cells":
            return grid[tuple(label.split(" | ", 1))]
        return grid[(line, label)] if axis == "columns" else grid[(label, line)]

    stated = check.get("stated", "")
    if check["kind"] == "gain_order":
        return _evaluate_gain_order(check, labels, lines, cell, stated)
    if check["kind"] in ACROSS_LINES:
        return _evaluate_gains(check, labels, lines, cell, stated)

    def pairwise():  # one comparison per line and (better, worse) pair
        for line in lines:
            for better, worse in _comparisons(check, labels):
                if not stated and check["kind"] == "best":  # the best among what the paper printed
                    better = [l for l in better if cell(line, l).value is not None]
                    worse = [l for l in worse if cell(line, l).value is not None]
                    if not better or not worse:
                        continue
                yield (
                    [cell(line, l) for l in better + worse],
                    lambda value, line=line, better=better, worse=worse: _holds(
                        check, [value(cell(line, l)) for l in better], [value(cell(line, l)) for l in worse]
                    ),
                )

    return _judged(check, stated, pairwise())


def _tally(agree: Count, paper_on_ours: Count, paper_holds: bool | None, ours_holds: bool) -> None:
    if paper_holds is not None:  # a stated claim has no numbers to agree with
        agree.total += 1
        agree.holds += paper_holds == ours_holds
        paper_on_ours.total += 1
        paper_on_ours.holds += paper_holds


def _evaluate_gains(check: dict, labels: list[str], lines: list[str], cell, stated: str) -> Verdict:
    """gain_ratio / gain_spread / gain_size: one comparison per (winner, loser) pair over the gains on
    ``lines``, or one of the pairs' mean gains (``average``)."""
    if check["kind"] == "gain_ratio" and len(lines) != 2:
        raise ValueError(f"check '{check['text']}': gain_ratio compares two lines, got {lines}")
    sign = -1 if check.get("better", "higher") == "lower" else 1
    # each comparison: the (winner cell, loser cell) pairs per line whose gains it averages
    pairs = [
        [[(cell(line, better[0]), cell(line, worse[0]))] for line in lines]
        for better, worse in _comparisons(check, labels)
    ]
    if check.get("average") and pairs:
        pairs = [[[p for comparison in pairs for p in comparison[i]] for i in range(len(lines))]]

    def gains(comparison, value) -> list[float]:  # per line, the mean gain of the comparison's pairs
        return [sign * sum(value(w) - value(l) for w, l in per_line) / len(per_line) for per_line in comparison]

    return _judged(
        check,
        stated,
        (
            (
                [c for per_line in comparison for pair in per_line for c in pair],
                lambda value, comparison=comparison: _gains_hold(check, gains(comparison, value)),
            )
            for comparison in pairs
        ),
    )


def _judged(check: dict, stated: str, comparisons) -> Verdict:
    """The verdict of whole comparisons, each ``(involved cells, holds)`` where ``holds(value)`` judges it with
    ``value(cell)`` as each cell's number: the paper's side when it printed every involved cell (a stated claim
    has none), ours when every involved cell has a run."""
    paper, ours, agree, on_ours, pending, outside = Count(), Count(), Count(), Count(), 0, 0
    for involved, holds in comparisons:
        paper_holds = None
        if not stated and all(c.value is not None for c in involved):
            paper_holds = holds(lambda c: c.value)
            paper.total += 1
            paper.holds += paper_holds
        elif not stated:
            continue
        if any(_ours(c, check) is None for c in involved):
            if all(c.in_scope for c in involved):
                pending += 1
            else:
                outside += 1
            continue
        ours_holds = holds(lambda c: _ours(c, check))
        ours.total += 1
        ours.holds += ours_holds
        _tally(agree, on_ours, paper_holds, ours_holds)
    return Verdict(check["text"], paper, ours, pending, outside, stated, agree, on_ours)


def _evaluate_gain_order(check: dict, labels: list[str], lines: list[str], cell, stated: str) -> Verdict:
    """gain_order: per line (or once, averaged over the lines) the first pair's gain against the second's."""
    firsts = check["first"] if isinstance(check["first"][0], list) else [check["first"]]
    unknown = [label for pair in firsts + [check["second"]] for label in pair if label not in labels]
    if unknown:
        raise ValueError(f"check '{check['text']}': {', '.join(unknown)} not labels of the table")
    sign = -1 if check.get("better", "higher") == "lower" else 1
    groups = [lines] if check.get("average") else [[line] for line in lines]

    def holds(group, pairs, value) -> bool:
        gains = [
            sum(sign * (value(cell(line, w)) - value(cell(line, l))) for line in group) / len(group) for w, l in pairs
        ]
        return all(math.isfinite(g) for g in gains) and gains[0] > gains[1] + check.get("margin", 0)

    return _judged(
        check,
        stated,
        (
            (
                [cell(line, label) for line in group for pair in pairs for label in pair],
                lambda value, group=group, pairs=pairs: holds(group, pairs, value),
            )
            for group, pairs in [(g, [first, check["second"]]) for g in groups for first in firsts]
        ),
    )


def evaluate_table(table_name: str, table: dict, joined: list[Cell]) -> list[Verdict]:
    return [evaluate(check, table_name, joined) for check in table.get("checks", [])]
