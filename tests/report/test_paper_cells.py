"""The verification matrix's arithmetic (fedrepro.report.paper), one function at a time, at settings where every
term of it changes the answer: unequal seed counts, n = 2 and n = 3 (their t quantiles differ), a paper std given
and not, None/NaN/inf values, a cell holding a collapsed run, boundaries exactly at the strict gap (1.5) and at
the interval's edge, every verdict string, rounds-to-target runs that never reach the target. The oracles are
scipy's t tests and hand-worked numbers, never the function under test.

Inclusive edges (docs/verification.md): reproduced when |Δ| <= the tolerance, consistent when |Δ| <= the interval's
half width, a median half-width counts against a cell only when |Δ| is strictly beyond it, a coherence moving
average of exactly 0 is a critical point, and a run whose accuracy at the last rounds equals its first has no gain
to share.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fedrepro.report import paper

# The 97.5% quantiles of Student's t in closed form (worked by hand, not read off scipy): with one degree of
# freedom t is Cauchy, F^-1(p) = tan(pi (p - 1/2)); with two, F^-1(p) = (2p - 1) / sqrt(2 p (1 - p)).
T_975_1 = math.tan(0.475 * math.pi)  # 12.7062...
T_975_2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # 4.3027...

NAN, INF = float("nan"), float("inf")


# ------------------------------------------------------------------------------------------------ tolerance


def test_the_strict_gap_is_the_tables_own_else_20_rounds_for_rounds_to_target_else_one_and_a_half_points():
    assert paper.tolerance({"metric": {"kind": "mean_last_rounds", "rounds": 10}}) == 1.5
    assert paper.tolerance({"metric": {"kind": "rounds_to_target", "target": 0.6}}) == 20.0
    assert paper.tolerance({"tolerance": 0.05, "metric": {"kind": "mean_last_rounds"}}) == 0.05
    assert paper.tolerance({"tolerance": 7.0, "metric": {"kind": "rounds_to_target"}}) == 7.0
    assert paper.MIN_GAP == 1.5


# ------------------------------------------------------------------------------------------------ reproduced


@pytest.mark.parametrize(
    ("delta", "tolerance", "expected"),
    [
        (None, 1.5, None),
        (0.0, 1.5, True),
        (1.5, 1.5, True),  # the edge is inside
        (-1.5, 1.5, True),
        (1.5 + 1e-12, 1.5, False),
        (-1.5 - 1e-12, 1.5, False),
        (-3.0, 1.5, False),
        (19.0, 20.0, True),
        (-21.0, 20.0, False),
        (INF, 20.0, False),  # a rounds-to-target seed that never reached the target
    ],
)
def test_reproduced_is_the_absolute_gap_within_the_tolerance_edge_included(delta, tolerance, expected):
    assert paper.reproduced(delta, tolerance) is expected


# ------------------------------------------------------------------------------------------------ noise_interval


def _one_sample_half_width(values, confidence=0.95):
    """scipy's own confidence interval of the mean (ttest_1samp), halved."""
    ci = stats.ttest_1samp(values, 0.0).confidence_interval(confidence)
    return (ci.high - ci.low) / 2


@pytest.mark.parametrize(
    "values",
    [[62.0, 64.0], [62.0, 62.2, 62.4], [61.0, 63.5, 64.0, 70.0], [1.0, 2.0, 4.0, 8.0, 16.0]],
)
def test_without_a_paper_std_the_interval_is_the_t_interval_of_our_mean(values):
    half = paper.noise_interval(values)
    assert half == pytest.approx(_one_sample_half_width(values), rel=1e-12)
    # the paper's value at the interval's edge is what a one-sample t test rejects at exactly 5%
    assert stats.ttest_1samp(values, float(np.mean(values)) + half).pvalue == pytest.approx(0.05, rel=1e-9)


def test_n_2_and_n_3_use_their_own_t_quantiles():
    """Same mean and same s, one seed more: the interval shrinks by t(2)/t(1) * sqrt(2/3), not sqrt(2/3) alone."""
    two, three = [0.0, 2.0], [0.0, 1.0, 2.0]  # both: s = sqrt(2) and sqrt(1); hand-worked below
    assert paper.noise_interval(two) == pytest.approx(T_975_1 * math.sqrt(2) / math.sqrt(2), rel=1e-12)
    assert paper.noise_interval(three) == pytest.approx(T_975_2 * 1.0 / math.sqrt(3), rel=1e-12)


def test_the_confidence_sets_the_quantile():
    values = [62.0, 62.2, 62.4]
    assert paper.noise_interval(values, confidence=0.9) == pytest.approx(_one_sample_half_width(values, 0.9), rel=1e-12)
    assert paper.noise_interval(values) == pytest.approx(_one_sample_half_width(values, 0.95), rel=1e-12)
    assert paper.CONFIDENCE == 0.95


