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
