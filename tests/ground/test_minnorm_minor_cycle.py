"""Wolfe's minor cycle (`minnorm._minor_cycle`) step by step against the same cycle in exact rational arithmetic,
written here from Wolfe (1976): from x on the corral's simplex, go toward the corral's affine minimum y; while y has
a weight <= 0, stop at the last point of the segment still in the simplex, x + theta (y - x) with
theta = min over {j : y_j <= 0} of x_j / (x_j - y_j) (0 for a vertex at weight 0), drop the vertex whose weight
reached 0, and take the smaller corral's affine minimum.

The optimum the solver returns does not depend on this path (the major loop keeps a trial only if it is lower, and
otherwise searches the line), so the solver's tests cannot see a wrong step back; these compare the cycle itself,
on cases with one, two and three step backs, a vertex at weight 0 that must leave at once, and an affine weight
of exactly 0."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from fedrepro import minnorm
from fedrepro.minnorm import _affine_minimum, _minor_cycle


def exact_affine_minimum(points: list[tuple[int, ...]], corral: list[int]) -> list[Fraction]:
    """Weights a (summing to 1) of the minimum-norm point of the corral's affine hull: [G 1; 1^T 0][a; mu] = [0; 1],
    G the corral's Gram matrix, solved by Gauss-Jordan elimination over the rationals."""
    k = len(corral)
    rows = [
        [Fraction(sum(p * q for p, q in zip(points[i], points[j]))) for j in corral] + [Fraction(1), Fraction(0)]
        for i in corral
    ]
    rows.append([Fraction(1)] * k + [Fraction(0), Fraction(1)])
    for col in range(k + 1):
        pivot = next(r for r in range(col, k + 1) if rows[r][col] != 0)
        rows[col], rows[pivot] = rows[pivot], rows[col]
        rows[col] = [v / rows[col][col] for v in rows[col]]
        for r in range(k + 1):
            if r != col and rows[r][col] != 0:
                factor = rows[r][col]
                rows[r] = [v - factor * w for v, w in zip(rows[r], rows[col])]
    return [rows[i][k + 1] for i in range(k)]


def exact_minor_cycle(points, lam: list[Fraction], corral: list[int], zeros_exact_in_floats: bool = False):
    """The cycle in exact arithmetic: (final weights, final corral, vertices dropped in order), or None where
    rounding decides the path: two vertices blocking at the same theta, or an affine weight of exactly 0 (floating
    point puts it a few ulps to either side, unless the case makes it exactly 0 there too)."""
    x = {i: lam[i] for i in corral}
    dropped = []
    while True:
        y = dict(zip(corral, exact_affine_minimum(points, corral)))
        if not zeros_exact_in_floats and any(w == 0 for w in y.values()):
            return None
        if all(y[i] > 0 for i in corral):
            out = [Fraction(0)] * len(points)
            for i in corral:
                out[i] = y[i]
            return out, corral, dropped
        ratios = {i: (x[i] / (x[i] - y[i]) if x[i] > 0 else Fraction(0)) for i in corral if y[i] <= 0}
        theta = min(ratios.values())
        if sum(r == theta for r in ratios.values()) > 1:
            return None
        x = {i: x[i] + theta * (y[i] - x[i]) for i in corral}
        leaving = [i for i in corral if x[i] == 0]
        if len(leaving) > 1:
            return None
        dropped += leaving
        corral = [i for i in corral if x[i] != 0]


def run_both(points, lam, corral, zeros_exact_in_floats=False):
    v = np.array(points, dtype=float)
    got_lam, got_corral = _minor_cycle(v @ v.T, np.array([float(w) for w in lam]), list(corral))
    return (got_lam, got_corral), exact_minor_cycle(points, lam, list(corral), zeros_exact_in_floats)