@pytest.mark.parametrize(
    ("ours", "paper_std", "paper_seeds"),
    [
        ([62.0, 64.0], 1.05, 3),
        ([62.0, 62.2, 62.4], 1.05, 3),
        ([62.0, 62.2, 62.4], 0.3, 5),  # unequal counts: each side's (n - 1) weighs in Welch's ν
        ([60.0, 63.0, 61.0, 66.0], 2.5, 2),  # the paper's two seeds: the smallest count with a std
        ([60.0, 63.0], 0.1, 10),
        ([0.0, 2.0], 2.0, 4),  # equal shares s²/n = s_p²/n_p = 1: ν = 3, the interval t(3) sqrt(2), not 0
    ],
)
def test_with_a_paper_std_the_interval_is_welchs_for_the_difference_of_the_means(ours, paper_std, paper_seeds):
    half = paper.noise_interval(ours, paper_std, paper_seeds)
    mean, s = float(np.mean(ours)), float(np.std(ours, ddof=1))
    # Welch's test of our mean against the paper's at the interval's edge gives p = 0.05 exactly
    for side in (+1, -1):
        p = stats.ttest_ind_from_stats(
            mean, s, len(ours), mean + side * half, paper_std, paper_seeds, equal_var=False
        ).pvalue
        assert p == pytest.approx(0.05, rel=1e-9)
    # and the same written out from Welch-Satterthwaite
    a, b = s**2 / len(ours), paper_std**2 / paper_seeds
    dof = (a + b) ** 2 / (a**2 / (len(ours) - 1) + b**2 / (paper_seeds - 1))
    assert half == pytest.approx(stats.t.ppf(0.975, dof) * math.sqrt(a + b), rel=1e-12)
    assert half != pytest.approx(paper.noise_interval(ours), rel=1e-3)  # the paper's std counts


@pytest.mark.parametrize("paper_seeds", [None, 0, 1])
def test_a_paper_std_over_fewer_than_two_seeds_leaves_our_interval_alone(paper_seeds):
    ours = [62.0, 62.2, 62.4]
    assert paper.noise_interval(ours, 1.05, paper_seeds) == pytest.approx(_one_sample_half_width(ours), rel=1e-12)


def test_a_paper_std_of_zero_gives_our_interval_and_no_spread_on_either_side_gives_zero():
    ours = [62.0, 62.2, 62.4]
    # b = 0: Welch's ν is our n - 1 and the interval our own
    assert paper.noise_interval(ours, 0.0, 3) == pytest.approx(_one_sample_half_width(ours), rel=1e-12)
    assert paper.noise_interval([5.0, 5.0, 5.0], 0.0, 3) == 0.0
    assert paper.noise_interval([5.0, 5.0], None, None) == 0.0
    # our seeds agree exactly, the paper's do not: the paper's side alone, ν = its n - 1
    assert paper.noise_interval([5.0, 5.0], 2.0, 4) == pytest.approx(
        stats.t.ppf(0.975, 3) * 2.0 / math.sqrt(4), rel=1e-12
    )


@pytest.mark.parametrize(
    ("ours", "expected"),
    [
        ([], None),
        ([62.0], None),  # one seed: no spread to judge by
        ([62.0, None], None),  # a missing seed does not count as one
        ([62.0, INF], None),  # a rounds-to-target seed that never reached the target
        ([62.0, 64.0, NAN], None),
        ([62.0, -INF, 64.0], None),
    ],
)
def test_fewer_than_two_seeds_or_a_non_finite_seed_give_no_interval(ours, expected):
    assert paper.noise_interval(ours) is expected
    assert paper.noise_interval(ours, 1.0, 3) is expected


def test_a_missing_seed_is_left_out_of_n_mean_and_spread():
    assert paper.noise_interval([62.0, None, 64.0]) == pytest.approx(_one_sample_half_width([62.0, 64.0]), rel=1e-12)
    assert paper.noise_interval([None, 62.0, 62.2, None, 62.4], 0.3, 5) == pytest.approx(
        paper.noise_interval([62.0, 62.2, 62.4], 0.3, 5), rel=1e-15
    )


# ------------------------------------------------------------------------------------------------ consistent


@pytest.mark.parametrize(
    ("delta", "interval", "expected"),
    [
        (None, 2.0, None),
        (1.0, None, None),  # one seed
        (INF, 2.0, None),  # rounds-to-target: never reached
        (-INF, 2.0, None),
        (NAN, 2.0, None),
        (2.0, 2.0, True),  # the interval's edge is inside
        (-2.0, 2.0, True),
        (2.0 + 1e-12, 2.0, False),
        (-2.0 - 1e-12, 2.0, False),
        (0.0, 0.0, True),
        (0.5, 0.0, False),
    ],
)
def test_consistent_is_the_gap_within_the_interval_edge_included(delta, interval, expected):
    assert paper.consistent(delta, interval) is expected


def test_consistent_agrees_with_scipys_one_sample_test_on_each_side_of_the_edge():
    ours = [62.0, 62.2, 62.4]
    half = paper.noise_interval(ours)
    for delta, inside in ((half * (1 - 1e-9), True), (half * (1 + 1e-9), False)):
        for sign in (+1, -1):
            p = stats.ttest_1samp(ours, 62.2 - sign * delta).pvalue
            assert bool(p >= 0.05) is inside
            assert paper.consistent(sign * delta, half) is inside


# ------------------------------------------------------------------------------------------------ typical_half_width


