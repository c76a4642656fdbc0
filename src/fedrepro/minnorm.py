"""The minimum-norm point of the convex hull of N vectors (FedAWARE Eq. 2):

    lambda* = argmin_{lambda in simplex} || sum_i lambda_i v_i ||^2 = argmin lambda^T M lambda,   M = V V^T

solved on the N x N Gram matrix, so the cost does not depend on the model size.

FedAWARE cites plain Frank-Wolfe (Jaggi, 2013); its code starts from the best pair of vertices and stops when
lambda moves by less than 1e-5 in L1. Frank-Wolfe, even with away or pairwise steps (Lacoste-Julien & Jaggi,
2015), needs tens of thousands of iterations at FedAWARE's size (N = 100 unit-norm momenta, nearly low-rank:
FedAWARE runs on FMNIST stopped at the 1000-iteration cap in almost every round, duality gap up to 1e-3). We use
Wolfe's minimum-norm-point algorithm (Wolfe, 1976), Frank-Wolfe's fully corrective form: each major iteration
adds the Frank-Wolfe vertex to a set of affinely independent vertices (the corral) and moves to the
minimum-norm point of their affine hull, stepping back to the hull's boundary and dropping vertices (the minor
cycle, the counterpart of away steps) while that point leaves the simplex. It ends in finitely many steps; at
N = 100 it takes about as many major iterations as the optimum has vertices. It stops on the Frank-Wolfe
duality gap, which bounds the suboptimality: f(lambda) - f* <= gap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class MinNormResult:
    weights: torch.Tensor  # lambda on the simplex, (N,)
    value: float  # || sum_i lambda_i v_i ||^2
    iterations: int
    gap: float  # Frank-Wolfe duality gap at the returned point


def best_pair(gram: np.ndarray) -> np.ndarray:
    """The best point on any edge [e_i, e_j] of the simplex (the reference code's start)."""
    n = len(gram)
    lam = np.zeros(n)
    if n == 1:
        lam[0] = 1.0
        return lam
    diag = np.diag(gram)
    mii, mjj, mij = diag[:, None], diag[None, :], gram
    curvature = mii + mjj - 2 * mij
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(curvature > 0, (mjj - mij) / curvature, 1.0)
    c = np.clip(c, 0.0, 1.0)
    cost = c * c * mii + 2 * c * (1 - c) * mij + (1 - c) ** 2 * mjj
    cost[np.tril_indices(n)] = np.inf
    i, j = np.unravel_index(np.argmin(cost), cost.shape)
    lam[i], lam[j] = c[i, j], 1.0 - c[i, j]
    return lam


def min_norm_weights(gram: torch.Tensor, max_iter: int = 1000, tol: float = 1e-6) -> MinNormResult:
    """Wolfe's minimum-norm point from the best pair of vertices; stops when the Frank-Wolfe gap
    2 (lambda^T M lambda - min_i (M lambda)_i) <= tol * max_i ||v_i||^2, or after ``max_iter`` major iterations."""
    m = gram.detach().to("cpu", torch.float64).numpy()
    m = (m + m.T) / 2
    scale = max(float(np.diag(m).max()), np.finfo(float).tiny)
    m = _nearest_psd(m)
    lam = best_pair(m)
    corral = [int(i) for i in np.flatnonzero(lam > 0)]
    u = m @ lam  # M lambda; the gradient is 2u
    it = 0
    for it in range(1, max_iter + 1):
        value = float(lam @ u)
        s = int(np.argmin(u))
        if 2 * (value - u[s]) <= tol * scale:
            break
        trial, kept = _minor_cycle(m, lam, corral + ([] if s in corral else [s]))
        if float(trial @ m @ trial) < value:
            lam, corral = trial, kept
        else:
            # rounding left the affine step no better: an exact line search toward s always is
            slope, curv = u[s] - value, m[s, s] - 2 * u[s] + value
            g = 1.0 if curv <= 0 else min(max(-slope / curv, 0.0), 1.0)
            if g == 0.0:
                break  # no progress possible in floating point
            lam = (1 - g) * lam
            lam[s] += g
            corral = [int(i) for i in np.flatnonzero(lam > 0)]
        u = m @ lam
    value = float(lam @ u)
    gap = float(2 * (value - u.min()))
    return MinNormResult(torch.from_numpy(lam).to(gram.device, gram.dtype), max(value, 0.0), it, gap)


def _nearest_psd(m: np.ndarray) -> np.ndarray:
    """A Gram matrix computed in float32 (FedAWARE's momenta) has eigenvalues a rounding error below 0; the
    affine steps assume a convex objective, so those are set to 0 (a change at the Gram matrix's own rounding)."""
    w, q = np.linalg.eigh(m)
    if w.min() >= 0:
        return m
    m = (q * np.clip(w, 0.0, None)) @ q.T
    return (m + m.T) / 2


def _affine_minimum(m: np.ndarray, corral: list[int]) -> np.ndarray:
    """The weights (summing to 1, of any sign) of the minimum-norm point of the corral's affine hull:
    the KKT system [M_SS 1; 1^T 0] [alpha; mu] = [0; 1]."""
    k = len(corral)
    kkt = np.ones((k + 1, k + 1))
    kkt[:k, :k] = m[np.ix_(corral, corral)]
    kkt[k, k] = 0.0
    rhs = np.zeros(k + 1)
    rhs[k] = 1.0
    try:
        alpha = np.linalg.solve(kkt, rhs)[:k]
    except np.linalg.LinAlgError:
        alpha = np.linalg.lstsq(kkt, rhs, rcond=None)[0][:k]
    return alpha / alpha.sum()


def _minor_cycle(m: np.ndarray, lam: np.ndarray, corral: list[int]) -> tuple[np.ndarray, list[int]]:
    """Move from lam (supported on the corral, the new vertex at weight 0) to the corral's affine minimum; while
    that has a weight <= 0, stop where the segment leaves the simplex and drop the vertex whose weight reached 0."""
    lam = lam.copy()
    corral = list(corral)
    while True:
        alpha = _affine_minimum(m, corral)
        if np.all(alpha > 0):
            lam[:] = 0.0
            lam[corral] = alpha
            return lam, corral
        here = lam[corral]
        out = alpha <= 0
        ratio = np.full(len(corral), np.inf)
        ratio[out] = np.where(here[out] > 0, here[out] / np.maximum(here[out] - alpha[out], np.finfo(float).tiny), 0.0)
        first = int(np.argmin(ratio))
        theta = ratio[first]
        moved = here + theta * (alpha - here)
        moved[first] = 0.0  # the blocking vertex leaves exactly
        moved = np.clip(moved, 0.0, None)
        lam[corral] = moved / moved.sum()
        corral = [i for i, w in zip(corral, moved) if w > 0]
