"""Per-round diagnostics of the client updates (FedAWARE section 5 and section 7; FedLAW coherence)."""

from __future__ import annotations

import torch


def e_lud(deltas: torch.Tensor) -> torch.Tensor:
    """Empirical local update diversity: sqrt(mean_i ||g_i||^2 / ||mean_i g_i||^2), uniform weights."""
    mean_sq = deltas.pow(2).sum(1).mean()
    return (mean_sq / deltas.mean(0).pow(2).sum()).sqrt()


def cosine_matrix(deltas: torch.Tensor) -> torch.Tensor:
    unit = deltas / deltas.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return unit @ unit.T


def coherence(deltas: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cosine over distinct pairs i != j; with weights, the lambda_i lambda_j weighted mean."""
    cos = cosine_matrix(deltas)
    k = len(deltas)
    if k < 2:
        return torch.tensor(float("nan"))
    w = torch.full((k,), 1.0 / k, device=deltas.device, dtype=deltas.dtype) if weights is None else weights
    pair = torch.outer(w, w)
    pair.fill_diagonal_(0)
    cos = cos.clone()
    cos.fill_diagonal_(0)
    return (pair * cos).sum() / pair.sum()
