"""SCAFFOLD, FedDyn and FedProx clients against their local objectives written here with autograd and a plain
``torch.optim.SGD`` (momentum and weight decay on), over a full local round of several steps.

Each method's client minimises, from the global model w_g, with its state read off the run before the round:
    FedProx    F_i(w) + mu/2 ||w - w_g||^2
    SCAFFOLD   F_i(w) + <c - c_i, w>                       (option II's corrected gradient g - c_i + c)
    FedDyn     F_i(w) - <l_i, w> + alpha/2 ||w - w_g||^2
and after the round SCAFFOLD's c_i becomes c_i - c + (w_g - w_i) / (tau lr), FedDyn's l_i becomes
l_i + alpha (w_g - w_i). The plain loop puts the extra terms into the loss (autograd differentiates them) and lets
``torch.optim.SGD`` apply weight decay and momentum, so a correction added with the wrong sign, scale, order
(after momentum) or to the wrong client shows as another model.

The engine and the plain loop both run in float64 (the ``float64_engine`` fixture), so they differ by rounding in
the order of additions only: ``rounding_gap`` derives the tolerance from u64 and the operation count, about 1e-12
of the update's size here, while each method's extra terms move the update by more than 1e-2 of its size (checked
in each test). In float32 a rounding difference can flip a ReLU whose input lies within it of zero, which moves a
weight by a sample's gradient and has no bound from rounding alone (tests/run/test_batchnorm.py met one on AVX-512).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from fedrepro import data, models
from fedrepro.configure import settings
from fedrepro.run.cohorts import sample_cohort
from fedrepro.run.trainer import Trainer

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

# weight decay large enough that applying it outside the momentum buffer (decoupled) shows
LR, MOMENTUM, WEIGHT_DECAY, BATCH, EPOCHS = 0.05, 0.9, 0.05, 10, 2
SIZES = [20, 30, 40]  # unequal clients: 4, 6 and 8 local steps
U64 = 2.0**-53  # float64's unit roundoff
PIXELS = 28 * 28  # the MLP's widest reduction: its first layer's inputs


def rounding_gap(steps: int, grad: float) -> float:
    """How far float64 rounding alone can put the engine's update from the plain loop's: a gradient entry is a
    sum over at most BATCH samples of terms that each went through a PIXELS-long sum, so two orders of its
    additions differ by at most BATCH * PIXELS * u64 of the largest gradient entry (the worst case, linear in the
    count, which leaves room for cancellation); a step moves the parameters by lr / (1 - mu) times that (momentum
    carries a gap into later steps with weights mu^k), ``steps`` steps add up, and twice that covers what later
    gradients feed back over a few small steps (lr L < 1)."""
    return 2 * steps * LR / (1 - MOMENTUM) * BATCH * PIXELS * U64 * grad


def _trainer(tmp_path, algorithm: str, section: dict, dataset=data.TensorDataset) -> Trainer:
    gen = torch.Generator().manual_seed(0)
    n = sum(SIZES)
    labels = torch.arange(n) % 10
    images = (torch.randint(0, 60, (n, 1, 28, 28), generator=gen) + 19 * labels.view(-1, 1, 1, 1)).to(torch.uint8)
    train = dataset(images, labels, 0.0, 1.0)
    parts = [np.arange(sum(SIZES[:i]), sum(SIZES[: i + 1])) for i in range(len(SIZES))]
    setting = settings.resolve(
        {
            "algorithm": algorithm,
            "model": "mlp",
            "dataset": "fmnist",
            "num_clients": len(SIZES),
            "participation": 1.0,
            "local_epochs": EPOCHS,
            "batch_size": BATCH,
            "device": "cpu",
            "rounds": 3,
            "seed": 5,
            **({algorithm: section} if section else {}),
            "client": {"lr": LR, "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY, "shuffle": "none"},
        }
    )  # batches in the partition's order, every epoch
    return Trainer(setting, tmp_path / algorithm, None, None, datasets=(train, train), parts=parts)


def plain_local_round(trainer, client: int, w_global: torch.Tensor, extra_loss) -> tuple[torch.Tensor, int, float]:
    """One client's local round: a fresh module of the run's architecture at w_global, torch.optim.SGD, the
    client's batches in its stored order, loss = cross-entropy + extra_loss(parameters as one vector). Returns
    the final parameters, the step count and the largest gradient entry met (for ``rounding_gap``)."""
    module = models.build("mlp", "fmnist")
    vector_to_parameters(w_global.clone(), module.parameters())
    module.train()
    opt = torch.optim.SGD(module.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    index = trainer.inputs.client_index[client]
    steps, grad = 0, 0.0
    for _ in range(EPOCHS):
        for start in range(0, len(index), BATCH):
            images, labels = trainer.inputs.train.batch(index[start : start + BATCH])
            opt.zero_grad()
            loss = F.cross_entropy(module(images), labels) + extra_loss(parameters_to_vector(module.parameters()))
            loss.backward()
            grad = max(grad, max(float(p.grad.abs().max()) for p in module.parameters()))
            opt.step()
            steps += 1
    return parameters_to_vector(module.parameters()).detach(), steps, grad


def _close(got: torch.Tensor, want: torch.Tensor, bound: float, what: str) -> None:
    assert got.dtype == want.dtype == torch.float64, "the engine and the plain loop run in float64"
    assert bound < 1e-6 * float(want.abs().max()), "the bound would hide a wrong term"
    torch.testing.assert_close(got, want, rtol=0, atol=bound, msg=lambda m: f"{what}: {m}")


def _round_one(trainer):
    """Round 0 through the engine (so the methods' state is not zero), then round 1's global model and cohort."""
    trainer.round(0)
    cohort = sample_cohort(trainer.setting["seed"], 1, len(SIZES), len(SIZES))
    return trainer.model.flat.clone(), cohort


def _compare(trainer, cohort, w_global, extra_losses) -> dict[int, tuple[torch.Tensor, int, float]]:
    updates = trainer.train_cohort(trainer.plan(1, cohort, w_global, LR))
    finals = {}
    for j, c in enumerate(cohort):
        final, steps, grad = plain_local_round(trainer, int(c), w_global, extra_losses[int(c)])
        assert steps == int(updates.steps[j]) == EPOCHS * SIZES[int(c)] // BATCH
        gap = rounding_gap(steps, grad)
        _close(updates.deltas[j], w_global - final, gap, f"client {c}'s update")
        plain, _, _ = plain_local_round(trainer, int(c), w_global, lambda w: 0.0 * w.sum())
        assert (plain - final).abs().max() > 1e-2 * (w_global - final).abs().max(), "the extra terms matter here"
        finals[int(c)] = (final, steps, gap)
    return finals


def test_fedprox_is_sgd_on_the_proximal_objective(tmp_path, float64_engine):
    mu = 0.5
    trainer = _trainer(tmp_path, "fedprox", {"mu": mu}, float64_engine)
    w_global, cohort = _round_one(trainer)
    prox = lambda w: mu / 2 * (w - w_global).pow(2).sum()  # noqa: E731
    _compare(trainer, cohort, w_global, {int(c): prox for c in cohort})


def test_scaffold_is_sgd_on_the_control_variate_objective(tmp_path, float64_engine):
    trainer = _trainer(tmp_path, "scaffold", {}, float64_engine)
    w_global, cohort = _round_one(trainer)
    part = trainer.algorithm.corrections[0]
    c, c_clients = part.c.clone(), part.c_clients.clone()
    assert float(c.norm()) > 0 and bool((c_clients.norm(dim=1) > 0).all()), "round 0 set the control variates"
    terms = {int(i): (lambda w, i=int(i): torch.dot(c - c_clients[i], w)) for i in cohort}
    finals = _compare(trainer, cohort, w_global, terms)
    for i, (final, steps, gap) in finals.items():  # option II's new c_i from the plain round
        # the update's gap divided by steps * lr, and 4 roundings of the three terms' sum
        terms = float((c_clients[i].abs() + c.abs() + (w_global - final).abs() / (steps * LR)).max())
        _close(
            part.c_clients[i],
            c_clients[i] - c + (w_global - final) / (steps * LR),
            gap / (steps * LR) + 4 * U64 * terms,
            f"c_{i}",
        )
    assert torch.equal(part.c, c), "c moves only when the round ends"


@pytest.mark.parametrize("alpha", [0.1])
def test_feddyn_is_sgd_on_the_dynamic_regulariser(tmp_path, alpha, float64_engine):
    trainer = _trainer(tmp_path, "feddyn", {"alpha": alpha}, float64_engine)
    w_global, cohort = _round_one(trainer)
    part = trainer.algorithm.corrections[0]
    state = part.grad_state.clone()
    assert bool((state.norm(dim=1) > 0).all()), "round 0 set every l_i"
    terms = {
        int(i): (lambda w, i=int(i): -torch.dot(state[i], w) + alpha / 2 * (w - w_global).pow(2).sum()) for i in cohort
    }
    finals = _compare(trainer, cohort, w_global, terms)
    for i, (final, _, gap) in finals.items():
        # alpha times the update's gap, and 3 roundings of the two terms' sum
        terms = float((state[i].abs() + alpha * (w_global - final).abs()).max())
        _close(part.grad_state[i], state[i] + alpha * (w_global - final), alpha * gap + 3 * U64 * terms, f"l_{i}")
