"""Oracles where every term of a method's server step matters.

Each expected value is written here from the paper's equations in plain float64 Python (lists and math,
never the class under test), at settings where no term cancels: unequal client sizes (the weighted mean),
every hyperparameter away from its default and from the others' values (a swapped beta1/beta2 or a dropped
tau moves the result), several rounds of every stateful optimiser (state that is read back matters), and
updates whose signs and sizes change from round to round (Yogi's sign, AMSGrad's max and floor act).
"""

from __future__ import annotations

import math

import pytest
import torch

from fedrepro.algorithms import fedadagrad, fedadam, fedams, fedavgm, fedyogi
from fedrepro.configure import settings
from fedrepro.parts import RoundUpdates

F64 = torch.float64
P = 3  # parameters
ROUNDS = 5
SIZES = [3.0, 11.0, 6.0]  # unequal client sizes: the weighted mean is not the plain mean
# per round and client the update Delta_i (rows), chosen so coordinates change sign and shrink below
# earlier ones (Yogi's sign flips, AMSGrad's v falls below v_hat, tiny entries meet AMSGrad's floor)
DELTAS = [
    [[0.9, -0.2, 0.001], [0.4, 0.3, 0.0], [1.5, -0.6, 0.002]],
    [[-0.3, 0.05, 0.0], [0.1, 0.02, 0.001], [-0.8, 0.01, 0.0]],
    [[0.02, -1.2, 0.0], [0.05, -0.7, 0.0], [0.01, -2.0, 0.003]],
    [[0.6, 0.4, 0.0], [-0.2, 0.1, 0.0], [0.3, 0.9, 0.0]],
    [[-0.05, 0.0, 0.002], [-0.1, 0.02, 0.0], [0.0, -0.01, 0.001]],
]


def _weighted_mean(rows: list[list[float]]) -> list[float]:
    total = sum(SIZES)
    return [sum(n * row[j] for n, row in zip(SIZES, rows)) / total for j in range(P)]


def _run(algo, rounds=ROUNDS, logged: list | None = None) -> list[list[float]]:
    """The method's server steps over the rounds from x = (0.2, -0.1, 0.05); the model after each (and in
    ``logged`` each round's logged info)."""
    x = torch.tensor([0.2, -0.1, 0.05], dtype=F64)
    out = []
    for t in range(rounds):
        deltas = torch.tensor(DELTAS[t], dtype=F64)
        updates = RoundUpdates(
            t,
            torch.arange(3),
            deltas,
            torch.tensor(SIZES, dtype=F64),
            torch.tensor([4.0, 9.0, 2.0], dtype=F64),
            torch.zeros(3),
            0.05,
        )
        x = algo.server_step(x, updates)
        out.append(x.tolist())
        if logged is not None:
            logged.append(updates.info)
    return out


def _oracle(second_moment, denominator, beta1: float, lr: float, v0: float) -> list[list[float]]:
    """m <- b1 m + (1 - b1) d, the method's v update and x <- x - eta_g m / denominator, coordinate by
    coordinate (Reddi et al. 2021, Algorithm 2; Wang et al. 2022, Algorithm 1: no bias correction)."""
    x, m, v, extra = [0.2, -0.1, 0.05], [0.0] * P, [v0] * P, [None] * P
    out = []
    for t in range(ROUNDS):
        d = _weighted_mean(DELTAS[t])
        for j in range(P):
            m[j] = beta1 * m[j] + (1 - beta1) * d[j]
            v[j], extra[j] = second_moment(v[j], d[j], extra[j])
            x[j] = x[j] - lr * m[j] / denominator(v[j], extra[j])
        out.append(list(x))
    return out


def _resolved(method: str, section: dict, lr: float) -> dict:
    return settings.resolve({"algorithm": method, method: section, "server": {"lr": lr}})


