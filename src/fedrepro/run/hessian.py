"""Top Hessian eigenvalues of a loss at a flat parameter vector (FedLAW Fig. 10, middle and right), by
Lanczos iteration on Hessian-vector products: the Hessian is never formed.

    H v = d/dw <grad L(w), v>         (double back-propagation; exact, not a finite difference)

Lanczos with full re-orthogonalisation builds an orthonormal basis Q of the Krylov space of H from a random
start; the eigenvalues of the small tridiagonal T = Q^T H Q (Ritz values) converge to H's extreme eigenvalues
first (Golub and Van Loan, Matrix Computations, 10.1). With as many steps as parameters they are H's
eigenvalues exactly (tests/run/test_hessian.py checks against the explicit Hessian of a tiny model).
"""

from __future__ import annotations

from typing import Callable

import torch


def hvp(loss_of: Callable[[torch.Tensor], torch.Tensor], w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """H(w) v for the scalar function ``loss_of`` of the flat vector w."""
    w = w.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss_of(w), w, create_graph=True)
    (hv,) = torch.autograd.grad(grad @ v, w)
    return hv.detach()


def top_eigen(
    loss_of: Callable[[torch.Tensor], torch.Tensor], w: torch.Tensor, k: int = 5, steps: int = 20, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest Ritz values (descending) of the Hessian of ``loss_of`` at w after ``steps`` Lanczos
    steps, and the Ritz vector of the largest (unit norm, the top eigenvector's estimate)."""
    n = w.numel()
    steps = min(steps, n)
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(n, generator=g, dtype=torch.float64).to(w.device)
    basis = [q / q.norm()]
    alphas, betas = [], []
    for j in range(steps):
        v = hvp(loss_of, w, basis[j].to(w.dtype)).to(torch.float64)
        alphas.append(float(v @ basis[j]))
        for b in basis:  # full re-orthogonalisation: floating point loses the three-term recurrence's orthogonality
            v = v - (v @ b) * b
        beta = float(v.norm())
        if j == steps - 1 or beta < 1e-10:  # the Krylov space is exhausted: T is exact on it
            break
        betas.append(beta)
        basis.append(v / beta)
    m = len(alphas)
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if m > 1:
        off = torch.tensor(betas[: m - 1], dtype=torch.float64)
        t += torch.diag(off, 1) + torch.diag(off, -1)
    values, vectors = torch.linalg.eigh(t)
    order = torch.argsort(values, descending=True)
    top = torch.stack(basis[:m], 1) @ vectors[:, order[0]]
    return values[order[:k]].to(w.dtype), (top / top.norm()).to(w.dtype)