def test_one_and_two_step_backs_worked_by_hand():
    # (1, 1), (-1, 1), (-3, -1): the affine hull is the plane, its minimum the origin, whose weights
    # (a - b - 3c = 0, a + b - c = 0, a + b + c = 1) are y = (1, -1/2, 1/2): vertex 1 is out. From
    # x = (1/10, 1/2, 2/5), theta = (1/2) / (1/2 + 1/2) = 1/2 and x becomes (11/20, 0, 9/20); vertex 1 leaves. The
    # segment from (1, 1) to (-3, -1) comes nearest the origin at (-1/5, 2/5), weights (7/10, 3/10): the cycle ends.
    points = [(1, 1), (-1, 1), (-3, -1)]
    lam = [Fraction(1, 10), Fraction(1, 2), Fraction(2, 5)]
    assert exact_affine_minimum(points, [0, 1, 2]) == [1, Fraction(-1, 2), Fraction(1, 2)]
    (got, corral), (want, want_corral, dropped) = run_both(points, lam, [0, 1, 2])
    assert dropped == [1] and want_corral == [0, 2] and want == [Fraction(7, 10), 0, Fraction(3, 10)]
    assert corral == [0, 2]
    np.testing.assert_allclose(got, [0.7, 0.0, 0.3], atol=1e-15)

    # (3, -2), (0, 1), (-2, 4) from x = (1/8, 1/2, 3/8): the origin is y = (-2/3, 8/3, -1), two vertices out.
    # Vertex 0 blocks first: 1/8 / (1/8 + 2/3) = 3/19 < 3/8 / (3/8 + 1) = 3/11; x becomes (0, 16/19, 3/19).
    # The line through (0, 1) and (-2, 4) is nearest the origin at weights (16/13, -3/13): vertex 2 is out
    # too, blocking at theta = (3/19) / (3/19 + 3/13) = 13/32. The cycle ends at vertex 1 alone.
    points = [(3, -2), (0, 1), (-2, 4)]
    lam = [Fraction(1, 8), Fraction(1, 2), Fraction(3, 8)]
    assert exact_affine_minimum(points, [0, 1, 2]) == [Fraction(-2, 3), Fraction(8, 3), -1]
    assert exact_affine_minimum(points, [1, 2]) == [Fraction(16, 13), Fraction(-3, 13)]
    (got, corral), (want, want_corral, dropped) = run_both(points, lam, [0, 1, 2])
    assert dropped == [0, 2] and want_corral == [1]
    assert corral == [1]
    np.testing.assert_allclose(got, [0.0, 1.0, 0.0], atol=1e-15)


def test_an_affine_weight_of_exactly_zero_steps_back_and_drops_that_vertex():
    # (1, 1, 0), (1, -1, 0), (1, 0, 1): the plane x = 1 comes nearest the origin at (1, 0, 0), the midpoint of the
    # first two, so the third vertex's affine weight is exactly 0. A weight <= 0 is not in the simplex's interior:
    # the cycle moves all the way (theta = x_2 / (x_2 - 0) = 1) and drops it, leaving a corral of positive weights.
    points = [(1, 1, 0), (1, -1, 0), (1, 0, 1)]
    v = np.array(points, dtype=float)
    assert _affine_minimum(v @ v.T, [0, 1, 2])[2] == 0.0  # exactly 0 in floating point too
    lam = [Fraction(1, 4), Fraction(1, 4), Fraction(1, 2)]
    (got, corral), (want, want_corral, dropped) = run_both(points, lam, [0, 1, 2], zeros_exact_in_floats=True)
    assert dropped == [2] and want_corral == [0, 1]
    assert corral == [0, 1]
    np.testing.assert_allclose(got, [0.5, 0.5, 0.0], atol=1e-15)