def _assert_rounds(got, want):
    """Both sides float64, the same few operations a coordinate and round in another order: each round adds
    a relative error of a few eps64 (2.2e-16) to quantities of order 1, so five rounds stay far below 1e-12
    (relative) or 1e-15 (absolute, near zero), while a changed term moves a coordinate by 1e-4 or more."""
    for t, (g, w) in enumerate(zip(got, want)):
        for j in range(P):
            assert math.isclose(g[j], w[j], rel_tol=1e-12, abs_tol=1e-15), (t, j, g, w)


B1, B2, TAU, V0, LR = 0.7, 0.95, 0.03, 0.002, 0.4


def test_fedadam_over_five_rounds_every_hyperparameter_acting():
    algo = fedadam.build(_resolved("fedadam", {"beta1": B1, "beta2": B2, "tau": TAU, "v0": V0}, LR), None)
    want = _oracle(lambda v, d, _: (B2 * v + (1 - B2) * d * d, None), lambda v, _: math.sqrt(v) + TAU, B1, LR, V0)
    logged: list = []
    _assert_rounds(_run(algo, logged=logged), want)
    # the logged adaptive step is ||m / (sqrt(v) + tau)||, the model's move over eta_g (recovered from float64
    # differences of coordinates below 1 whose moves exceed 1e-3: relative error under 1e-12, bound 1e-9)
    start = [0.2, -0.1, 0.05]
    for before, after, info in zip([start, *want], want, logged):
        step = math.sqrt(sum((b - a) ** 2 for b, a in zip(before, after))) / LR
        assert math.isclose(info["adaptive_step_norm"], step, rel_tol=1e-9)


def test_fedyogi_over_five_rounds_every_hyperparameter_acting():
    def yogi(v, d, _):
        sign = (v - d * d > 0) - (v - d * d < 0)
        return v - (1 - B2) * d * d * sign, None

    algo = fedyogi.build(_resolved("fedyogi", {"beta1": B1, "beta2": B2, "tau": TAU, "v0": V0}, LR), None)
    want = _oracle(yogi, lambda v, _: math.sqrt(v) + TAU, B1, LR, V0)
    _assert_rounds(_run(algo), want)
    # Yogi's sign acted both ways: against Adam at the same settings the rounds differ
    adam = _oracle(lambda v, d, _: (B2 * v + (1 - B2) * d * d, None), lambda v, _: math.sqrt(v) + TAU, B1, LR, V0)
    assert any(abs(a - w) > 1e-6 for ra, rw in zip(adam, want) for a, w in zip(ra, rw))


def test_fedams_over_five_rounds_max_and_floor_acting():
    eps = 1e-4  # above the tiny coordinates' v, below the large ones'

    def ams(v, d, v_hat):
        v = B2 * v + (1 - B2) * d * d
        floor = max(v, eps)
        return v, floor if v_hat is None else max(v_hat, floor)

    algo = fedams.build(_resolved("fedams", {"beta1": B1, "beta2": B2, "eps": eps}, LR), None)
    want = _oracle(ams, lambda v, v_hat: math.sqrt(v_hat), B1, LR, 0.0)
    _assert_rounds(_run(algo), want)


def test_fedadagrad_over_five_rounds_every_hyperparameter_acting():
    algo = fedadagrad.build(_resolved("fedadagrad", {"beta1": B1, "tau": TAU, "v0": V0}, LR), None)
    want = _oracle(lambda v, d, _: (v + d * d, None), lambda v, _: math.sqrt(v) + TAU, B1, LR, V0)
    _assert_rounds(_run(algo), want)


@pytest.mark.parametrize("momentum", [0.0, 0.85])
def test_fedavgm_over_five_rounds(momentum):
    """v <- beta v + d, x <- x - eta_g v (Hsu et al. 2019; no dampening), from v = d of the first round."""
    algo = fedavgm.build(_resolved("fedavgm", {"momentum": momentum}, 0.6), None)
    x, v, want = [0.2, -0.1, 0.05], [0.0] * P, []
    for t in range(ROUNDS):
        d = _weighted_mean(DELTAS[t])
        v = [momentum * v[j] + d[j] for j in range(P)]
        x = [x[j] - 0.6 * v[j] for j in range(P)]
        want.append(list(x))
    _assert_rounds(_run(algo), want)


