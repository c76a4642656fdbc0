"""Lanczos on Hessian-vector products (fedrepro.run.hessian) against the explicit Hessian of a tiny model."""

from __future__ import annotations

import pytest
import torch

from fedrepro.run import hessian

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

U64 = 2.0**-53  # float64's unit roundoff: the model and the Lanczos run are in float64


def _tiny():
    """Cross-entropy of a 3-4-3 tanh MLP on 20 fixed points, as a function of its 31 flat parameters."""
    torch.manual_seed(0)
    x, y = torch.randn(20, 3, dtype=torch.float64), torch.randint(0, 3, (20,))

    def loss_of(w):
        w1, b1, w2, b2 = w[:12].view(4, 3), w[12:16], w[16:28].view(3, 4), w[28:31]
        return torch.nn.functional.cross_entropy(torch.tanh(x @ w1.T + b1) @ w2.T + b2, y)

    return loss_of, torch.randn(31, dtype=torch.float64)


def test_hessian_vector_products_equal_the_explicit_hessian():
    loss_of, w = _tiny()
    h = torch.autograd.functional.hessian(loss_of, w)
    v = torch.randn(31, dtype=torch.float64)
    assert hessian.hvp(loss_of, w, v) == pytest.approx((h @ v).tolist(), abs=1e-10)


def test_lanczos_with_every_step_gives_the_top_eigenvalues_and_vector_exactly():
    loss_of, w = _tiny()
    exact, vectors = torch.linalg.eigh(torch.autograd.functional.hessian(loss_of, w))
    values, top = hessian.top_eigen(loss_of, w, k=5, steps=31)
    assert values.tolist() == pytest.approx(exact.flip(0)[:5].tolist(), abs=1e-8)
    # rounding moves the top eigenvector by an angle of at most (steps * n * u64 * |H|) / gap (Davis-Kahan on a
    # residual of that size); 1 - |cos| is below the angle
    angle = 31 * 31 * U64 * float(exact.abs().max()) / float(exact[-1] - exact[-2])
    assert abs(float(top @ vectors[:, -1])) == pytest.approx(1.0, abs=angle)  # up to sign


def test_a_few_lanczos_steps_find_the_largest_eigenvalue_of_a_spread_spectrum():
    # a quadratic 1/2 w^T A w with eigenvalues 100, 50, 10 and 97 values in [0, 1]: 20 steps resolve the top three
    torch.manual_seed(1)
    q, _ = torch.linalg.qr(torch.randn(100, 100, dtype=torch.float64))
    spectrum = torch.cat([torch.tensor([100.0, 50.0, 10.0], dtype=torch.float64), torch.rand(97, dtype=torch.float64)])
    a = q @ torch.diag(spectrum) @ q.T
    values, top = hessian.top_eigen(lambda w: 0.5 * w @ a @ w, torch.zeros(100, dtype=torch.float64), k=3, steps=20)
    # gaps over the rest of the spectrum of 1, 4 and 9 (Kaniel-Paige): after 17 to 19 steps the Chebyshev factors
    # put the convergence error far under float64 rounding, which is at most steps * n * u64 * |A| per Ritz value
    # and moves the top vector by that over the gap of 50
    rounding = 20 * 100 * U64 * 100.0
    assert values.tolist() == pytest.approx([100.0, 50.0, 10.0], abs=rounding)
    assert abs(float(top @ q[:, 0])) == pytest.approx(1.0, abs=rounding / 50.0)