@pytest.mark.parametrize(
    ("intervals", "expected"),
    [
        ([], None),
        ([None, NAN, INF], None),
        ([7.0], 7.0),
        ([9.0, 1.0], 5.0),
        ([5.0, 1.0, 3.0], 3.0),
        ([10.0, 4.0, 1.0, 2.0], 3.0),
        ([10.0, None, 4.0, 1.0, NAN, 2.0, 8.0, INF], 4.0),
        ([6.0, 5.0, 4.0, 3.0, 2.0, 1.0], 3.5),
    ],
)
def test_the_typical_half_width_is_the_median_of_the_finite_intervals(intervals, expected):
    assert paper.typical_half_width(intervals) == expected
    assert paper.typical_half_width(iter(intervals)) == expected  # table_frame passes a generator


# ------------------------------------------------------------------------------------------------ through_spread


@pytest.mark.parametrize(
    ("delta", "tolerance", "interval", "typical", "collapsed", "expected"),
    [
        (-3.0, 1.5, 5.0, 4.0, False, False),  # inside the typical half-width: seed noise only
        (-3.0, 1.5, 5.0, 4.0, True, True),  # a collapsed run widened the interval
        (-4.5, 1.5, 5.0, 4.0, False, True),  # beyond the typical half-width
        (4.5, 1.5, 5.0, 4.0, False, True),
        (4.0, 1.5, 5.0, 4.0, False, False),  # exactly at the typical half-width: not beyond it
        (4.0 + 1e-9, 1.5, 5.0, 4.0, False, True),
        (-3.0, 1.5, 5.0, None, False, False),  # no typical width: only a collapse says so
        (-3.0, 1.5, 5.0, None, True, True),
        (1.5, 1.5, 5.0, 0.5, True, False),  # reproduced (at the edge) is never through our spread
        (-1.0, 1.5, 5.0, 0.5, True, False),
        (5.0, 1.5, 5.0, 4.0, True, True),  # at the interval's edge: inside
        (-6.0, 1.5, 5.0, 4.0, True, False),  # outside the interval
        (-3.0, 1.5, None, 1.0, True, False),  # one seed: no interval
        (None, 1.5, 5.0, 1.0, True, False),
        (INF, 20.0, 5.0, 1.0, True, False),
    ],
)
def test_through_our_spread_needs_inside_the_interval_outside_the_gap_and_a_wide_interval_or_a_collapse(
    delta, tolerance, interval, typical, collapsed, expected
):
    assert paper.through_spread(delta, tolerance, interval, typical, collapsed) is expected


def test_through_spread_without_a_collapse_flag_counts_no_collapse():
    assert paper.through_spread(-3.0, 1.5, 5.0, 4.0) is False
    assert paper.through_spread(-3.0, 1.5, 5.0, None) is False
    assert paper.through_spread(-4.5, 1.5, 5.0, 4.0) is True


# ------------------------------------------------------------------------------------------------ verdict


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        ((None, 1.5, 5.0, 4.0), {"collapsed": True}, ""),
        ((1.5, 1.5, None), {}, "reproduced"),  # at the edge, one seed
        ((-1.5, 1.5, 0.1, 0.0), {"collapsed": True}, "reproduced"),
        ((-1.5 - 1e-12, 1.5, None), {}, "no interval"),
        ((-3.0, 1.5, 5.0, 4.0), {"collapsed": True}, "through our spread"),
        ((-4.5, 1.5, 5.0, 4.0), {}, "through our spread"),
        ((-3.0, 1.5, 5.0, 4.0), {}, "seed noise only"),
        ((-3.0, 1.5, 5.0), {}, "seed noise only"),  # no typical width, no collapse
        ((4.0, 1.5, 5.0, 4.0), {}, "seed noise only"),  # at the typical width: not beyond it
        ((5.0, 1.5, 5.0, 6.0), {}, "seed noise only"),  # at the interval's edge
        ((5.0 + 1e-9, 1.5, 5.0, 6.0), {}, "neither"),
        ((-6.0, 1.5, 5.0, 4.0), {"collapsed": True}, "neither"),
        ((-6.0, 1.5, None, 4.0), {"collapsed": True}, "no interval"),
        ((INF, 20.0, 5.0, 4.0), {"collapsed": True}, "no interval"),  # never reached the target
        ((25.0, 20.0, 30.0, 10.0), {}, "through our spread"),  # rounds: the table's own tolerance
        ((15.0, 20.0, 1.0, 10.0), {}, "reproduced"),
    ],
)
def test_every_verdict_string(args, kwargs, expected):
    assert paper.verdict(*args, **kwargs) == expected


# ------------------------------------------------------------------------------------------------ table_frame


def _cell(column, value, ours, std=None, table="t", metric=None, **more):
    return paper.Cell(
        table, "p", "FedAvg", column, {}, metric or {"kind": "mean_last_rounds"}, value, std, ours=list(ours), **more
    )


