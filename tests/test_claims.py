"""Claim checks counted by hand on small tables, and every claim of paper_results.yaml on the
paper's own numbers (a wrong transcription or a wrong check shows up as the paper contradicting itself)."""
import pytest

from fedrepro import claims, paper
from fedrepro.paper import Cell


def table(values: dict, ours: dict | None = None) -> list[Cell]:
    """Cells of a table 't' from {(row, column): paper value}, with ours {(row, column): [seeds]}."""
    out = []
    for (row, column), value in values.items():
        cell = Cell("t", "p", row, column, {}, {}, value)
        cell.ours = list((ours or {}).get((row, column), []))
        out.append(cell)
    return out


PAIRS = {("A, FMA", "m1"): 80, ("A, +IMA", "m1"): 82, ("B, FMA", "m1"): 70, ("B, +IMA", "m1"): 69,
         ("A, FMA", "m2"): 60, ("A, +IMA", "m2"): 61, ("B, FMA", "m2"): None, ("B, +IMA", "m2"): 50}


def test_beats_pairs_rows_by_what_the_star_stands_for():
    ours = {("A, FMA", "m1"): [1.0], ("A, +IMA", "m1"): [2.0, 4.0], ("B, FMA", "m1"): [5.0],
            ("B, +IMA", "m1"): [5.0], ("A, FMA", "m2"): [3.0]}
    check = {"text": "IMA helps", "kind": "beats", "axis": "rows", "winner": "*, +IMA", "loser": "*, FMA"}
    verdict = claims.evaluate(check, "t", table(PAIRS, ours))
    # the paper: A/m1 yes, B/m1 no, A/m2 yes; B/m2 has no FMA number, so it is no comparison
    assert (verdict.paper.holds, verdict.paper.total) == (2, 3)
    # ours: A/m1 3 > 1 yes, B/m1 5 > 5 no (a tie is not a win); A/m2 lacks +IMA: pending
    assert (verdict.ours.holds, verdict.ours.total, verdict.pending) == (1, 2, 1)
    assert str(verdict) == "IMA helps: paper 2/3, ours 1/2 (1 not run yet)"


def test_beats_with_plain_labels_pairs_every_winner_with_every_loser_and_lower_is_better():
    values = {("r", "x"): 10, ("r", "y"): 12, ("r", "base"): 11}
    check = {"text": "", "kind": "beats", "winner": ["x", "y"], "loser": "base", "better": "lower"}
    verdict = claims.evaluate(check, "t", table(values))
    assert (verdict.paper.holds, verdict.paper.total) == (1, 2)


def test_best_compares_the_best_winner_with_every_other_label_of_the_line():
    values = {("FedAvg", "c1"): 80, ("FedLAW", "c1"): 79, ("FedLAW (SWA)", "c1"): 81, ("FedDF", "c1"): 80.5,
              ("FedAvg", "c2"): 70, ("FedLAW", "c2"): 69, ("FedLAW (SWA)", "c2"): 69.5, ("FedDF", "c2"): None}
    check = {"text": "", "kind": "best", "axis": "rows", "winner": ["FedLAW", "FedLAW (SWA)"]}
    verdict = claims.evaluate(check, "t", table(values))
    assert (verdict.paper.holds, verdict.paper.total) == (1, 2)   # c1: 81 > 80.5; c2: 69.5 < 70
    only_c1 = claims.evaluate({**check, "lines": ["c1"]}, "t", table(values))
    assert (only_c1.paper.holds, only_c1.paper.total) == (1, 1)


def test_order_and_ties_and_among():
    values = {("r1", "a"): 10, ("r1", "b"): 20, ("r1", "c"): 20, ("r1", "z"): 1,
              ("r2", "a"): 10, ("r2", "b"): 9, ("r2", "c"): 30, ("r2", "z"): 1}
    order = claims.evaluate({"text": "", "kind": "order", "order": ["a", "b", "c"], "better": "lower"}, "t",
                            table(values))
    assert (order.paper.holds, order.paper.total) == (3, 4)        # r1: 10<=20<=20; r2: 10 > 9 fails once
    ties = claims.evaluate({"text": "", "kind": "ties", "winner": "b", "loser": "c", "tolerance": 0.5}, "t",
                           table(values))
    assert (ties.paper.holds, ties.paper.total) == (1, 2)
    best = claims.evaluate({"text": "", "kind": "best", "winner": "c", "among": ["a", "b", "c"]}, "t",
                           table(values))
    assert (best.paper.holds, best.paper.total) == (1, 2)          # z = 1 is left out by among


def test_unknown_kind_and_axis_are_refused_by_name():
    with pytest.raises(ValueError, match="check kind 'most'"):
        claims.evaluate({"text": "", "kind": "most"}, "t", table(PAIRS))
    with pytest.raises(ValueError, match="axis 'diagonal'"):
        claims.evaluate({"text": "", "kind": "best", "axis": "diagonal", "winner": "x"}, "t", table(PAIRS))


# What the papers' numbers say about their own claims (counted by hand from specs/*.md).
EXPECTED_ON_PAPER = {
    ("ima_table1", "+IMA beats FMA (per method and setting)"): (96, 96),
    ("fedlaw_table3", "FedLAW or FedLAW (SWA) is best in the column"): (10, 12),
    ("fedaware_table2", "×AWARE raises accuracy"): (17, 18),
    ("fedlaw_table9", "at α = 0.1 (AlexNet, ResNet8) γ = 1 beats every fixed γ < 1"): (2, 2),
}


def test_every_claim_check_of_the_papers_runs_and_the_papers_mostly_agree_with_themselves():
    tables = paper.load_results()
    seen = {}
    for name, spec in tables.items():
        for verdict in claims.evaluate_table(name, spec, paper.cells({name: spec})):
            assert verdict.paper.total > 0, f"{name}: check '{verdict.text}' compares nothing"
            assert verdict.paper.holds >= verdict.paper.total * 0.8, f"{name}: '{verdict.text}' {verdict.paper}"
            assert verdict.ours.total == 0 and verdict.pending == verdict.paper.total
            seen[(name, verdict.text)] = (verdict.paper.holds, verdict.paper.total)
    for key, count in EXPECTED_ON_PAPER.items():
        assert seen[key] == count, key
    claimed = {name for name, spec in tables.items() if spec.get("claim")}
    assert claimed <= {name for name, _ in seen}, "a table states a claim but checks none of it"
