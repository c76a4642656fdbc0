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


def test_a_cell_whose_runs_all_diverged_loses_instead_of_waiting():
    values = {("FedAvg", "c"): 80, ("FedDyn", "c"): 78, ("FedLAW", "c"): 81}
    cells = table(values, {("FedAvg", "c"): [0.7], ("FedLAW", "c"): [0.75]})
    next(c for c in cells if c.row == "FedDyn").diverged = ["feddyn-run"]
    best = claims.evaluate({"text": "", "kind": "best", "axis": "rows", "winner": "FedLAW"}, "t", cells)
    assert (best.ours.holds, best.ours.total, best.pending) == (1, 1, 0)
    next(c for c in cells if c.row == "FedLAW").ours, next(c for c in cells if c.row == "FedLAW").diverged = [], ["x"]
    best = claims.evaluate({"text": "", "kind": "best", "axis": "rows", "winner": "FedLAW"}, "t", cells)
    assert (best.ours.holds, best.ours.total) == (0, 1)


def test_margin_and_targets_never_reached():
    values = {("r1", "new"): 66.31, ("r1", "old"): 60.68, ("r2", "new"): 73.32, ("r2", "old"): 65.26}
    margin = claims.evaluate({"text": "", "kind": "beats", "winner": "new", "loser": "old", "margin": 6}, "t",
                             table(values))
    assert (margin.paper.holds, margin.paper.total) == (1, 2)             # 5.63 is not more than 6; 8.06 is
    rounds = {("m", "IMA"): float("inf"), ("m", "FMA"): float("inf"), ("n", "IMA"): 120, ("n", "FMA"): float("inf")}
    sooner = claims.evaluate({"text": "", "kind": "beats", "winner": "IMA", "loser": "FMA", "better": "lower"}, "t",
                             table(rounds))
    assert (sooner.paper.holds, sooner.paper.total) == (1, 2), "neither reaching the target is no evidence"


def test_patterns_are_literal_but_for_the_star_and_order_labels_must_exist():
    values = {("FedLAW [SWA]", "c?"): 2, ("FedAvg", "c?"): 1}
    check = {"text": "", "kind": "best", "axis": "rows", "winner": "FedLAW [SWA]", "lines": ["c?"]}
    assert claims.evaluate(check, "t", table(values)).paper.total == 1
    with pytest.raises(ValueError, match="order names t_s=999"):
        claims.evaluate({"text": "x", "kind": "order", "axis": "rows", "order": ["FedAvg", "t_s=999"]}, "t",
                        table(values))


def test_unknown_kind_and_axis_are_refused_by_name():
    with pytest.raises(ValueError, match="check kind 'most'"):
        claims.evaluate({"text": "", "kind": "most"}, "t", table(PAIRS))
    with pytest.raises(ValueError, match="axis 'diagonal'"):
        claims.evaluate({"text": "", "kind": "best", "axis": "diagonal", "winner": "x"}, "t", table(PAIRS))


# What the papers' numbers say about their own claims (counted by hand from specs/*.md): a check that
# encodes its claim wrongly shows up here as the paper contradicting itself.
EXPECTED_ON_PAPER = {
    ("ima_table1", "+IMA beats FMA (per method and setting)"): (96, 96),
    ("ima_table2", "IMA from every t_s reaches the target sooner than FMA"): (24, 24),
    ("ima_table2", "an earlier start reaches it no later"): (16, 18),
    ("ima_table3", "Exp Decay and Const LR beat Cyclic, Epoch and NA Decay"): (42, 48),
    ("fedlaw_table3", "FedLAW or FedLAW (SWA) is best in the column"): (10, 12),
    ("fedlaw_table3", "FedLAW beats FedAvg"): (10, 12),
    ("fedlaw_table1", "some fixed γ < 1 beats γ = 1"): (6, 6),
    ("fedlaw_table9", "at α = 0.1 (AlexNet, ResNet8) γ = 1 beats every fixed γ < 1"): (2, 2),
    ("fedlaw_table9", "at α ≥ 0.2 some fixed γ < 1 beats γ = 1"): (9, 9),
    ("fedlaw_table2", "adaptive GWS beats FedAvg"): (10, 10),
    ("fedlaw_table2", "a stronger weight decay gives a larger γ"): (8, 8),
    ("fedlaw_table10", "adaptive GWS beats FedAvg"): (6, 6),
    ("fedlaw_table10", "a larger η_g gives a smaller γ"): (4, 4),
    ("fedlaw_table5", "FedLAW and FedLAW (SWA) beat FedAvg"): (10, 10),
    ("fedlaw_table4", "FedLAW is best in the column"): (4, 4),
    ("fedlaw_table7", "FedLAW is best in the column"): (2, 2),
    ("fedlaw_table6", "FedLAW is best in the column"): (5, 6),
    ("fedlaw_table11", "HD correlates most at E = 1"): (1, 1),
    ("fedlaw_table11", "DS correlates most at E = 5"): (1, 1),
    ("fedlaw_table8", "FedLAW and FedLAW (SWA) beat FedAvg and Server-FT"): (12, 12),
    ("fedlaw_table8", "FedDF beats FedLAW"): (3, 3),
    ("fedaware_table2", "FedAWARE has the best raw accuracy (CIFAR-10, AGNews)"): (2, 2),
    ("fedaware_table2", "×AWARE raises e-LUDD"): (18, 18),
    ("fedaware_table2", "×AWARE raises accuracy"): (17, 18),
    ("fednova_table1", "FedNova beats FedAvg by more than 5 points with SGD and momentum"): (4, 4),
    ("fednova_table1", "FedNova-Prox beats FedProx by more than 8 points"): (2, 2),
    ("fednova_table1", "with VR, FedNova and SCAFFOLD are within 0.5 points"): (1, 1),
    ("fednova_table1", "momentum + VR gives FedNova's best accuracy under U(2,5)"): (1, 1),
}


def test_every_claim_check_of_the_papers_runs_and_the_papers_mostly_agree_with_themselves():
    tables = paper.load_results()
    seen = {}
    for name, spec in tables.items():
        for verdict in claims.evaluate_table(name, spec, paper.cells({name: spec})):
            assert verdict.paper.total > 0, f"{name}: check '{verdict.text}' compares nothing"
            assert verdict.ours.total == 0 and verdict.pending == verdict.paper.total
            seen[(name, verdict.text)] = (verdict.paper.holds, verdict.paper.total)
    assert seen == EXPECTED_ON_PAPER
    claimed = {name for name, spec in tables.items() if spec.get("claim")}
    assert claimed <= {name for name, _ in seen}, "a table states a claim but checks none of it"
