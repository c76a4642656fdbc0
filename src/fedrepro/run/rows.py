"""A round's row of metrics.csv: what the cohort's updates and the server step measured, and the scores."""

from __future__ import annotations

import math

import numpy as np
import torch

from fedrepro import metrics
from fedrepro.evaluation import global_train_loss, score
from fedrepro.parts import RoundUpdates

LAST_ROUNDS = 10  # the papers report the mean test accuracy of the last 10 rounds

# Quantities a round always computes; NaN in any of them (or inf anywhere) means the run blew up.
# test_loss is NaN by design on rounds without evaluation, so it counts where test_acc is set.
ALWAYS_FINITE = ("train_loss", "step_norm", "global_norm", "update_norm_mean", "update_norm_max")


def update_row(
    t: int, cohort: np.ndarray, lr: float, x: torch.Tensor, x_new: torch.Tensor, updates: RoundUpdates, inputs
) -> dict:
    """The updates' and the step's measures, per client group (of the sampled ``cohort``, in training order) and
    class share (of the clients credited), and what the method reported."""
    row = {
        "round": t + 1,
        "lr": lr,
        "train_loss": float(updates.losses.mean()),
        "e_lud": float(metrics.e_lud(updates.deltas)),
        "global_norm": float(updates.weighted_mean().norm()),
        "step_norm": float((x_new - x).norm()),
        "model_norm": float(x_new.norm()),  # ||w_g|| after the server step (FedLAW Fig. 10, left)
        "pseudo_grad_norm": updates.info.get("pseudo_grad_norm", float("nan")),
        "coherence": float(metrics.coherence(updates.deltas)),
        "update_norm_mean": float(updates.deltas.norm(dim=1).mean()),
        "update_norm_max": float(updates.deltas.norm(dim=1).max()),
        "update_norm_min": float(updates.deltas.norm(dim=1).min()),
    }
    for name, members in inputs.client_groups.items():
        inside = torch.as_tensor(np.isin(cohort, members), device=updates.deltas.device)
        row[f"coherence_{name}"] = float(metrics.coherence(updates.deltas[inside]))  # nan below 2 clients
    if inputs.class_counts is not None:
        weights = updates.info.get("weights", updates.weights)
        weights = weights if isinstance(weights, torch.Tensor) and weights.numel() == len(cohort) else updates.weights
        cohort_share = inputs.class_share[updates.clients].T @ weights.to(inputs.class_share.dtype)
        row.update({f"cohort_class_{c}": float(v) for c, v in enumerate(cohort_share)})
        row["cohort_class_tv"] = float(0.5 * (cohort_share - inputs.global_share).abs().sum())
    for key, value in updates.info.items():
        if key == "pseudo_grad_norm":
            continue
        if isinstance(value, dict):  # per client: one column per client id (FedLAW's lambda_client)
            row.update({f"{key}_{k}": float(v) for k, v in value.items()})
        elif isinstance(value, torch.Tensor) and value.numel() > 1:
            row[f"{key}_max"] = float(value.max())
            row[f"{key}_min"] = float(value.min())
        else:
            row[key] = float(value)
    return row


def score_row(t: int, setting: dict, module, inputs) -> dict:
    """Test accuracy and loss on the rounds that evaluate (every eval_every, and the last ones), and the global
    training loss on the rounds that compute it; NaN on the others."""
    row = {}
    if t % setting["eval_every"] == 0 or setting["rounds"] - t <= LAST_ROUNDS:
        row.update(score(module, inputs.test))  # multi-domain: per domain and their mean
    else:
        row["test_acc"] = row["test_loss"] = float("nan")
    every = setting["evaluation"]["global_train_loss_every"]
    if every and ((t + 1) % every == 0 or t == 0 or t + 1 == setting["rounds"]):
        # the objective every client's samples define (train_parts: a client's held-out samples count)
        row["global_train_loss"] = global_train_loss(module, inputs.train, inputs.train_parts)
    else:
        row["global_train_loss"] = float("nan")
    return row


def diverged(row: dict, x: torch.Tensor) -> bool:
    """Divergence on every quantity that can go non-finite, not the training loss alone: a server step
    can blow up the model (test loss NaN, step norm inf) after a finite local training loss."""
    if any(isinstance(v, float) and math.isinf(v) for v in row.values()):
        return True
    if any(not math.isfinite(row[k]) for k in ALWAYS_FINITE if k in row):
        return True
    if not math.isnan(row.get("test_acc", math.nan)) and not math.isfinite(row.get("test_loss", math.nan)):
        return True
    return not bool(torch.isfinite(x).all())