def test_the_table_frame_holds_each_cells_numbers_and_verdicts():
    """Hand-worked: a = [62, 64] (t(1) interval 12.706), b = [62, 62.2, 62.4] (t(2): 0.497), e = [60, 61, 63]
    (s = 1.528, t(2): 3.795); f's paper value is None, its interval 4.303 x 7 / sqrt(3) = 17.39 stays out of the
    typical width, the median of a, b and e: 3.795."""
    collapse = {"collapsed": True, "episodes": [{"low_acc": 10.0, "low_round": 7, "best_before": 80.0}]}
    other = {"collapsed": True, "episodes": [{"low_acc": 35.5, "low_round": 12, "best_before": 71.25}]}
    cells = [
        _cell("a", 60.68, [62.0, 64.0]),
        _cell("b", 60.68, [62.0, 62.2, 62.4]),
        _cell("c", 60.68, [62.5], diverged=["r9"]),
        _cell("d", 60.0, [60.0, 63.0, 61.0], collapses={"r1": collapse, "r2": other}),
        _cell("e", 69.0, [60.0, 63.0, 61.0]),
        _cell("f", None, [50.0, 57.0, 64.0]),
        _cell("g", 0.5, [0.58, 0.62], metric={"kind": "mean_round_range", "tolerance": 0.1}, in_scope=False),
        _cell("x", 60.68, [99.0, 99.0], table="other"),
    ]
    frame = paper.table_frame(cells, "t").set_index("column")
    assert list(frame.index) == ["a", "b", "c", "d", "e", "f", "g"]  # the other table's cell stays out
    assert list(frame.columns) == [
        "row",
        "paper",
        "paper_std",
        "ours",
        "ours_std",
        "seeds",
        "delta",
        "diverged",
        "in_scope",
        "allowed",
        "within",
        "interval",
        "consistent",
        "verdict",
        "collapsed",
        "collapse_text",
    ]
    e_half = T_975_2 * math.sqrt(7 / 3) / math.sqrt(3)
    assert frame.loc["a", "interval"] == pytest.approx(T_975_1, rel=1e-12)
    assert frame.loc["e", "interval"] == pytest.approx(e_half, rel=1e-12)
    assert frame.loc["f", "interval"] == pytest.approx(T_975_2 * 7 / math.sqrt(3), rel=1e-12)
    assert math.isnan(frame.loc["c", "interval"])
    assert list(frame["seeds"]) == [2, 3, 1, 3, 3, 3, 2]
    assert list(frame["diverged"]) == [0, 0, 1, 0, 0, 0, 0]
    assert list(frame["in_scope"]) == [True] * 6 + [False]
    assert list(frame["allowed"]) == [1.5] * 6 + [0.1]  # a metric's own tolerance wins
    assert list(frame["collapsed"]) == [0, 0, 0, 2, 0, 0, 0]
    assert frame.loc["d", "collapse_text"] == (
        "to 10.00% at round 7 (best before 80.00%); to 35.50% at round 12 (best before 71.25%)"
    )
    assert frame.loc["a", "collapse_text"] == ""
    assert frame.loc["a", "ours"] == 63.0 and frame.loc["a", "ours_std"] == pytest.approx(math.sqrt(2), rel=1e-15)
    assert frame.loc["a", "delta"] == pytest.approx(63.0 - 60.68, rel=1e-15)
    assert frame.loc["a", "paper"] == 60.68 and frame.loc["a", "row"] == "FedAvg"
    assert math.isnan(frame.loc["f", "delta"]) and math.isnan(frame.loc["c", "ours_std"])
    # d: Δ = 1.333 > 1.5? no: reproduced whatever its collapse; e: Δ = -7.667, inside 3.795? no: neither;
    # a: Δ 2.32 inside 12.7 and beyond the typical 3.795? no: seed noise only
    assert list(frame["verdict"]) == [
        "seed noise only",
        "neither",
        "no interval",
        "reproduced",
        "neither",
        "",
        "reproduced",
    ]
    assert list(frame["within"].map(lambda v: None if v is None or v != v else bool(v))) == [
        False,
        False,
        False,
        True,
        False,
        None,
        True,
    ]
    assert list(frame["consistent"].map(lambda v: None if v is None or v != v else bool(v))) == [
        True,
        False,
        None,
        True,
        False,
        None,
        True,
    ]


def test_the_typical_width_is_over_the_cells_the_paper_prints_and_a_collapse_or_a_wide_cell_is_through_spread():
    """Intervals (t quantiles x s / sqrt(n)): a [62, 64] 12.706; b [60.2, 62.2, 64.2] 4.968; e1-e3 [60.98, 61.18,
    61.38] 0.497 each, so the table's typical width is 0.497 and a's Δ 2.32 lies beyond it: through our spread.
    The empty cells f, f2 (interval 17.39 each) stay out: counted, the median would be b's 4.968 and a only seed
    noise. b's Δ 1.52 lies just outside the 1.5 gap, inside its 4.968 and beyond 0.497; the e cells reproduce."""
    narrow = [60.98, 61.18, 61.38]
    cells = [
        _cell("a", 60.68, [62.0, 64.0]),
        _cell("b", 60.68, [60.2, 62.2, 64.2]),
        *(_cell(f"e{i}", 60.68, narrow) for i in (1, 2, 3)),
        _cell("f", None, [50.0, 57.0, 64.0]),
        _cell("f2", None, [50.0, 57.0, 64.0]),
    ]
    frame = paper.table_frame(cells, "t").set_index("column")
    assert frame.loc["b", "delta"] == pytest.approx(1.52, abs=1e-12)
    assert frame.loc["b", "interval"] == pytest.approx(T_975_2 * 2 / math.sqrt(3), rel=1e-12)
    assert list(frame["verdict"]) == ["through our spread"] * 2 + ["reproduced"] * 3 + ["", ""]
    # one narrow cell fewer: the median of 12.706, 4.968, 0.497, 0.497 is 2.73, beyond both Δs
    fewer = paper.table_frame(cells[:4] + cells[5:], "t").set_index("column")
    assert list(fewer["verdict"][:2]) == ["seed noise only", "seed noise only"]
    # a collapse in a: through our spread whatever the typical width
    cells[0].collapses = {"r": {"collapsed": True, "episodes": []}}
    again = paper.table_frame(cells[:4] + cells[5:], "t").set_index("column")
    assert again.loc["a", "verdict"] == "through our spread" and again.loc["a", "collapsed"] == 1


