"""The batched path (run/batched.py) against the sequential client loop (run/client.py's LocalSGD).

Both start from the same Trainer state and draw the same batches, so every client's update, loss
and step count must agree up to the summation order of batched kernels.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import rounding_bound
from fedrepro import data, models
from fedrepro.configure.settings import resolve
from fedrepro.parts import GradientCorrection
from fedrepro.run import trainer as trainer_module
from fedrepro.run.client import client_generator
from fedrepro.run.cohorts import sample_cohort
from fedrepro.run.trainer import Trainer

BATCH = 16

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

# The tolerance between the batched and the sequential path is conftest.rounding_bound: float32's
# rounding of the gradient sums in two orders, from the batch size, the widest activation, the largest
# gradient, lr, momentum and the step count, computed in each test; a wrong batch, order or update rule
# moves parameters by ~lr * grad, orders of magnitude more (test_tolerance_catches_a_wrong_batch_order).
LR, MOMENTUM = 0.05, 0.5


def _trainer(
    tmp_path, model: str, sizes: list[int], momentum=MOMENTUM, weight_decay=1e-3, epochs=2, k=4, mode="off"
) -> Trainer:
    gen = torch.Generator().manual_seed(0)
    n = sum(sizes)
    images = torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, 10, (n,), generator=gen)
    train = data.TensorDataset(images, labels, 0.2860, 0.3530)  # normalisation on: the path must apply it too
    test = data.TensorDataset(images[:64], labels[:64], 0.2860, 0.3530)
    bounds = np.cumsum([0] + sizes)
    parts = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]
    setting = resolve(
        {
            "model": model,
            "num_clients": len(sizes),
            "participation": k / len(sizes),
            "local_epochs": epochs,
            "batch_size": BATCH,
            "device": "cpu",
            "rounds": 3,
            "eval_every": 1,
            "client": {"lr": LR, "momentum": momentum, "weight_decay": weight_decay},
        }
    )
    trainer = Trainer(
        setting, tmp_path / f"run-{mode}", None, None, datasets=(train, test), parts=parts, module=_module(model)
    )
    trainer.cohort_mode = mode
    return trainer


def _module(model: str) -> torch.nn.Module:
    torch.manual_seed(3)
    return models.build(model, "fmnist")


def _local(trainer: Trainer, t: int = 0):
    cohort = sample_cohort(trainer.setting["seed"], t, trainer.setting["num_clients"], trainer.k)
    x = trainer.model.flat.clone()
    return trainer.train_cohort(trainer.plan(t, cohort, x, trainer.client_lr(t)))


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_cohort_updates_equal_sequential_updates(tmp_path, model):
    sizes = [40] * 6  # 40 = 2 full batches of 16 and a partial one of 8
    plain_trainer = _trainer(tmp_path, model, sizes, mode="off")
    plain = _local(plain_trainer)
    fast_trainer = _trainer(tmp_path, model, sizes, mode="on")
    fast = _local(fast_trainer)
    assert fast_trainer.batched.rounds_trained, "the batched path was not taken"
    assert torch.equal(plain.clients, fast.clients)
    assert torch.equal(plain.steps, fast.steps)
    bound = rounding_bound(plain_trainer, int(plain.steps.max()), LR, MOMENTUM)
    assert plain.deltas.abs().max() > 1000 * bound  # the clients did move, far beyond rounding
    torch.testing.assert_close(fast.deltas, plain.deltas, atol=bound, rtol=0)
    # a loss is a mean of the batch's terms at parameters within ``bound``: its gap is of that order too
    torch.testing.assert_close(fast.losses, plain.losses, atol=bound, rtol=0)


def test_runs_through_both_paths_give_the_same_metrics(tmp_path):
    sizes = [32] * 5
    rows = {}
    finals = {}
    for mode in ("off", "on"):
        trainer = _trainer(tmp_path, "mlp", sizes, epochs=1, k=5, mode=mode)
        rows[mode] = [trainer.round(t) for t in range(3)]
        finals[mode] = trainer.model.flat.clone()
    # 3 rounds of 2 steps (32 samples, batches of 16): the steps' rounding gaps add up
    bound = rounding_bound(_trainer(tmp_path, "mlp", sizes, epochs=1, k=5), 3 * 2, LR, MOMENTUM)
    torch.testing.assert_close(finals["on"], finals["off"], atol=bound, rtol=0)
    gap = bound * finals["off"].numel() ** 0.5  # the norm of a vector whose entries each differ by <= bound
    for plain, fast in zip(rows["off"], rows["on"]):
        # losses are compared as in test_batched (10 * bound); a norm moves by at most the vectors' gap
        for key in ("train_loss", "test_loss"):
            assert fast[key] == pytest.approx(plain[key], abs=10 * bound), key
        for key in ("global_norm", "step_norm", "update_norm_mean"):
            assert fast[key] == pytest.approx(plain[key], abs=gap), key
        # e_lud is a ratio of norms, coherence a mean of cosines: each norm moves by gap, relative to the smallest
        smallest = min(plain["update_norm_min"], plain["global_norm"])
        assert smallest > 10 * gap  # the ratios are within 40% whatever rounding does
        assert fast["e_lud"] == pytest.approx(plain["e_lud"], rel=4 * gap / smallest)
        assert fast["coherence"] == pytest.approx(plain["coherence"], abs=4 * gap / smallest)
        assert fast["test_acc"] == plain["test_acc"]  # no test sample within rounding of a tie


def test_tolerance_catches_a_wrong_batch_order(tmp_path):
    """A fast path that gives each client another client's batch order must fail the comparison."""
    sizes = [40] * 4
    plain_trainer = _trainer(tmp_path, "mlp", sizes, mode="off")
    plain = _local(plain_trainer)
    bound = rounding_bound(plain_trainer, int(plain.steps.max()), LR, MOMENTUM)
    trainer = _trainer(tmp_path, "mlp", sizes, mode="on")
    original = trainer_module.client_generator
    try:
        trainer_module.client_generator = lambda seed, t, c: client_generator(seed, t, c + 1)
        wrong = _local(trainer)
    finally:
        trainer_module.client_generator = original
    assert (wrong.deltas - plain.deltas).abs().max() > 100 * bound