# --------------------------------------------------------------------------- client learning-rate schedule


def test_client_lr_decays_every_round_and_drops_at_each_milestone():
    """lr_t = lr * lr_decay^t * factor^(milestones passed), a milestone m passed from round m * R on (FedNova
    divides by 10 at 50% and 75%); a non-default factor and two milestones, over every round of the run."""
    from fedrepro.parts import lr_schedule

    s = settings.resolve(
        {
            "algorithm": "fedavg",
            "rounds": 20,
            "client": {"lr": 0.3, "lr_decay": 0.95, "lr_milestones": [0.3, 0.75], "lr_milestone_factor": 0.2},
        }
    )
    schedule = lr_schedule(s)
    for t in range(20):
        passed = (t >= 6) + (t >= 15)
        assert math.isclose(schedule(t), 0.3 * 0.95**t * 0.2**passed, rel_tol=1e-12), t


# --------------------------------------------------------------------------- reported metrics


def _frame_evaluated_every(every: int, rounds: int, last: int = 10):
    """A run's metrics.csv as the trainer writes it: one row a round, test accuracy on the rounds that
    evaluate (every ``every``-th and the last ``last``), NaN on the others; accuracy 0.5 + t / 1000."""
    import pandas as pd

    acc = [0.5 + t / 1000 if t % every == 0 or rounds - t <= last else float("nan") for t in range(rounds)]
    return pd.DataFrame({"round": range(rounds), "test_acc": acc, "loss": [float(t) for t in range(rounds)]})


def test_mean_last_rounds_is_over_the_last_evaluated_rounds_whole_window():
    from fedrepro.report import paper

    frame = _frame_evaluated_every(7, 40)
    done = {"status": "finished"}
    # the last 10 rounds (30..39) are all evaluated: their mean, every one of them counted
    want = sum(0.5 + t / 1000 for t in range(30, 40)) / 10 * 100
    assert math.isclose(
        paper.run_metric({"kind": "mean_last_rounds", "rounds": 10, "scale": 100}, done, frame), want, rel_tol=1e-12
    )
    # a 15-round window reaches past them: the evaluated rounds before (28, 21, 14, 7 ...), not the NaN rows
    evaluated = [t for t in range(40) if t % 7 == 0 or 40 - t <= 10][-15:]
    want15 = sum(0.5 + t / 1000 for t in evaluated) / 15
    assert math.isclose(
        paper.run_metric({"kind": "mean_last_rounds", "rounds": 15}, done, frame), want15, rel_tol=1e-12
    )
    # the last 30% of the rounds (12 of 40: rounds 28..39), their evaluated ones (28 and 30..39)
    frac = [t for t in range(28, 40) if t % 7 == 0 or 40 - t <= 10]
    assert math.isclose(
        paper.run_metric({"kind": "mean_last_fraction", "fraction": 0.3}, done, frame),
        sum(0.5 + t / 1000 for t in frac) / len(frac),
        rel_tol=1e-12,
    )
    assert math.isclose(
        paper.run_metric({"kind": "mean_last_logged", "column": "loss", "rounds": 4}, done, frame),
        (36 + 37 + 38 + 39) / 4,
        rel_tol=1e-12,
    )


# --------------------------------------------------------------------------- fork points


@pytest.mark.parametrize("window", [1, 2, 3])
def test_a_fork_from_a_parent_that_kept_more_models_takes_the_last_ones(window):
    """A parent keeps the last models its most demanding child needs (window 5: four); a child of a smaller
    window forked from the same state holds the last P - 1 of them, and from t_s on its model is the mean of
    the last P host models, as when the child trains from round 0 (Zhou et al. 2023, eq. 3)."""
    from fedrepro.algorithms import ima

    gen = torch.Generator().manual_seed(4)
    host = [torch.randn(P, generator=gen, dtype=F64) for _ in range(12)]  # the host's model after each round
    start = 7
    kept = host[start - 4 : start]  # the parent's fork state at t_s: its last four models
    child = ima.WindowAverage(window, start)
    child.start_from_fork(kept)
    for t in range(start, 12):
        updates = RoundUpdates(
            t, torch.tensor([0]), torch.zeros(1, P), torch.ones(1), torch.ones(1), torch.zeros(1), 0.1
        )
        got = child(host[t], updates)
        want = [sum(float(host[i][j]) for i in range(t - window + 1, t + 1)) / window for j in range(P)]
        assert all(math.isclose(float(got[j]), want[j], rel_tol=1e-12, abs_tol=1e-15) for j in range(P)), t