def test_the_table_frame_passes_the_papers_std_and_seed_count_and_its_tolerance():
    cells = [_cell("a", 60.68, [62.0, 62.2, 62.4], std=1.05), _cell("b", 61.0, [62.0, 64.0])]
    one_sample = paper.table_frame(cells, "t").set_index("column")  # no paper_seeds: our interval alone
    assert one_sample.loc["a", "interval"] == pytest.approx(_one_sample_half_width([62.0, 62.2, 62.4]), rel=1e-12)
    welch = paper.table_frame(cells, "t", paper_seeds=3).set_index("column")
    p = stats.ttest_ind_from_stats(62.2, 0.2, 3, 62.2 + welch.loc["a", "interval"], 1.05, 3, equal_var=False).pvalue
    assert p == pytest.approx(0.05, rel=1e-9)
    assert welch.loc["b", "interval"] == pytest.approx(T_975_1, rel=1e-12)  # no std printed
    wide = paper.table_frame(cells, "t", tolerance=2.0).set_index("column")
    assert list(wide["allowed"]) == [2.0, 2.0]
    assert list(wide["verdict"]) == ["reproduced", "reproduced"]  # Δ 1.52 and 2.0, at the edge
    assert list(one_sample["verdict"]) == ["neither", "seed noise only"]


# ------------------------------------------------------------------------------------------------ critical_round


def test_the_critical_round_is_where_the_moving_average_first_reaches_zero():
    """window 3 over rounds 10, 20, ..., 70: averages of (3,2,1) 2, (2,1,0) 1, (1,0,-1) 0 -> the window ending at
    the 5th value, round 50 (an average of exactly 0 counts)."""
    rounds = np.array([10, 20, 30, 40, 50, 60, 70])
    values = np.array([3.0, 2.0, 1.0, 0.0, -1.0, -5.0, -5.0])
    assert paper.critical_round(rounds, values, window=3) == 50.0
    assert paper.critical_round(rounds, values + 1e-9, window=3) == 60.0  # just above 0: the next window
    # the default window is 5: averages 1, -0.6 (2+1+0-1-5)/5 -> the window ending at round 60
    assert paper.critical_round(rounds, values) == 60.0
    assert paper.critical_round(rounds, values, window=1) == 40.0
    assert paper.critical_round(rounds, values, window=7) == 70.0  # exactly as long as the run: one window
    assert paper.critical_round(rounds, -np.ones(7), window=7) == 70.0


def test_a_run_that_never_reaches_the_critical_point_or_is_shorter_than_the_window_has_none():
    rounds = np.arange(1, 8)
    assert paper.critical_round(rounds, np.ones(7), window=3) == INF
    assert paper.critical_round(rounds, -np.ones(7), window=8) == INF
    assert paper.critical_round(rounds[:4], -np.ones(4)) == INF  # default window 5
    assert paper.critical_round(rounds[:5], -np.ones(5)) == 5.0


def test_a_runs_critical_round_reads_its_logged_rounds_of_the_metrics_column():
    frame = pd.DataFrame(
        {
            "round": [1, 2, 3, 4, 5, 6, 7, 8],
            "coherence": [0.5, NAN, 0.3, NAN, -0.2, -0.4, -0.6, -0.8],
            "test_acc": [0.1] * 8,
        }
    )
    # logged: rounds 1, 3, 5, 6, 7, 8 -> window 2 averages 0.4, 0.05, -0.3: ending at the 4th logged, round 6
    assert paper._run_critical_round({"column": "coherence", "window": 2}, frame) == 6.0
    # default window 5: (0.5 + 0.3 - 0.2 - 0.4 - 0.6) / 5 = -0.08 ending at the 5th logged, round 7
    assert paper._run_critical_round({"column": "coherence"}, frame) == 7.0
    assert paper._run_critical_round({"column": "coherence", "window": 7}, frame) == INF
    assert paper._run_critical_round({"column": "cosine"}, frame) is None  # the run does not log it


# ------------------------------------------------------------------------------------------------ gain_share_after


def _acc(rounds, values):
    return pd.DataFrame({"round": rounds, "test_acc": values})


def test_the_share_of_the_gain_after_the_critical_round_hand_worked():
    acc = _acc([1, 2, 3, 4, 5, 6], [0.1, 0.2, 0.4, 0.5, 0.6, 0.7])
    # first 0.1, end = mean of the last 2 = 0.65, at round 3: 0.4 -> (0.65 - 0.4) / (0.65 - 0.1)
    assert paper.gain_share_after(acc, 3.0, last_rounds=2) == pytest.approx(0.25 / 0.55, rel=1e-12)
    # between logged rounds: the first logged round from there on (round 4: 0.5)
    assert paper.gain_share_after(acc, 3.5, last_rounds=2) == pytest.approx(0.15 / 0.55, rel=1e-12)
    assert paper.gain_share_after(acc, 1.0, last_rounds=2) == pytest.approx(1.0, rel=1e-12)
    # the default: the last 10 logged rounds
    twelve = _acc(list(range(1, 13)), [0.0, 0.0] + [0.5] * 9 + [0.6])
    end = (0.5 * 9 + 0.6) / 10
    assert paper.gain_share_after(twelve, 12.0) == pytest.approx((end - 0.6) / end, rel=1e-12)


