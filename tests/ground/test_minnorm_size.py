"""The min-norm solver at FedAWARE's size: N = 100 clients, its defaults (fw_max_iter 1000, fw_tol 1e-6), Gram
matrices like the momenta's (unit-normalised as the code does, low-rank and full-rank, sharing a common direction
or not, computed in float32 as the momenta are), several seeds, against an exact solution computed here.

The exact solution: Lawson and Hanson's least-distance programme (Solving Least Squares Problems, ch. 23) turns
min ||V^T l||^2 over the simplex into one non-negative least squares problem, min_{u >= 0} ||[V^T; 1^T] u - e||
with e = (0, .., 0, 1); then l* = u / sum(u). scipy's ``nnls`` is an active-set method that ends at the exact
optimum (to rounding), so it is independent of the solver under test (a Frank-Wolfe type method on the Gram
matrix).

Tolerances come from the stopping rule: the solver stops when the Frank-Wolfe duality gap is at most
tol * max_i ||v_i||^2, and the gap bounds f(l) - f*. For the min-norm point x = V^T l and the optimum x*,
||x - x*||^2 <= f(l) - f* (x* is the projection of 0 onto the hull). A float32 Gram matrix is the float64 one
up to about 1e-6 of its scale (float32 rounding, summed over 500 coordinates), which the float32 cases add.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import nnls

from fedrepro.minnorm import min_norm_weights

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

N, MAX_ITER, TOL = 100, 1000, 1e-6  # FedAWARE's defaults (fedaware.fw_max_iter, fedaware.fw_tol), 100 clients


def exact_min_norm(v: np.ndarray) -> tuple[float, np.ndarray]:
    n, p = v.shape
    e = np.zeros(p + 1)
    e[-1] = 1.0
    u, _ = nnls(np.vstack([v.T, np.ones((1, n))]), e, maxiter=50 * n)
    lam = u / u.sum()
    return float(np.sum((v.T @ lam) ** 2)), lam


def momenta(kind: str, shift: float, seed: int) -> np.ndarray:
    """N unit vectors in 500 dimensions: of rank r (low-rank: clients' updates dominated by a few directions),
    or full rank in p dimensions; ``shift`` adds a direction common to all (clients that agree on a descent
    direction: 0 is then outside the hull)."""
    rng = np.random.default_rng(seed)
    if kind.startswith("rank"):
        r = int(kind[4:])
        v = rng.standard_normal((N, r)) @ rng.standard_normal((r, 500))
    else:
        v = rng.standard_normal((N, int(kind[4:])))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    common = rng.standard_normal(v.shape[1])
    v = v + shift * common / np.linalg.norm(common)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


CASES = [
    (kind, shift, seed)
    for kind in ("rank5", "rank20", "rank50", "full50", "full200", "full1000")
    for shift in (0.0, 0.3, 1.0)
    for seed in (0, 1)
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind,shift,seed", CASES)
def test_the_solver_reaches_the_exact_optimum_at_fedawares_size(kind, shift, seed, dtype):
    v = momenta(kind, shift, seed)
    vt = torch.from_numpy(v).to(dtype)
    gram = vt @ vt.T  # as FedAWARE forms it from the momenta
    result = min_norm_weights(gram, MAX_ITER, TOL)
    assert result.iterations < MAX_ITER, f"stopped at the iteration cap with gap {result.gap:.2e}"
    lam = result.weights.double().numpy()
    assert lam.min() >= 0 and abs(lam.sum() - 1) < 1e-6
    best, _ = exact_min_norm(v)
    slack = 1e-12 if dtype == torch.float64 else 2e-6  # float32 Gram: its rounding, see the module's text
    value = float(np.sum((v.T @ lam) ** 2))  # the objective of the returned weights, in float64
    assert value - best <= TOL + slack, f"f - f* = {value - best:.2e}"
    assert value >= best - 1e-12 - slack
    assert result.value == pytest.approx(value, abs=1e-12 + slack)
    # the min-norm point itself: ||x - x*||^2 <= f - f*
    _, exact_lam = exact_min_norm(v)
    assert np.sum((v.T @ lam - v.T @ exact_lam) ** 2) <= TOL + 2 * slack
    # and the gap the test computes from the Gram matrix agrees with the stopping rule
    g = v @ v.T
    u = g @ lam
    assert 2 * (lam @ u - u.min()) <= TOL + 2 * slack


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unnormalised_momenta_of_unequal_lengths(seed):
    """``fedaware.normalize: false`` (the paper's text): momenta whose norms span three orders of magnitude."""
    v = momenta("rank20", 0.3, seed) * np.logspace(-1.5, 1.5, N)[:, None]
    scale = float((v**2).sum(1).max())
    result = min_norm_weights(torch.from_numpy(v @ v.T), MAX_ITER, TOL)
    assert result.iterations < MAX_ITER
    best, _ = exact_min_norm(v)
    assert -1e-12 * scale <= result.value - best <= TOL * scale


def test_the_affine_minimum_of_a_corral_with_a_repeated_vertex_falls_back_to_least_squares():
    """Two clients with the same momentum make the corral's KKT matrix singular (np.linalg.solve refuses it);
    the least-squares fallback must still give weights summing to 1 whose point is the affine hull's
    minimum-norm point, worked out by hand: a = (1, 0) twice and b = (0, 2): the line a + t (b - a) is nearest
    the origin at t = -a.(b - a) / |b - a|^2 = 1/5, the point (0.8, 0.4). (float64 solves of 4 x 4 systems of
    entries up to 4: rounding near 1e-15, the bound 1e-12.)"""
    from fedrepro.minnorm import _affine_minimum

    v = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    m = v @ v.T
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.solve(
            np.block([[m[:2, :2], np.ones((2, 1))], [np.ones((1, 2)), np.zeros((1, 1))]]), np.array([0.0, 0.0, 1.0])
        )
    pair = _affine_minimum(m, [0, 1])
    assert pair.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(pair @ v[:2], [1.0, 0.0], rtol=0, atol=1e-12)
    three = _affine_minimum(m, [0, 1, 2])
    assert three.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(three @ v, [0.8, 0.4], rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_start_is_the_best_point_on_any_edge_of_the_simplex(seed):
    """best_pair (the reference code's start): of every segment [v_i, v_j], the point nearest the origin, found
    here by brute force over all pairs and a grid of 20,001 points a segment. The grid's minimum is at most
    curvature x (h/2)^2 above the segment's (h = 5e-5, curvature |v_i - v_j|^2 <= 4 max |v|^2): below 1e-7 here."""
    from fedrepro.minnorm import best_pair

    rng = np.random.default_rng(seed)
    v = rng.standard_normal((7, 3)) * rng.uniform(0.5, 2.0, (7, 1)) + 0.8  # unequal lengths, a common shift
    m = v @ v.T
    grid = np.linspace(0.0, 1.0, 20001)
    brute = min(
        float(np.min(np.sum((grid[:, None] * v[i] + (1 - grid[:, None]) * v[j]) ** 2, axis=1)))
        for i in range(7)
        for j in range(i + 1, 7)
    )
    lam = best_pair(m)
    assert (lam >= 0).all() and np.count_nonzero(lam) <= 2 and lam.sum() == pytest.approx(1.0, abs=1e-15)
    value = float(lam @ m @ lam)
    assert brute - 1e-7 <= value <= brute + 1e-12
    assert best_pair(np.array([[2.0]])).tolist() == [1.0]
    # two equal vectors: the segment is a point, its weight all on one end
    assert sorted(best_pair(np.array([[1.0, 1.0], [1.0, 1.0]])).tolist()) == [0.0, 1.0]
