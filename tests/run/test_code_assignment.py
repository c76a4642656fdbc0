"""cohort.assignment: code, FedAWARE's code crediting the j-th upload (ascending ids) to the j-th id of its
sampler's unsorted draw: checked on hand-built draws, against the uploads of the same round credited right."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedrepro import data, streams
from fedrepro.configure import schema, settings
from fedrepro.run import cohorts
from fedrepro.run.cohorts import code_pairing, exploration_draws, sample_cohort
from fedrepro.run.trainer import Trainer

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats


# FedAWARE's code, seed 1998, FMNIST (100 clients, 10 a round): `sampler.last_sampled` of rounds 0-10 as its
# run printed them (the parity helper's read-only log, /work/parity/logs/fedaware_fedaware_seed1998.log).
# Round 0 is the head of the shuffled list; rounds 1-8 come from a Python set in ascending order, round 9's
# set order wraps around its table size; round 10 is numpy's uniform draw (not reproducible: another stream).
CODE_ROUND_0 = [71, 93, 4, 68, 67, 5, 44, 78, 57, 39]
CODE_EXPLORATION = [
    CODE_ROUND_0,
    [0, 1, 2, 3, 6, 7, 8, 9, 10, 11],
    [12, 13, 14, 15, 16, 17, 18, 19, 20, 21],
    [22, 23, 24, 25, 26, 27, 28, 29, 30, 31],
    [32, 33, 34, 35, 36, 37, 38, 40, 41, 42],
    [43, 45, 46, 47, 48, 49, 50, 51, 52, 53],
    [54, 55, 56, 58, 59, 60, 61, 62, 63, 64],
    [65, 66, 69, 70, 72, 73, 74, 75, 76, 77],
    [79, 80, 81, 82, 83, 84, 85, 86, 87, 88],
    [96, 97, 98, 99, 89, 90, 91, 92, 94, 95],
]


def test_the_exploration_draws_what_the_codes_sampler_drew(monkeypatch):
    """Given the code's shuffled list (its head is all the later rounds depend on), our exploration draws the
    code's clients in the code's order, round by round, the wrapped tenth round included."""
    shuffled = CODE_ROUND_0 + [i for i in reversed(range(100)) if i not in CODE_ROUND_0]  # any order: a set
    real = streams.rng

    class Shuffled:
        def permutation(self, n):
            return np.asarray(shuffled)

    monkeypatch.setattr(streams, "rng", lambda name, *keys: Shuffled() if name == "warmup" else real(name, *keys))
    exploration_draws.cache_clear()
    try:
        for t, drawn in enumerate(CODE_EXPLORATION):
            assert code_pairing(1998, t, 100, 10, "permutation").tolist() == drawn, t
            assert sample_cohort(1998, t, 100, 10, "permutation").tolist() == sorted(drawn)
    finally:
        exploration_draws.cache_clear()


def _uniform_draw(seed, t, n, k):
    """The documented uniform recipe, with numpy alone: numpy's ``choice`` order from SeedSequence([seed, t])."""
    return np.random.default_rng(np.random.SeedSequence([seed, t])).choice(n, size=k, replace=False)


@pytest.mark.parametrize("n,k", [(6, 2), (100, 10), (10, 4)])
def test_the_pairing_is_the_draw_and_the_cohort_its_sorted_ids(n, k):
    explore = math.ceil(n / k)
    # round 0 of the warm-up: the head of the seeded permutation, in its order (not sorted)
    head = np.random.default_rng(np.random.SeedSequence([11, 0xC0407])).permutation(n)[:k]
    assert code_pairing(11, 0, n, k, "permutation").tolist() == head.tolist()
    for t in range(explore + 6):
        pairing = code_pairing(11, t, n, k, "permutation")
        assert sample_cohort(11, t, n, k, "permutation").tolist() == sorted(pairing.tolist())
        if t >= explore:  # after the warm-up: the uniform draw, in numpy's draw order
            assert pairing.tolist() == _uniform_draw(11, t, n, k).tolist()
    # without the warm-up every round is a uniform draw, round 0 included
    assert all(code_pairing(11, t, n, k).tolist() == _uniform_draw(11, t, n, k).tolist() for t in range(5))
    # round 0 and the uniform rounds come unsorted (else the setting would change nothing)
    unsorted = [
        t
        for t in [0, *range(explore, explore + 6)]
        if not np.array_equal(code_pairing(11, t, n, k, "permutation"), sample_cohort(11, t, n, k, "permutation"))
    ]
    assert len(unsorted) >= 2