def test_no_share_without_a_critical_point_past_the_run_or_a_gain():
    acc = _acc([1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4])
    assert paper.gain_share_after(acc, INF, 2) is None
    assert paper.gain_share_after(acc, 5.0, 2) is None  # after the last logged round
    assert paper.gain_share_after(acc, 4.0, 2) == pytest.approx((0.35 - 0.4) / 0.25, rel=1e-12)
    assert paper.gain_share_after(_acc([1, 2, 3], [0.4, 0.2, 0.6]), 2.0, 2) is None  # end 0.4 = first: no gain
    assert paper.gain_share_after(_acc([1, 2, 3], [0.5, 0.2, 0.4]), 2.0, 2) is None  # a loss


# ------------------------------------------------------------------------------------------------ client_factors


def test_client_factors_hand_worked():
    """Three clients over three classes, plus one with no data: DS the row sums, HD = 1 / the population variance
    of the class shares, a uniform (or empty) client's HD the largest finite one, 1e12."""
    counts = [[6, 3, 1], [8, 2, 0], [4, 4, 4], [0, 0, 0]]
    f = paper.client_factors(counts)
    var0 = ((0.6 - 1 / 3) ** 2 + (0.3 - 1 / 3) ** 2 + (0.1 - 1 / 3) ** 2) / 3
    var1 = ((0.8 - 1 / 3) ** 2 + (0.2 - 1 / 3) ** 2 + (1 / 3) ** 2) / 3
    assert list(f["ds"]) == [10.0, 10.0, 12.0, 0.0]
    assert f["hd"] == pytest.approx([1 / var0, 1 / var1, 1e12, 1e12], rel=1e-12)
    assert f["ds_hd"] == pytest.approx([10 / var0, 10 / var1, 12e12, 0.0], rel=1e-12)
    two = paper.client_factors([[9, 1], [3, 7], [1, 0]])  # two classes: var = (p - 1/2)^2
    assert two["hd"] == pytest.approx([1 / 0.16, 1 / 0.04, 4.0], rel=1e-12)  # one sample: its shares 1 and 0


# ------------------------------------------------------------------------------------------------ weight_correlation


def test_the_weight_correlation_accumulates_each_clients_weights_over_rounds_zero_where_not_sampled():
    counts = [[6, 3, 1], [8, 2, 0], [5, 5, 0], [1, 1, 1]]
    frame = pd.DataFrame(
        {
            "round": [1, 2, 3],
            "lambda_client_0": [0.5, NAN, 0.2],
            "lambda_client_1": [0.5, 0.3, NAN],
            "lambda_client_3": [NAN, 0.7, 0.8],  # client 2 never sampled: no column
        }
    )
    accumulated = [0.7, 0.8, 0.0, 1.5]
    factors = paper.client_factors(counts)
    for factor in ("ds", "hd", "ds_hd"):
        expected = stats.pearsonr(accumulated, factors[factor]).statistic
        assert paper.weight_correlation({"client_class_counts": counts}, frame, factor) == pytest.approx(
            expected, rel=1e-12
        )


def test_no_weight_correlation_without_class_counts_or_weights():
    frame = pd.DataFrame({"round": [1], "lambda_client_0": [1.0], "lambda_client_1": [0.0]})
    assert paper.weight_correlation({}, frame, "ds") is None
    assert paper.weight_correlation({"client_class_counts": []}, frame, "ds") is None
    no_weights = pd.DataFrame({"round": [1], "lambda_client_7": [1.0]})
    assert paper.weight_correlation({"client_class_counts": [[1, 2], [3, 1]]}, no_weights, "ds") is None


# ------------------------------------------------------------------------------------------------ load_runs


def _write_run(runs, run_id, setting, status="finished", accs=None, metrics_text=None, summary_text=None):
    out = runs / run_id
    out.mkdir(parents=True)
    if accs is not None:
        pd.DataFrame({"round": np.arange(1, len(accs) + 1), "test_acc": accs}).to_csv(out / "metrics.csv", index=False)
    if metrics_text is not None:
        (out / "metrics.csv").write_text(metrics_text)
    summary = {"run": run_id, "status": status, "setting": setting}
    (out / "summary.json").write_text(summary_text if summary_text is not None else json.dumps(summary))
    return summary


