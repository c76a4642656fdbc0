"""The min-norm solver's bookkeeping and its fallback step, each against a value worked out here: the duality gap
it reports, the iterations it counts, the default tolerance it meets, the float64 it computes in, and the exact
line search toward the Frank-Wolfe vertex that it takes when rounding leaves the affine step no better."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrepro import minnorm
from fedrepro.minnorm import best_pair, min_norm_weights


def gram_of(seed: int, n: int = 7, p: int = 5, shift: float = 1.0, scale: float = 1.0) -> torch.Tensor:
    v = torch.randn(n, p, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + shift
    return (scale * v) @ (scale * v).T


def gap_of(gram: torch.Tensor, lam: torch.Tensor) -> float:
    u = gram.double() @ lam.double()
    return float(2 * (lam.double() @ u - u.min()))


@pytest.mark.parametrize("seed", range(3))
def test_the_reported_gap_is_the_frank_wolfe_gap_of_the_returned_weights(seed):
    g = gram_of(seed, n=12, p=10, shift=0.3)
    assert min_norm_weights(g, max_iter=1).gap > 1e-3 * float(g.diagonal().max())  # a gap far above rounding
    for max_iter in (1, 2, 1000):
        r = min_norm_weights(g, max_iter=max_iter)
        # the two sums round apart by a few ulps of the scale; the gaps compared are far above that
        assert r.gap == pytest.approx(gap_of(g, r.weights), rel=1e-9, abs=1e-12 * float(g.diagonal().max()))
        assert r.value == pytest.approx(float(r.weights @ g @ r.weights), rel=1e-12)


def test_the_iterations_counted_are_the_major_iterations_run():
    g = gram_of(0, n=12, p=10, shift=0.3)
    full = min_norm_weights(g, tol=1e-12)
    assert full.iterations >= 4  # the cases below stop before convergence
    for cap in (1, 2, 3):
        assert min_norm_weights(g, max_iter=cap, tol=1e-12).iterations == cap
    none = min_norm_weights(g, max_iter=0)
    assert none.iterations == 0
    np.testing.assert_allclose(none.weights.numpy(), best_pair(g.numpy()), rtol=1e-12)  # no iteration: the start
    at_start = min_norm_weights(torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64))
    assert at_start.iterations == 1 and at_start.weights.tolist() == [0.5, 0.5]  # optimal at once: one check


def test_the_default_tolerance_is_one_millionth_of_the_largest_squared_norm():
    for seed in range(4):
        g = gram_of(seed, n=30, p=20, shift=0.2)
        r = min_norm_weights(g)
        assert r.gap <= 1e-6 * float(g.diagonal().max())
        assert r.gap == pytest.approx(gap_of(g, r.weights), rel=1e-9, abs=1e-12 * float(g.diagonal().max()))


def test_a_float32_gram_matrix_is_solved_in_float64():
    g32 = gram_of(1).float()
    r32, r64 = min_norm_weights(g32), min_norm_weights(g32.double())
    assert r32.weights.dtype == torch.float32
    assert torch.equal(r32.weights, r64.weights.float()) and r32.value == r64.value


def exact_line_search(v: np.ndarray, lam: np.ndarray, s: int) -> np.ndarray:
    """The point of the segment from x = V^T lam to v_s nearest 0: g = <x, x - v_s> / ||x - v_s||^2 in [0, 1]."""
    x = lam @ v
    d = x - v[s]
    g = min(max(float(x @ d / (d @ d)), 0.0), 1.0)
    out = (1 - g) * lam
    out[s] += g
    return out


@pytest.mark.parametrize("scale", [1.0, 0.05])  # 0.05: a curvature below 1
def test_when_the_affine_step_is_no_better_the_solver_searches_the_line_to_the_vertex(monkeypatch, scale):
    """Rounding can leave the corral's affine minimum no lower than the current point; the solver then takes the
    exact line search toward the Frank-Wolfe vertex. Forced here by a minor cycle that returns the start."""
    monkeypatch.setattr(minnorm, "_minor_cycle", lambda m, lam, corral: (lam.copy(), list(corral)))
    rng = np.random.default_rng(3)
    v = scale * (rng.standard_normal((6, 4)) + 0.5)
    g = torch.from_numpy(v @ v.T)
    lam = best_pair(v @ v.T)
    for step in (1, 2, 3):
        s = int(np.argmin((v @ v.T) @ lam))
        lam = exact_line_search(v, lam, s)
        r = min_norm_weights(g, max_iter=step, tol=0.0)
        np.testing.assert_allclose(r.weights.numpy(), lam, rtol=1e-10, atol=1e-12)
    # and as Frank-Wolfe with exact line searches it still converges to the optimum the corrals reach
    slow = min_norm_weights(g, max_iter=20000, tol=1e-9)
    monkeypatch.undo()
    fast = min_norm_weights(g, tol=1e-12)
    assert slow.value == pytest.approx(fast.value, rel=1e-6, abs=1e-9 * scale**2)


def test_the_solver_stops_at_the_first_iteration_whose_gap_meets_the_tolerance():
    """The stop is gap <= tol * max ||v_i||^2, tested at the very gap one run reaches: max ||v_i||^2 = 4 (a power of
    2, so tol = gap / 4 gives tol * 4 == gap exactly) and tol = the gap after c iterations: the run stops at the
    check after c iterations (iteration c + 1), no sooner and no later, at the capped run's weights."""
    rng = np.random.default_rng(5)
    v = rng.uniform(-0.5, 0.5, (12, 6)) + 0.3
    v[0] = [2.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    g = torch.from_numpy(v @ v.T)
    assert float(g.diagonal().max()) == 4.0
    capped = [min_norm_weights(g, max_iter=c, tol=0.0) for c in range(6)]
    gaps = [r.gap for r in capped]
    c = max(c for c in range(1, 6) if 0 < gaps[c] < min(gaps[:c]))
    r = min_norm_weights(g, tol=gaps[c] / 4)
    assert r.iterations == c + 1 and torch.equal(r.weights, capped[c].weights)
    assert min_norm_weights(g, tol=gaps[c] / 4 * (1 - 1e-12)).iterations > c + 1  # a hair tighter: on


def test_the_default_cap_is_1000_major_iterations(monkeypatch):
    """Frank-Wolfe with exact line searches (the fallback, forced) never reaches a negative tolerance: the loop
    ends at the default cap, FedAWARE's code's 1000."""
    monkeypatch.setattr(minnorm, "_minor_cycle", lambda m, lam, corral: (lam.copy(), list(corral)))
    v = np.random.default_rng(0).standard_normal((20, 10)) + 1.0  # Frank-Wolfe's slow case: far from done at 1000
    r = min_norm_weights(torch.from_numpy(v @ v.T), tol=-1.0)
    assert r.iterations == 1000 and r.gap > 1e-3


def test_each_minor_cycle_starts_from_the_current_support_and_the_new_vertex(monkeypatch):
    """The corral handed to the minor cycle is the support of the current weights (the best pair's at the start,
    after a line search the weights' new support) plus the Frank-Wolfe vertex unless already in it: recorded
    against both, computed here, with the minor cycle forced to return its start so that the line search runs
    every iteration."""
    seen = []

    def recording(m, lam, corral):
        seen.append((lam.copy(), list(corral), int(np.argmin(m @ lam))))
        return lam.copy(), list(corral)

    monkeypatch.setattr(minnorm, "_minor_cycle", recording)
    v = np.random.default_rng(0).standard_normal((7, 4)) + 0.4
    min_norm_weights(torch.from_numpy(v @ v.T), max_iter=6, tol=0.0)
    assert len(seen) == 6
    for lam, corral, s in seen:
        support = [int(i) for i in np.flatnonzero(lam > 0)]
        assert corral == support + ([] if s in support else [s])  # never twice
    assert len(seen[0][1]) == 3 and any(len(c) > 3 for _, c, _ in seen)  # the best pair's two, then more
    # after line searches the vertex can already be in the support (its weights are not the face's minimum)
    assert any(s in np.flatnonzero(lam > 0) for lam, _, s in seen)


def test_the_line_search_stops_at_the_vertex_when_the_minimum_lies_beyond_it(monkeypatch):
    """v_0 = (3, 0), v_1 = (1, 0) from x = (2, 0): the line x + g (v_1 - x) is nearest 0 at g = 2, past v_1; the
    step stops at g = 1, at v_1 itself (weights (0, 1)), where the gap is 0 and the solver stops."""
    monkeypatch.setattr(minnorm, "best_pair", lambda m: np.array([0.5, 0.5]))
    monkeypatch.setattr(minnorm, "_minor_cycle", lambda m, lam, corral: (lam.copy(), list(corral)))
    g = torch.tensor([[9.0, 3.0], [3.0, 1.0]], dtype=torch.float64)
    one = min_norm_weights(g, max_iter=1, tol=0.0)
    assert one.weights.tolist() == [0.0, 1.0] and one.value == 1.0 and one.gap == 0.0
    assert min_norm_weights(g).iterations == 2


@pytest.mark.parametrize("scale", [0.1, 3.0])  # 0.1: every edge's curvature |v_i - v_j|^2 below 1
def test_the_start_is_the_nearest_point_of_the_nearest_edge_at_any_scale(scale):
    """best_pair against the nearest point of each segment in closed form: t* = clip(<v_j, v_j - v_i> /
    |v_i - v_j|^2, 0, 1) on v_i, the rest on v_j."""
    v = scale * (np.random.default_rng(6).standard_normal((6, 3)) + 0.7)
    best = np.inf
    for i in range(6):
        for j in range(i + 1, 6):
            d = v[i] - v[j]
            t = min(max(float(-(v[j] @ d) / (d @ d)), 0.0), 1.0)
            best = min(best, float(np.sum((t * v[i] + (1 - t) * v[j]) ** 2)))
    lam = best_pair(v @ v.T)
    assert float(lam @ (v @ v.T) @ lam) == pytest.approx(best, rel=1e-12)
    if scale < 1:
        assert max(np.sum((v[i] - v[j]) ** 2) for i in range(6) for j in range(6)) < 1