def test_unequal_sizes_train_together(tmp_path):
    """Unequal client sizes (unequal step counts and last batches) no longer force the sequential path
    (their equality with it: tests/run/test_batched.py)."""
    trainer = _trainer(tmp_path, "mlp", [40, 40, 41, 40], mode="on")
    cohort = sample_cohort(1, 0, 4, 4)
    assert trainer.train_together(cohort)
    _local(trainer)
    assert trainer.batched.rounds_trained


def test_client_corrections_without_a_batched_form_take_the_sequential_path(tmp_path):
    class Proximal(GradientCorrection):
        def __call__(self, grad, run):
            grad.add_(run.model.flat - run.x_global, alpha=0.1)

    trainer = _trainer(tmp_path, "mlp", [40] * 4, mode="on")
    trainer.algorithm.corrections.append(Proximal())
    assert not trainer.train_together(np.arange(4))


def test_unequal_epochs_train_together(tmp_path):
    trainer = _trainer(tmp_path, "mlp", [40] * 4, mode="on")
    assert trainer.train_together(np.arange(4))


def test_auto_mode_keeps_cpu_on_the_sequential_path(tmp_path):
    trainer = _trainer(tmp_path, "mlp", [40] * 4, mode="auto")
    assert not trainer.train_together(np.arange(4))


def test_cohort_groups_larger_than_max_together(tmp_path):
    """Splitting a cohort into groups (memory bound) changes nothing."""
    sizes = [24] * 5
    whole = _trainer(tmp_path, "mlp", sizes, k=5, mode="on")
    split = _trainer(tmp_path, "mlp", sizes, k=5, mode="on")
    _local(split)  # builds the BatchedSGD
    split.batched.sgd.max_together = 2
    split.model.flat.copy_(whole.model.flat)
    bound = rounding_bound(whole, 2 * 2, LR, MOMENTUM)  # 2 epochs of 2 batches (24 samples)
    torch.testing.assert_close(_local(split).deltas, _local(whole).deltas, atol=bound, rtol=0)


def test_module_is_untouched_by_the_cohort_path(tmp_path):
    trainer = _trainer(tmp_path, "cnn", [24] * 3, k=3, mode="on")
    before = copy.deepcopy(trainer.model.flat)
    _local(trainer)
    assert torch.equal(trainer.model.flat, before)
    trainer.model.check_bound()


def test_augmentation_it_cannot_draw_ahead_takes_the_sequential_path(tmp_path):
    trainer = _trainer(tmp_path, "mlp", [40] * 4, mode="on")
    trainer.inputs.train = type("Augmented", (), {"augment": True, "batched_cohort": True})()
    assert not trainer.train_together(np.arange(4))


def test_batch_gather_accepts_a_cohort_of_index_rows():
    images = torch.arange(6 * 4, dtype=torch.uint8).view(6, 1, 2, 2)
    split = data.TensorDataset(images, torch.arange(6), 0.5, 2.0)
    index = torch.tensor([[5, 0], [2, 2]])
    x, y = split.batch(index)
    assert x.shape == (2, 2, 1, 2, 2) and torch.equal(y, index)
    # the same two elementwise float32 operations on both sides: equal bit for bit
    torch.testing.assert_close(x, (images[index].float() / 255.0 - 0.5) / 2.0, rtol=0, atol=0)