def test_load_runs_reads_every_finished_run_and_skips_a_damaged_one_with_a_warning(tmp_path, capsys):
    runs = tmp_path / "runs"
    setting = {"algorithm": "fedavg", "dataset": "fmnist", "seed": 1}
    a = _write_run(runs, "a", setting, accs=[0.5, 0.8, 0.3, 0.82])  # a 50-point fall: collapsed
    b = _write_run(runs, "b", {**setting, "seed": 2}, accs=[0.5, 0.6, 0.7])
    c = _write_run(runs, "c", {**setting, "seed": 3})  # no metrics.csv
    _write_run(runs, "d", setting, summary_text="[1, 2]")  # not a summary
    _write_run(runs, "e", setting, metrics_text="")  # an empty metrics.csv
    _write_run(runs, "f", setting, summary_text="{")  # truncated
    (runs / "g").mkdir()  # no summary: not finished
    (runs / "g" / "metrics.csv").write_text("round,test_acc\n1,0.5\n")
    loaded = paper.load_runs(runs)
    assert [r["id"] for r in loaded] == ["a", "b", "c"]
    assert [r["summary"] for r in loaded] == [a, b, c]
    assert [r["setting"] for r in loaded] == [a["setting"], b["setting"], c["setting"]]
    assert list(loaded[0]["metrics"]["test_acc"]) == [0.5, 0.8, 0.3, 0.82]
    assert list(loaded[1]["metrics"]["round"]) == [1, 2, 3]
    assert loaded[2]["metrics"] is None and loaded[2]["collapse"] is None
    assert loaded[0]["collapse"]["collapsed"] is True
    assert loaded[0]["collapse"]["episodes"][0]["low_round"] == 3
    assert loaded[1]["collapse"]["collapsed"] is False
    assert set(loaded[0]) == {"id", "setting", "summary", "metrics", "collapse"}
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("warning: skipped: ") for line in err)
    assert [any(f"/{name}/" in line for line in err) for name in "def"] == [True, True, True]


def test_load_runs_keeps_only_the_named_ids(tmp_path):
    runs = tmp_path / "runs"
    for name in "abc":
        _write_run(runs, name, {"algorithm": "fedavg"}, accs=[0.5])
    assert [r["id"] for r in paper.load_runs(runs, {"c", "a", "zz"})] == ["a", "c"]
    assert paper.load_runs(runs, set()) == []
    assert [r["id"] for r in paper.load_runs(runs, None)] == ["a", "b", "c"]
    assert paper.load_runs(tmp_path / "none") == []


# ------------------------------------------------------------------------------------------------ run_metric


def test_rounds_to_target_is_the_first_round_at_or_above_it_and_inf_when_never():
    frame = pd.DataFrame({"round": [5, 10, 15, 20], "test_acc": [0.3, 0.6, 0.61, 0.7]})
    done = {"status": "finished"}
    assert paper.run_metric({"kind": "rounds_to_target", "target": 0.6}, done, frame) == 10.0  # at: reached
    assert paper.run_metric({"kind": "rounds_to_target", "target": 0.605}, done, frame) == 15.0
    assert paper.run_metric({"kind": "rounds_to_target", "target": 0.71}, done, frame) == INF
    # a cell with a seed that never reached it: a mean of inf, no interval, verdict 'no interval'
    cell = _cell("a", 300.0, [250.0, INF])
    assert cell.delta == INF and paper.noise_interval(cell.ours) is None
    assert paper.verdict(cell.delta, 20.0, paper.noise_interval(cell.ours)) == "no interval"


# ------------------------------------------------------------------------------------------------ run_metric

DONE = {"status": "finished"}


def _metrics():
    """Ten rounds: accuracy NaN in rounds 4 and 10 (not evaluated), a loss logged every 3 rounds, an indicator
    with an inf and a NaN inside rounds 3-7."""
    return pd.DataFrame(
        {
            "round": list(range(1, 11)),
            "test_acc": [0.1, 0.2, 0.3, NAN, 0.5, 0.6, 0.7, 0.8, 0.9, NAN],
            "loss": [NAN, NAN, 3.0, NAN, NAN, 2.0, NAN, NAN, 1.0, NAN],
            "gamma": [1.0, 2.0, 4.0, INF, 6.0, NAN, 8.0, 9.0, 10.0, 11.0],
            "norm": [1.0, 1.0, 2.0, 1.0, 3.0, 1.0, 4.0, 1.0, 1.0, 1.0],
        }
    )


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        # the last 3 evaluated rounds (10 is not): 0.7, 0.8, 0.9, in points
        ({"kind": "mean_last_rounds", "rounds": 3, "scale": 100}, 80.0),
        ({"kind": "mean_last_rounds", "rounds": 3}, 0.8),  # scale 1 unless given
        # the last ceil(0.25 x 10) = 3 rounds, 8-10, their evaluated ones: 0.8, 0.9
        ({"kind": "mean_last_fraction", "fraction": 0.25, "scale": 100}, 85.0),
        ({"kind": "mean_last_fraction", "fraction": 0.21}, 0.85),  # ceil, not round: 2.1 -> 3 rounds
        ({"kind": "mean_over_rounds", "column": "norm", "scale": 2}, 3.2),
        ({"kind": "mean_last_logged", "column": "loss", "rounds": 2, "scale": 4}, 6.0),
        ({"kind": "mean_last_logged", "column": "loss"}, 1.0),  # the last logged value alone
        # rounds 3-7 inclusive, inf and NaN left out: 4, 6, 8
        ({"kind": "mean_round_range", "column": "gamma", "first": 3, "last": 7, "scale": 10}, 60.0),
        # per-round ratio gamma / norm over rounds 3-7: 2, inf, 2, NaN, 2
        ({"kind": "mean_round_range", "column": "gamma", "divide_by": "norm", "first": 3, "last": 7}, 2.0),
        ({"kind": "mean_round_range", "column": "cosine", "first": 3, "last": 7}, None),  # not logged
        ({"kind": "mean_round_range", "column": "gamma", "divide_by": "cosine", "first": 3, "last": 7}, None),
        ({"kind": "mean_round_range", "column": "gamma", "first": 4, "last": 4}, None),  # only an inf
        ({"kind": "mean_round_range", "column": "gamma", "first": 6, "last": 6}, None),  # only a NaN
    ],
)
def test_each_metric_kind_reads_its_window_of_the_run(metric, expected):
    value = paper.run_metric(metric, DONE, _metrics())
    assert value == (expected if expected is None else pytest.approx(expected, rel=1e-12))


