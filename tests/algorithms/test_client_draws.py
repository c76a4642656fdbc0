"""+random_epochs and +random_batch as a setting builds them: the run's seed and the section's bounds reach the
per-client draws, and the draws are the (seed, round, client) streams' uniform integers."""

import torch

from fedrepro import algorithms, streams
from fedrepro.configure import settings

ROUNDS, CLIENTS = range(4), range(6)


def plan(setting: dict):
    resolved = settings.resolve({"num_clients": 6, **setting})
    return algorithms.build(resolved, 6, 2, torch.device("cpu"), torch.ones(6)).client_plan


def test_random_epochs_draw_from_the_runs_seed_within_the_sections_bounds():
    got = plan({"algorithm": "fedavg+random_epochs", "seed": 11, "random_epochs": {"low": 1, "high": 5}}).local_epochs
    want = {(t, i): int(streams.rng("epochs", 11, t, i).integers(1, 6)) for t in ROUNDS for i in CLIENTS}
    assert {(t, i): got(t, i) for t in ROUNDS for i in CLIENTS} == want
    assert {got(t, i) for t in range(30) for i in CLIENTS} == {1, 2, 3, 4, 5}  # both ends included
    other = plan({"algorithm": "fedavg+random_epochs", "seed": 12, "random_epochs": {"low": 1, "high": 5}})
    assert any(other.local_epochs(t, i) != want[t, i] for t in ROUNDS for i in CLIENTS)


def test_random_batch_draws_from_the_runs_seed_between_low_and_the_clients_size():
    got = plan({"algorithm": "fedavg+random_batch", "seed": 11, "random_batch": {"low": 3}}).batch_size
    want = {(t, i): int(streams.rng("batch_size", 11, t, i).integers(3, 40)) for t in ROUNDS for i in CLIENTS}
    assert {(t, i): got(t, i, 40) for t in ROUNDS for i in CLIENTS} == want
    assert got(0, 0, 3) == 3 and got(0, 0, 2) == 2  # n_i <= low: one batch of all of it
    assert min(got(t, i, 5) for t in range(30) for i in CLIENTS) == 3
    other = plan({"algorithm": "fedavg+random_batch", "seed": 12, "random_batch": {"low": 3}}).batch_size
    assert any(other(t, i, 40) != want[t, i] for t in ROUNDS for i in CLIENTS)