def _trainer(tmp_path, algorithm: str, assignment: str, name: str) -> Trainer:
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(210) % 10
    images = (torch.randint(0, 60, (210, 1, 28, 28), generator=gen) + 19 * labels.view(-1, 1, 1, 1)).to(torch.uint8)
    train = data.TensorDataset(images, labels, 0.0, 1.0)
    sizes = [10, 20, 30, 40, 50, 60]  # unequal, so a permuted weight shows
    parts = [np.arange(sum(sizes[:i]), sum(sizes[: i + 1])) for i in range(6)]
    setting = settings.resolve(
        {
            "algorithm": algorithm,
            "model": "mlp",
            "num_clients": 6,
            "participation": 1 / 3,
            "local_epochs": 1,
            "batch_size": 10,
            "device": "cpu",
            "rounds": 4,
            "seed": 1998,
            "client": {"lr": 0.05},
            "fedaware": {"alpha": 1.0},
            "aware": {"alpha": 1.0},
            "cohort": {"warmup": "permutation", "assignment": assignment},
        }
    )
    return Trainer(setting, tmp_path / name, None, None, datasets=(train, train), parts=parts)


# hand-built draws of a 6-client, 2-a-round run: round 0 drawn as [4, 1], rounds 1 and 2 exploring in
# ascending order, round 3 uniform, drawn as [5, 2]
DRAWS = {0: [4, 1], 1: [0, 3], 2: [2, 5], 3: [5, 2]}
# upload j (clients in ascending order) -> the client whose momentum and data-size weight it gets, by hand
CREDITED = {0: {1: 4, 4: 1}, 1: {0: 0, 3: 3}, 2: {2: 2, 5: 5}, 3: {2: 5, 5: 2}}


@pytest.fixture
def hand_draws(monkeypatch):
    monkeypatch.setattr(cohorts, "cohort_draw", lambda seed, t, n, k, warmup="none": np.array(DRAWS[t]))


@pytest.mark.parametrize(
    "algorithm,momenta", [("fedaware", lambda a: a.aggregator.momenta), ("fedavg+aware", lambda a: a.optimizer.momenta)]
)
def test_each_upload_lands_in_the_momentum_the_code_writes_it_to(tmp_path, hand_draws, algorithm, momenta):
    right = _trainer(tmp_path, algorithm, "per_client", "right")
    code = _trainer(tmp_path, algorithm, "code", "code")
    for t in range(4):
        code.model.flat.copy_(right.model.flat)  # the same start, so the same uploads
        x = right.model.flat.clone()
        cohort = sample_cohort(0, t, 6, 2, "permutation")
        assert list(cohort) == sorted(DRAWS[t])
        uploads = right.train_cohort(right.plan(t, cohort, x, 0.05)).deltas.clone()
        right.round(t)
        code.round(t)
        got = momenta(code.algorithm).momenta
        for j, sender in enumerate(cohort):  # alpha 1: a momentum is the last upload written to it
            torch.testing.assert_close(got[CREDITED[t][int(sender)]], uploads[j])
        assert bool(momenta(code.algorithm).seen[list(CREDITED[t].values())].all())


@pytest.mark.parametrize("assignment", ["per_client", "code"])
def test_fedavg_weighs_each_upload_with_the_credited_clients_data_size(tmp_path, hand_draws, assignment):
    trainer = _trainer(tmp_path, "fedavg", assignment, assignment)
    sizes = {i: 10 * (i + 1) for i in range(6)}
    for t in (0, 1, 3):
        x = trainer.model.flat.clone()
        cohort = sample_cohort(0, t, 6, 2, "permutation")
        uploads = trainer.train_cohort(trainer.plan(t, cohort, x, 0.05)).deltas.clone()
        trainer.model.flat.copy_(x)
        trainer.round(t)
        credit = [CREDITED[t][int(c)] if assignment == "code" else int(c) for c in cohort]
        w = torch.tensor([sizes[c] for c in credit], dtype=torch.float32)
        torch.testing.assert_close(trainer.model.flat, x - (w / w.sum()) @ uploads)


def test_a_bad_assignment_is_refused_naming_the_key():
    with pytest.raises(schema.ConfigError, match="cohort.assignment"):
        settings.resolve({"cohort": {"assignment": "sorted"}})