def test_the_last_fraction_is_at_least_one_round_and_a_window_of_unevaluated_rounds_has_no_mean():
    nine = _metrics().iloc[:9]  # rounds 1-9, the last evaluated
    assert paper.run_metric({"kind": "mean_last_fraction", "fraction": 0.0}, DONE, nine) == pytest.approx(0.9)
    assert paper.run_metric({"kind": "mean_last_fraction", "fraction": 0.01}, DONE, nine) == pytest.approx(0.9)
    assert math.isnan(paper.run_metric({"kind": "mean_last_fraction", "fraction": 0.01}, DONE, _metrics()))


def test_no_metric_for_an_unfinished_run_or_one_without_metrics_and_an_unknown_kind_is_refused():
    metric = {"kind": "mean_last_rounds", "rounds": 3}
    assert paper.run_metric(metric, {"status": "diverged"}, _metrics()) is None
    assert paper.run_metric(metric, {}, _metrics()) is None
    assert paper.run_metric(metric, DONE, None) is None
    assert paper.run_metric(metric, DONE, _metrics().iloc[:0]) is None
    with pytest.raises(ValueError, match="^unknown metric kind 'median'$"):
        paper.run_metric({"kind": "median"}, DONE, _metrics())


def test_the_critical_round_and_the_gain_after_it_as_run_metrics():
    """Coherence -> window-2 averages 0.5, 0.15, -0.15 (rounds 2, 3, 4): critical round 4; without a window the
    default 5 gives (0.6 + 0.4 - 0.1 - 0.2 - 0.9) / 5 = -0.04, round 5. Accuracy (NaN at round 6 left out):
    first 0.1, the mean of the last 2 logged rounds (5, 7) 0.7, at round 4: 0.4 -> (0.7 - 0.4) / 0.6."""
    frame = pd.DataFrame(
        {
            "round": [1, 2, 3, 4, 5, 6, 7],
            "coherence": [0.6, 0.4, -0.1, -0.2, -0.9, -1.0, -1.0],
            "test_acc": [0.1, 0.2, 0.3, 0.4, 0.6, NAN, 0.8],
        }
    )
    coherence = {"column": "coherence", "window": 2}
    assert paper.run_metric({"kind": "critical_round", **coherence}, DONE, frame) == 4.0
    assert paper.run_metric({"kind": "critical_round", "column": "coherence"}, DONE, frame) == 5.0
    assert paper.run_metric({"kind": "critical_round", "column": "cosine"}, DONE, frame) is None
    gain = {"kind": "gain_after_critical", **coherence}
    assert paper.run_metric({**gain, "last_rounds": 2}, DONE, frame) == pytest.approx(0.3 / 0.6, rel=1e-12)
    # the default: the last 10 logged rounds, here all six: mean 2.4 / 6 = 0.4, at round 4 0.4 -> no share after
    assert paper.run_metric(gain, DONE, frame) == pytest.approx(0.0, abs=1e-15)
    assert paper.run_metric({**gain, "window": 8}, DONE, frame) is None  # longer than the run: no critical point
    assert paper.run_metric(gain, DONE, frame.drop(columns="test_acc")) is None
    # twelve rounds: the default's last 10 (0.2 and nine 0.6: 0.56), critical round 3 (an average of exactly 0)
    twelve = pd.DataFrame(
        {
            "round": list(range(1, 13)),
            "coherence": [1.0, 1.0, -1.0] + [-1.0] * 9,
            "test_acc": [0.0, 0.5, 0.2] + [0.6] * 9,
        }
    )
    assert paper.run_metric(gain, DONE, twelve) == pytest.approx((0.56 - 0.2) / 0.56, rel=1e-12)


def test_the_weight_correlation_as_a_run_metric_names_its_factor():
    counts = [[6, 3, 1], [8, 2, 0], [1, 1, 1]]
    summary = {**DONE, "client_class_counts": counts}
    frame = pd.DataFrame(
        {
            "round": [1, 2],
            "lambda_client_0": [0.2, 0.3],
            "lambda_client_1": [0.1, NAN],
            "lambda_client_2": [0.7, 0.7],
            "test_acc": [0.1, 0.2],
        }
    )
    factors = paper.client_factors(counts)
    for factor in ("ds", "hd"):
        expected = stats.pearsonr([0.5, 0.1, 1.4], factors[factor]).statistic
        metric = {"kind": "weight_correlation", "factor": factor}
        assert paper.run_metric(metric, summary, frame) == pytest.approx(expected, rel=1e-12)
