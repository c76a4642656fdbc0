"""The diagnostics every round logs, against hand-computed oracles: e-LUD (FedAWARE's empirical local
update diversity) and coherence (FedLAW's mean pairwise cosine of the client updates), on vectors small
enough to work out on paper, and the engine logging them for the round's actual client updates."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedrepro import metrics
from fedrepro.configure import settings
from fedrepro.data import TensorDataset
from fedrepro.run.trainer import Trainer

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

# (client updates, e-LUD = sqrt(mean_i |g_i|^2 / |mean_i g_i|^2), coherence = mean over pairs i != j of cos)
CASES = [
    # orthogonal unit vectors: mean [1/2, 1/2], |mean|^2 = 1/2, mean |g|^2 = 1; cos = 0
    ([[1.0, 0.0], [0.0, 1.0]], math.sqrt(2.0), 0.0),
    # identical updates: no diversity, full agreement
    ([[3.0, 4.0], [3.0, 4.0]], 1.0, 1.0),
    # |g|^2 = 1, 4, 1 (mean 2); mean [0, 2/3], |mean|^2 = 4/9: sqrt(9/2); cosines 0, -1, 0 over 3 pairs
    ([[1.0, 0.0], [0.0, 2.0], [-1.0, 0.0]], math.sqrt(4.5), -1.0 / 3.0),
    # the scale of one update changes e-LUD but not a cosine: |g|^2 = 4, 1 (mean 5/2); mean [1, 1/2]
    ([[2.0, 0.0], [0.0, 1.0]], math.sqrt(2.5 / 1.25), 0.0),
]


@pytest.mark.parametrize("deltas,elud,coherence", CASES)
def test_e_lud_and_coherence_equal_the_hand_computed_values(deltas, elud, coherence):
    for dtype in (torch.float64, torch.float32):
        d = torch.tensor(deltas, dtype=dtype)
        # about 16 roundings (squares, sums of 2 or 3 terms, a ratio, a root) of terms no larger than the
        # result's own scale (small integers, unit cosines): 16 unit roundoffs of the dtype
        tol = 16 * (2.0**-53 if dtype == torch.float64 else 2.0**-24)
        assert float(metrics.e_lud(d)) == pytest.approx(elud, rel=tol)
        assert float(metrics.coherence(d)) == pytest.approx(coherence, abs=tol)


def test_opposite_updates_have_unbounded_e_lud_and_coherence_minus_one():
    d = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)
    assert math.isinf(float(metrics.e_lud(d)))
    assert float(metrics.coherence(d)) == -1.0


def test_weighted_coherence_weighs_each_pair_by_lambda_i_lambda_j():
    d = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-1.0, 0.0]], dtype=torch.float64)
    w = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    # pairs (0,1): 1/8 x 0, (0,2): 1/8 x -1, (1,2): 1/16 x 0, over 1/8 + 1/8 + 1/16 = 5/16
    assert float(metrics.coherence(d, w)) == pytest.approx(-0.125 / 0.3125, abs=1e-12)
    assert math.isnan(float(metrics.coherence(d[:1])))


def test_the_engine_logs_them_for_the_rounds_client_updates(tmp_path):
    """The round's row carries e-LUD and coherence of the deltas the server received, computed here in
    float64 by the formulas written out (the engine's float32 agrees to float32 rounding)."""
    gen = torch.Generator().manual_seed(0)
    n = 120
    labels = torch.arange(n) % 10
    images = (torch.randint(0, 60, (n, 1, 28, 28), generator=gen) + 19 * labels[:, None, None, None]).to(torch.uint8)
    train = TensorDataset(images, labels, 0.2860, 0.3530)
    setting = settings.resolve(
        {
            "dataset": "fmnist",
            "model": "mlp",
            "num_clients": 3,
            "participation": 1.0,
            "rounds": 1,
            "batch_size": 20,
            "device": "cpu",
            "client": {"lr": 0.05},
        }
    )
    parts = [np.arange(i, n, 3) for i in range(3)]
    trainer = Trainer(setting, tmp_path, None, None, datasets=(train, train), parts=parts)
    seen = []
    step = trainer.algorithm.server_step
    trainer.algorithm.server_step = lambda x, updates: (seen.append(updates.deltas.double().clone()), step(x, updates))[
        1
    ]
    row = trainer.round(0)
    (g,) = seen
    g = g.numpy()
    elud = math.sqrt(np.mean((g**2).sum(1)) / (g.mean(0) ** 2).sum())
    unit = g / np.linalg.norm(g, axis=1, keepdims=True)
    cos = unit @ unit.T
    coherence = (cos.sum() - np.trace(cos)) / (3 * 2)
    # float32 worst case over P parameters: a sum of P non-negative squares is within P u relative, so each
    # squared norm is, and |mean g|^2 moves by twice |mean g| times the mean's rounding (3 u of mean |g|);
    # a cosine of unit vectors is a dot product within P u plus the two norms' 2 (P / 2 + 2) u
    p, u = g.shape[1], 2.0**-24
    mean_abs = np.linalg.norm(np.abs(g).mean(0)) / np.linalg.norm(g.mean(0))
    assert row["e_lud"] == pytest.approx(elud, rel=p * u + 3 * u * mean_abs + u)
    assert row["coherence"] == pytest.approx(coherence, abs=(2 * p + 8) * u)
    assert 1.0 < elud and -1.0 < coherence < 1.0, "a real round: diverse, neither identical nor opposite"