def random_cases(count: int, seed: int = 0):
    """Integer vertices, half of them moved away from the origin (its projection then lies far outside the
    corral, several weights out at once and several step backs in a row), from positive rational weights, in half
    the cases with the vertex just added at weight 0, as the major loop passes it."""
    rng = np.random.default_rng(seed)
    while count:
        dim = int(rng.integers(3, 6))
        k = int(rng.integers(3, dim + 2))  # at most dim + 1 affinely independent vertices
        offset = rng.integers(-12, 13, size=dim) * int(rng.integers(0, 2))
        points = [tuple(int(c) for c in rng.integers(-9, 10, size=dim) + offset) for _ in range(k + 1)]
        corral = sorted(rng.choice(k + 1, size=k, replace=False).tolist())
        v = np.array([points[i] for i in corral], dtype=float)
        if np.linalg.matrix_rank(v[1:] - v[0]) < k - 1:
            continue
        raw = [int(c) for c in rng.integers(1, 20, size=k)]
        if rng.random() < 0.5:
            raw[-1] = 0
        lam = [Fraction(0)] * (k + 1)
        for i, w in zip(corral, raw):
            lam[i] = Fraction(w, sum(raw))
        yield points, lam, corral
        count -= 1


def corrals_visited(monkeypatch, points, lam, corral) -> list[list[int]]:
    """The corrals the cycle takes the affine minimum of, in order: its path, which its result alone hides."""
    visited = []

    def recording(m, c):
        visited.append(list(c))
        return _affine_minimum(m, c)

    monkeypatch.setattr(minnorm, "_affine_minimum", recording)
    run_both(points, lam, corral)
    monkeypatch.undo()
    return visited


def test_the_minor_cycle_takes_the_same_path_as_exact_arithmetic_on_random_cases(monkeypatch):
    steps = {0: 0, 1: 0, 2: 0, 3: 0}
    zero_weight_blocks = 0
    for points, lam, corral in random_cases(600):
        (got, got_corral), exact = run_both(points, lam, corral)
        if exact is None:
            continue  # rounding decides
        want, want_corral, dropped = exact
        assert got_corral == want_corral, (points, lam, corral, dropped)
        np.testing.assert_allclose(got, [float(w) for w in want], rtol=1e-9, atol=1e-12)
        path = [list(corral)]
        for vertex in dropped:
            path.append([i for i in path[-1] if i != vertex])
        assert corrals_visited(monkeypatch, points, lam, corral) == path
        steps[min(len(dropped), 3)] += 1
        zero_weight_blocks += bool(dropped) and lam[dropped[0]] == 0
    # the paths the cases take: none, one, two and three or more step backs, and the vertex added at weight 0
    # blocking at theta = 0
    assert min(steps.values()) >= 20, steps
    assert zero_weight_blocks >= 20


# Cases where the second vertex to leave depends on where on the segment the first step back stops: found among
# random integer cases, their paths from exact arithmetic.
BOUNDARY_SENSITIVE = [
    ([(0, -5, 10), (5, -2, 7), (-2, -4, 3), (0, -1, 4)], [4, 5, 1, 4], [0, 1]),
    ([(-1, -3, 1), (1, -2, 2), (1, -3, 3), (5, 1, 6)], [4, 2, 5, 4], [2, 3]),
    ([(-4, 4, 11), (0, 0, 3), (3, -5, 7), (2, -1, 1)], [2, 3, 1, 3], [2, 0]),
]


@pytest.mark.parametrize("points, raw, dropped", BOUNDARY_SENSITIVE)
def test_each_step_back_stops_on_the_simplexs_boundary(points, raw, dropped):
    lam = [Fraction(w, sum(raw)) for w in raw]
    (got, got_corral), (want, want_corral, want_dropped) = run_both(points, lam, [0, 1, 2, 3])
    assert want_dropped == dropped
    assert got_corral == want_corral == [i for i in range(4) if i not in dropped]
    np.testing.assert_allclose(got, [float(w) for w in want], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", range(2))
def test_the_returned_weights_are_the_final_corrals_affine_minimum_and_positive(seed):
    for points, lam, corral in random_cases(50, seed=seed + 1):
        (got, got_corral), _ = run_both(points, lam, corral)
        assert np.all(got[got_corral] > 0) and got.sum() == pytest.approx(1.0, abs=1e-12)
        assert np.count_nonzero(got) == len(got_corral)
