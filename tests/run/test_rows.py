"""A round's row of metrics.csv records the weights the aggregator used: the cohort's class shares are those
weights over the clients' class distributions, and the weights' extremes are columns of their own."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedrepro.parts import RoundUpdates
from fedrepro.run.rows import update_row
from fedrepro.server import ServerSGD, UniformMean, WeightedMean

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

SIZES = [10.0, 30.0, 60.0]  # unequal, so data-size and uniform weights differ
SHARES = [[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]]  # each client's class distribution


def _round() -> tuple[RoundUpdates, SimpleNamespace]:
    updates = RoundUpdates(
        round=0,
        clients=torch.tensor([0, 1, 2]),
        deltas=torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]], dtype=torch.float64),
        sizes=torch.tensor(SIZES, dtype=torch.float64),
        steps=torch.tensor([1.0, 3.0, 6.0], dtype=torch.float64),
        losses=torch.tensor([0.5, 0.4, 0.3], dtype=torch.float64),
        lr=0.1,
    )
    share = torch.tensor(SHARES, dtype=torch.float64)
    inputs = SimpleNamespace(
        client_groups={}, class_counts=np.ones((3, 2)), class_share=share, global_share=share.mean(0)
    )
    return updates, inputs


@pytest.mark.parametrize(
    "aggregator, weights",
    [(WeightedMean(), [n / sum(SIZES) for n in SIZES]), (UniformMean(), [1 / 3] * 3)],
    ids=["data_size", "uniform"],
)
def test_the_row_records_the_weights_the_aggregator_used(aggregator, weights):
    updates, inputs = _round()
    x = torch.zeros(2, dtype=torch.float64)
    step = aggregator(x, updates)
    assert torch.allclose(step, torch.tensor(weights, dtype=torch.float64) @ updates.deltas)
    row = update_row(0, np.array([0, 1, 2]), 0.1, x, x - step, updates, inputs)
    for c in range(2):  # sum_i w_i * share_i,c, written out
        assert row[f"cohort_class_{c}"] == pytest.approx(sum(w * s[c] for w, s in zip(weights, SHARES)), abs=1e-12)
    assert row["weights_max"] == pytest.approx(max(weights), abs=1e-12)
    assert row["weights_min"] == pytest.approx(min(weights), abs=1e-12)


def test_server_sgd_steps_by_the_whole_direction_unless_told():
    updates, _ = _round()
    x, d = torch.tensor([1.0, 2.0]), torch.tensor([0.5, -1.0])
    assert torch.equal(ServerSGD()(x, d, updates), x - d)  # lr 1, no momentum: the API's default