# --------------------------------------------------------------------------- per-client random draws


def _within_six_sigma(counts: dict, n: int, values) -> None:
    """Each value's count of n uniform draws over ``values`` within six binomial standard deviations of
    n / |values| (the draws are seeded, so this is a fixed check, not a flaky one)."""
    p = 1 / len(values)
    for v in values:
        assert abs(counts.get(v, 0) - n * p) <= 6 * math.sqrt(n * p * (1 - p)), (v, counts)
    assert set(counts) == set(values), counts


def test_random_epochs_are_uniform_on_both_ends_and_each_clients_own():
    """FedNova's E_i(t) ~ U{low..high}, both ends included, a draw per (round, client)."""
    from fedrepro.algorithms import random_epochs

    s = settings.resolve({"algorithm": "fedavg+random_epochs", "seed": 3, "random_epochs": {"low": 2, "high": 5}})
    from types import SimpleNamespace

    from fedrepro.parts import ClientPlan

    algo = SimpleNamespace(client_plan=ClientPlan())
    random_epochs.apply(algo, s, None)
    draws = {(t, c): algo.client_plan.local_epochs(t, c) for t in range(200) for c in range(20)}
    counts: dict = {}
    for e in draws.values():
        counts[e] = counts.get(e, 0) + 1
    _within_six_sigma(counts, len(draws), [2, 3, 4, 5])
    # each client its own draw: in most rounds the clients do not all draw alike, and client 0's sequence
    # is not client 1's
    assert sum(len({draws[t, c] for c in range(20)}) > 1 for t in range(200)) == 200
    assert [draws[t, 0] for t in range(200)] != [draws[t, 1] for t in range(200)]
    # the same (round, client) redraws the same count, whatever was drawn before
    assert all(algo.client_plan.local_epochs(t, c) == draws[t, c] for t in (0, 77, 199) for c in (0, 19))


def test_random_batch_sizes_are_uniform_below_the_clients_size_and_each_clients_own():
    """FedAWARE's code's B_i ~ U{low..n_i - 1}, per (round, client); n_i <= low: one batch of all n_i."""
    from fedrepro.algorithms import random_batch

    draw = random_batch.RandomBatch(seed=5, low=10)
    counts: dict = {}
    n = 0
    for t in range(300):
        for c in range(10):
            b = draw(t, c, 14)
            counts[b] = counts.get(b, 0) + 1
            n += 1
    _within_six_sigma(counts, n, [10, 11, 12, 13])
    assert [draw(t, 0, 14) for t in range(50)] != [draw(t, 1, 14) for t in range(50)]
    assert draw(0, 0, 11) == 10 and draw(3, 2, 10) == 10 and draw(3, 2, 7) == 7


def test_fedawares_exploration_credits_every_client_once_in_the_code_pairing_too():
    """FedAWARE's warm-up explores: over its ceil(N/k) rounds every client is drawn, and, with k dividing N,
    exactly once; the ids the code credits uploads to (``cohort.assignment: code``) are those draws, in the
    sampler's order, so they cover every client once as well (uniform draws would repeat some)."""
    from fedrepro.run.cohorts import code_pairing, sample_cohort

    n, k = 12, 4
    for seed in (1, 2, 3):
        credited = [c for t in range(n // k) for c in code_pairing(seed, t, n, k, "permutation").tolist()]
        drawn = [c for t in range(n // k) for c in sample_cohort(seed, t, n, k, "permutation").tolist()]
        assert sorted(credited) == sorted(drawn) == list(range(n)), seed
