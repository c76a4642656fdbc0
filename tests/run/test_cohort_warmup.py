"""cohort.warmup: permutation, FedAWARE's exploration sampler as a cohort schedule of the comparison."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedrepro import data
from fedrepro.configure import schema, settings
from fedrepro.run.cohorts import sample_cohort
from fedrepro.run.trainer import Trainer

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats


@pytest.mark.parametrize("n,k", [(100, 10), (10, 4), (7, 7), (5, 1)])
def test_the_first_rounds_visit_every_client_once(n, k):
    rounds = math.ceil(n / k)
    cohorts = [sample_cohort(3, t, n, k, "permutation") for t in range(rounds)]
    assert all(len(c) == k and len(set(c)) == k for c in cohorts)
    assert set(np.concatenate(cohorts)) == set(range(n))
    if n % k == 0:  # exactly once each
        assert len(np.concatenate(cohorts)) == n


def test_after_the_warmup_the_cohorts_are_the_uniform_ones():
    """From round ceil(N/k) on, the cohort is the uniform recipe's draw (numpy's ``choice`` from
    SeedSequence([seed, t])), written here with numpy alone, and the same as without the warm-up."""
    for t in range(10, 30):
        uniform = np.random.default_rng(np.random.SeedSequence([3, t])).choice(100, size=10, replace=False)
        assert sample_cohort(3, t, 100, 10, "permutation").tolist() == sorted(uniform.tolist())
        assert sample_cohort(3, t, 100, 10).tolist() == sorted(uniform.tolist())


def test_the_warmup_depends_on_seed_and_round_only():
    a = [sample_cohort(5, t, 100, 10, "permutation") for t in range(10)]
    b = [sample_cohort(5, t, 100, 10, "permutation") for t in reversed(range(10))][::-1]  # any order: no state
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    other = [sample_cohort(6, t, 100, 10, "permutation") for t in range(10)]
    assert not all(np.array_equal(x, y) for x, y in zip(a, other))


def test_uniform_cohorts_take_longer_to_cover_100_clients():
    """Why the switch matters: with uniform cohorts of 10 out of 100, 10 rounds do not cover everyone."""
    seen = set(np.concatenate([sample_cohort(1998, t, 100, 10) for t in range(10)]))
    assert len(seen) < 100


def test_a_bad_warmup_is_refused_naming_the_key():
    with pytest.raises(schema.ConfigError, match="cohort.warmup"):
        settings.resolve({"cohort": {"warmup": "explore"}})


def _fedaware_trainer(tmp_path, warmup: str, client: dict | None = None) -> Trainer:
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(200) % 10
    images = (torch.randint(0, 60, (200, 1, 28, 28), generator=gen) + 19 * labels.view(-1, 1, 1, 1)).to(torch.uint8)
    train = data.TensorDataset(images, labels, 0.0, 1.0)
    parts = [np.arange(i * 20, (i + 1) * 20) for i in range(10)]
    setting = settings.resolve(
        {
            "algorithm": "fedaware",
            "model": "mlp",
            "num_clients": 10,
            "participation": 0.2,
            "local_epochs": 1,
            "batch_size": 20,
            "device": "cpu",
            "rounds": 8,
            "seed": 1998,
            "client": {"lr": 0.05, **(client or {})},
            "cohort": {"warmup": warmup},
        }
    )
    return Trainer(setting, tmp_path / warmup, None, None, datasets=(train, train), parts=parts)


def test_fedaware_leaves_its_fedavg_warmup_after_ceil_n_over_k_rounds(tmp_path):
    trainer = _fedaware_trainer(tmp_path, "permutation")
    rows = [trainer.round(t) for t in range(6)]
    assert [r["aware_warmup"] for r in rows] == [1, 1, 1, 1, 0, 0]  # 10 clients, 2 a round: round 5 (t = 4)
    uniform = _fedaware_trainer(tmp_path, "none")
    assert sum(uniform.round(t)["aware_warmup"] for t in range(6)) > 4


def _orders(trainer, pairs):
    return [torch.randperm(50, generator=trainer.shuffle_generator(t, c)) for t, c in pairs]


def test_reseeded_shuffling_repeats_the_batch_order_of_every_client_and_round(tmp_path):
    """client.shuffle: reseeded gives one order for every (round, client); fresh a new one each."""
    pairs = [(0, 0), (0, 3), (5, 3), (7, 9)]
    reseeded = _fedaware_trainer(tmp_path, "none", {"shuffle": "reseeded"})
    first, *rest = _orders(reseeded, pairs)
    assert all(torch.equal(first, o) for o in rest)
    fresh = _fedaware_trainer(tmp_path, "none")
    orders = _orders(fresh, pairs)
    assert len({tuple(o.tolist()) for o in orders}) == len(pairs)


@pytest.mark.parametrize("shuffle,same", [("reseeded", True), ("fresh", False)])
def test_a_reseeded_client_repeats_its_local_training_from_the_same_model(tmp_path, shuffle, same):
    trainer = _fedaware_trainer(tmp_path, "none", {"shuffle": shuffle})
    trainer.setting["batch_size"] = 8  # several batches, so the order matters
    x = trainer.model.flat.clone()
    a = trainer.train_cohort(trainer.plan(0, np.array([2]), x, 0.05)).deltas
    b = trainer.train_cohort(trainer.plan(3, np.array([2]), x, 0.05)).deltas
    assert torch.equal(a, b) == same


def test_unshuffled_clients_take_their_batches_in_the_partitions_order(tmp_path):
    """client.shuffle: none (FedAWARE's code on FMNIST): every epoch the stored order, so the same update
    from the same model in any round, equal to SGD over the batches taken in order by hand."""
    trainer = _fedaware_trainer(tmp_path, "none", {"shuffle": "none"})
    trainer.setting["batch_size"] = 8
    assert trainer.shuffle_generator(3, 2) is None
    x = trainer.model.flat.clone()
    a = trainer.train_cohort(trainer.plan(0, np.array([2]), x, 0.05)).deltas
    b = trainer.train_cohort(trainer.plan(5, np.array([2]), x, 0.05)).deltas
    assert torch.equal(a, b)
    index = trainer.inputs.client_index[2]
    trainer.model.flat.copy_(x)
    for start in range(0, len(index), 8):  # one epoch of plain SGD, batches in order
        images, labels = trainer.inputs.train.batch(index[start : start + 8])
        trainer.model.loss_and_grad(torch.nn.functional.cross_entropy, images, labels)
        trainer.model.flat.sub_(0.05 * trainer.model.grad)
    torch.testing.assert_close(x - trainer.model.flat, a[0])
