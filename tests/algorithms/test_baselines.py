"""Baselines: server optimizers against hand-computed steps, client corrections (FedProx, SCAFFOLD,
FedDyn, FedCM) against hand-computed local runs, state through checkpoints, and two real rounds."""

from __future__ import annotations

import io
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import make_partition
from fedrepro.algorithms import BuildContext, fedavgm, fedcm, feddyn, fedprox, scaffold
from fedrepro.configure import settings
from fedrepro.parts import Algorithm, ClientRun, RoundUpdates
from fedrepro.run import checkpoint
from fedrepro.server_optim import ServerAdam, ServerAMS, ServerYogi

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

F64 = torch.float64


def vec(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def updates_with(deltas, sizes=None, steps=None, lr=0.1, clients=None) -> RoundUpdates:
    k = deltas.shape[0]
    return RoundUpdates(
        0,
        torch.arange(k) if clients is None else torch.tensor(clients),
        deltas,
        torch.ones(k, dtype=F64) if sizes is None else sizes,
        torch.ones(k, dtype=F64) if steps is None else steps,
        torch.zeros(k),
        lr,
    )


def round_trip(state: dict) -> dict:
    """Through torch.save / weights_only load, as checkpoints are."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


# --------------------------------------------------------------------------- server optimizers


D1, D2 = vec(1.0, -2.0, 0.5), vec(0.5, 0.5, 0.5)
B1, B2, TAU, LR = 0.9, 0.99, 1e-3, 0.1


def test_fedadam_two_steps_by_hand():
    opt, x = ServerAdam(LR, B1, B2, TAU), torch.zeros(3, dtype=F64)
    x1 = opt(x, D1, updates_with(D1[None]))
    # m = 0.1 d, v = 0.01 d^2, sqrt(v) = 0.1 |d|: step_j = 0.1 d_j / (0.1 |d_j| + 1e-3)
    torch.testing.assert_close(x1, -LR * vec(0.1 / 0.101, -0.2 / 0.201, 0.05 / 0.051))
    x2 = opt(x1, D2, updates_with(D2[None]))
    m = [0.9 * 0.1 + 0.05, 0.9 * -0.2 + 0.05, 0.9 * 0.05 + 0.05]
    v = [0.99 * 0.01 + 0.0025, 0.99 * 0.04 + 0.0025, 0.99 * 0.0025 + 0.0025]
    torch.testing.assert_close(x2, x1 - LR * vec(*[mj / (math.sqrt(vj) + TAU) for mj, vj in zip(m, v)]))
    restored = ServerAdam(LR, B1, B2, TAU)
    restored.load_state_dict(round_trip(opt.state_dict()))
    torch.testing.assert_close(restored(x2, D1, updates_with(D1[None])), opt(x2, D1, updates_with(D1[None])))


def test_fedadam_v0_starts_the_second_moment():
    opt = ServerAdam(LR, B1, B2, TAU, v0=TAU**2)
    x1 = opt(torch.zeros(1, dtype=F64), vec(2.0), updates_with(vec(2.0)[None]))
    assert float(x1) == pytest.approx(-LR * 0.2 / (math.sqrt(0.99 * 1e-6 + 0.04) + TAU))


def test_fedyogi_first_step_is_adams_and_second_moves_v_additively():
    yogi, adam, x = ServerYogi(LR, B1, B2, TAU), ServerAdam(LR, B1, B2, TAU), torch.zeros(3, dtype=F64)
    torch.testing.assert_close(yogi(x, D1, updates_with(D1[None])), adam(x, D1, updates_with(D1[None])))
    x2 = yogi(x, D2, updates_with(D2[None]))
    # every v_j (0.01, 0.04, 0.0025) is below d^2 = 0.25: sign(v - d^2) = -1, v += 0.01 * 0.25
    v = [0.01 + 0.0025, 0.04 + 0.0025, 0.0025 + 0.0025]
    m = [0.9 * 0.1 + 0.05, 0.9 * -0.2 + 0.05, 0.9 * 0.05 + 0.05]
    torch.testing.assert_close(x2, x - LR * vec(*[mj / (math.sqrt(vj) + TAU) for mj, vj in zip(m, v)]))
    # above d^2 it shrinks by the same additive amount
    torch.testing.assert_close(yogi.v, vec(*v))
    yogi.v = vec(1.0, 1.0, 1.0)
    yogi(x, D2, updates_with(D2[None]))
    torch.testing.assert_close(yogi.v, vec(1 - 0.0025, 1 - 0.0025, 1 - 0.0025))


def test_fedams_floors_and_never_lowers_v_hat():
    opt, x = ServerAMS(LR, B1, B2, eps=1e-8), torch.zeros(3, dtype=F64)
    d1 = vec(1.0, -2.0, 0.0)
    x1 = opt(x, d1, updates_with(d1[None]))
    # v_hat = max(0.01 d^2, eps): step = 0.1 d / (0.1 |d|) = sign(d), and 0 / 1e-4 = 0 where d = 0
    torch.testing.assert_close(x1, -LR * vec(1.0, -1.0, 0.0))
    torch.testing.assert_close(opt.v_hat, vec(0.01, 0.04, 1e-8))
    tiny = vec(0.0, 0.0, 0.0)
    opt(x1, tiny, updates_with(tiny[None]))
    torch.testing.assert_close(opt.v, vec(0.0099, 0.0396, 0.0))
    torch.testing.assert_close(opt.v_hat, vec(0.01, 0.04, 1e-8))  # the max keeps the larger past value
    restored = ServerAMS(LR, B1, B2, eps=1e-8)
    restored.load_state_dict(round_trip(opt.state_dict()))
    torch.testing.assert_close(restored(x1, D2, updates_with(D2[None])), opt(x1, D2, updates_with(D2[None])))


def test_fedavgm_follows_the_heavy_ball_recurrence():
    beta, eta = 0.7, 0.5
    algo = fedavgm.build({"server": {"lr": eta}, "fedavgm": {"momentum": beta}}, None)
    gen = torch.Generator().manual_seed(1)
    x = x_ref = torch.zeros(4, dtype=F64)
    v = torch.zeros(4, dtype=F64)
    for _ in range(4):
        deltas = torch.randn(3, 4, generator=gen, dtype=F64)
        sizes = vec(1.0, 2.0, 5.0)
        d = (sizes / 8) @ deltas
        v = beta * v + d
        x_ref = x_ref - eta * v
        x = algo.server_step(x, updates_with(deltas, sizes))
    torch.testing.assert_close(x, x_ref)


# --------------------------------------------------------------------------- client corrections


def local_gd(corrections, client, x_global, target, lr, steps):
    """Gradient descent on F_i(x) = 1/2 ||x - target||^2 with the corrections applied as LocalSGD does."""
    x = x_global.clone()
    run = ClientRun(0, client, SimpleNamespace(flat=x), x_global, lr)
    for c in corrections:
        c.begin(run)
    for _ in range(steps):
        g = x - target
        for c in corrections:
            c(g, run)
        x.sub_(lr * g)
        run.steps += 1
    for c in corrections:
        c.end(run)
    return x


def federated_round(algo: Algorithm, x, targets, cohort, lr=0.1, steps=2, sizes=None):
    locals_ = [local_gd(algo.corrections, c, x, targets[c], lr, steps) for c in cohort]
    deltas = torch.stack([x - xi for xi in locals_])
    k = len(cohort)
    updates = RoundUpdates(
        0,
        torch.tensor(cohort),
        deltas,
        torch.ones(k, dtype=F64) if sizes is None else sizes,
        torch.full((k,), float(steps), dtype=F64),
        torch.zeros(k),
        lr,
    )
    return algo.server_step(x, updates), updates


TARGETS = [vec(1.0, 0.0), vec(5.0, 5.0), vec(0.0, 2.0)]
# the sections as a resolved setting gives them (every key with its value: the methods read no defaults)
SETTING = {
    "server": {"lr": 1.0},
    "fedprox": {"mu": 0.5, "mean": "data_size"},
    "feddyn": {"alpha": 0.1, "form": "paper"},
    "fedcm": {"alpha": 0.25},
}


def ctx():
    return BuildContext(3, 2, torch.device("cpu"), torch.ones(3))


def as_f64(algo: Algorithm) -> Algorithm:
    for part in algo.parts().values():
        for name, value in vars(part).items():
            if isinstance(value, torch.Tensor):
                setattr(part, name, value.to(F64))
    return algo


def test_fedprox_adds_mu_times_the_distance_to_the_global_model():
    algo = fedprox.build(SETTING, ctx())
    g = vec(1.0, -1.0)
    algo.corrections[0](g, ClientRun(0, 0, SimpleNamespace(flat=vec(3.0, 1.0)), vec(1.0, 2.0), 0.1))
    torch.testing.assert_close(g, vec(1.0 + 0.5 * 2.0, -1.0 + 0.5 * -1.0))


def test_scaffold_control_variates_by_hand():
    algo = as_f64(scaffold.build(SETTING, ctx()))
    cv = algo.corrections[0]
    x1, _ = federated_round(algo, torch.zeros(2, dtype=F64), TARGETS, [0, 2])
    # round 1, c = c_i = 0: client 0 goes 0 -> 0.1 -> 0.19 along axis 0, client 2 0 -> 0.2 -> 0.38 along axis 1
    torch.testing.assert_close(cv.c_clients[0], vec(-0.19 / 0.2, 0.0))  # c_0 = (x - x_0) / (tau lr)
    torch.testing.assert_close(cv.c_clients[2], vec(0.0, -0.38 / 0.2))
    torch.testing.assert_close(cv.c_clients[1], vec(0.0, 0.0))
    torch.testing.assert_close(cv.c, vec(-0.95 / 3, -1.9 / 3))  # c += (1/N) sum (c_i+ - c_i)
    torch.testing.assert_close(x1, vec(0.095, 0.19))  # uniform mean of the two updates
    # round 2, client 0: every local gradient is shifted by c - c_0
    shift = cv.c - cv.c_clients[0]
    x, expected = x1.clone(), x1.clone()
    for _ in range(2):
        expected = expected - 0.1 * (expected - TARGETS[0] + shift)
    old_c0, old_c = cv.c_clients[0].clone(), cv.c.clone()
    saved = round_trip(algo.state_dict())
    x2, updates = federated_round(algo, x, TARGETS, [0])
    torch.testing.assert_close(x2, expected)
    torch.testing.assert_close(cv.c_clients[0], old_c0 - old_c + (x1 - expected) / 0.2)
    torch.testing.assert_close(cv.c, old_c + (cv.c_clients[0] - old_c0) / 3)
    again = as_f64(scaffold.build(SETTING, ctx()))
    again.load_state_dict(saved)
    x2_again, _ = federated_round(again, x1, TARGETS, [0])
    assert torch.equal(x2_again, x2)
    assert torch.equal(again.corrections[0].c, cv.c)


def test_feddyn_state_and_server_step_by_hand():
    algo = as_f64(feddyn.build(SETTING, ctx()))
    x1, _ = federated_round(algo, torch.zeros(2, dtype=F64), TARGETS, [0, 2])
    # client 0: x = 0.1, then g = -0.9 + 0.1 * 0.1 = -0.89, x = 0.189; client 2 likewise reaches 0.378
    reg, agg = algo.corrections[0], algo.aggregator
    torch.testing.assert_close(reg.grad_state[0], vec(-0.1 * 0.189, 0.0))  # l_0 = -alpha (x_0 - x)
    torch.testing.assert_close(reg.grad_state[2], vec(0.0, -0.1 * 0.378))
    torch.testing.assert_close(agg.h, (0.1 / 3) * vec(-0.189, -0.378))  # h = alpha/N sum Delta_i
    # x = mean(x_i) - h / alpha = (0.0945, 0.189) + (0.063, 0.126)
    torch.testing.assert_close(x1, vec(0.1575, 0.315))
    saved = round_trip(algo.state_dict())
    x2, _ = federated_round(algo, x1, TARGETS, [0, 1])
    again = as_f64(feddyn.build(SETTING, ctx()))
    again.load_state_dict(saved)
    x2_again, _ = federated_round(again, x1, TARGETS, [0, 1])
    assert torch.equal(x2, x2_again)
    assert torch.equal(again.aggregator.h, agg.h)


def test_feddyn_in_fedlaws_code_form_by_hand():
    """Norm penalty alpha/2 ||x - x_g|| (a unit-vector gradient, zero at x_g) and a data-size weighted state."""
    setting = {**SETTING, "feddyn": {"alpha": 0.1, "form": "fedlaw_code"}}
    algo = as_f64(feddyn.build(setting, ctx()))
    x1, _ = federated_round(algo, torch.zeros(2, dtype=F64), TARGETS, [0, 2])
    # client 0: x = 0.1, then g = -0.9 + 0.05 = -0.85, x = 0.185; client 2: 0.2, then g = -1.8 + 0.05, x = 0.375
    reg, agg = algo.corrections[0], algo.aggregator
    torch.testing.assert_close(reg.grad_state[0], vec(-0.1 * 0.185, 0.0))
    torch.testing.assert_close(reg.grad_state[2], vec(0.0, -0.1 * 0.375))
    torch.testing.assert_close(agg.h, 0.1 * vec(-0.185 / 2, -0.375 / 2))  # h = alpha sum p_i Delta_i, p = 1/2
    # d = sum p_i Delta_i + h / alpha = 2 sum p_i Delta_i
    torch.testing.assert_close(x1, vec(0.185, 0.375))


def test_fedcm_mixes_the_local_gradient_with_the_last_rounds_average_gradient():
    algo = as_f64(fedcm.build(SETTING, ctx()))
    mom = algo.corrections[0]
    sizes = vec(1.0, 3.0)
    x1, updates = federated_round(algo, torch.zeros(2, dtype=F64), TARGETS, [0, 2], sizes=sizes)
    # round 1 has G_0 = 0, so each step is alpha * g: client 0 goes 0 -> 0.025 -> 0.049375
    torch.testing.assert_close(updates.deltas[0], vec(-0.049375, 0.0))
    torch.testing.assert_close(x1, -(0.25 * updates.deltas[0] + 0.75 * updates.deltas[1]))
    # G_1 = sum p_i Delta_i / (lr tau_i)
    torch.testing.assert_close(mom.global_gradient, (0.25 * updates.deltas[0] + 0.75 * updates.deltas[1]) / 0.2)
    g = vec(2.0, -4.0)
    mom(g, ClientRun(1, 1, SimpleNamespace(flat=x1), x1, 0.1))
    torch.testing.assert_close(g, 0.25 * vec(2.0, -4.0) + 0.75 * mom.global_gradient)
    again = as_f64(fedcm.build(SETTING, ctx()))
    again.load_state_dict(round_trip(algo.state_dict()))
    torch.testing.assert_close(again.corrections[0].global_gradient, mom.global_gradient)


# --------------------------------------------------------------------------- two real rounds, and resume


METHODS = [
    "fedavgm",
    "fedprox",
    "scaffold",
    "feddyn",
    "fedcm",
    "fedadam",
    "fedyogi",
    "fedams",
    "fednova",
    "fednova+random_epochs",
    "fedavg+random_epochs",
]


@pytest.fixture(scope="module")
def tiny_partition(tiny_data_root, tmp_path_factory):
    return make_partition(tiny_data_root, tmp_path_factory.mktemp("part"), num_clients=4, kind="iid")


def tiny_setting(method: str) -> dict:
    extra = {"fednova": {"mu": 0.01, "server_momentum": 0.5}} if method.startswith("fednova") else {}
    return settings.resolve(
        {
            "algorithm": method,
            "num_clients": 4,
            "participation": 0.5,
            "rounds": 3,
            "batch_size": 50,
            "device": "cpu",
            "partition": {"kind": "iid"},
            "client": {"lr": 0.05, "lr_decay": 0.9, "momentum": 0.5},
            **extra,
        }
    )


@pytest.mark.parametrize("method", METHODS)
def test_runs_end_to_end_and_resumes_exactly(method, tiny_data_root, tiny_partition, tmp_path):
    from fedrepro.run.trainer import Trainer

    s = tiny_setting(method)
    straight = Trainer(s, tmp_path / "a", tiny_partition, tiny_data_root).run(progress=False)
    assert straight["status"] == "finished"
    Trainer(s, tmp_path / "b", tiny_partition, tiny_data_root).run(progress=False, stop_after=1)
    resumed = Trainer(s, tmp_path / "b", tiny_partition, tiny_data_root).run(progress=False)
    assert resumed["resumed"]
    a, b = checkpoint.load(tmp_path / "a" / "model.pt"), checkpoint.load(tmp_path / "b" / "model.pt")
    assert torch.isfinite(a["x"]).all()
    assert torch.equal(a["x"], b["x"])


def test_random_epochs_set_each_clients_local_steps(tiny_data_root, tiny_partition, tmp_path):
    from fedrepro.algorithms.random_epochs import RandomEpochs
    from fedrepro.run.trainer import Trainer

    s = tiny_setting("fedavg+random_epochs")
    trainer = Trainer(s, tmp_path / "a", tiny_partition, tiny_data_root)
    cohort = np.arange(4)
    draws = RandomEpochs(s["seed"], 2, 5)
    for t in range(3):
        updates = trainer.train_cohort(trainer.plan(t, cohort, trainer.model.flat.clone(), 0.05))
        expected = [draws(t, c) * math.ceil(len(trainer.inputs.client_index[c]) / 50) for c in cohort]
        assert updates.steps.tolist() == expected


def test_random_batch_sizes_set_each_clients_local_steps_and_repeat(tiny_data_root, tiny_partition, tmp_path):
    """+random_batch (FedAWARE's -agnostic 1): B_i from {10..n_i - 1}, per client and round, from its own stream."""
    from fedrepro.algorithms.random_batch import RandomBatch
    from fedrepro.algorithms.random_epochs import RandomEpochs
    from fedrepro.run.trainer import Trainer

    s = tiny_setting("fedavg+random_epochs+random_batch")
    trainer = Trainer(s, tmp_path / "a", tiny_partition, tiny_data_root)
    cohort = np.arange(4)
    epochs, batches = RandomEpochs(s["seed"], 2, 5), RandomBatch(s["seed"], 10)
    drawn = set()
    for t in range(3):
        updates = trainer.train_cohort(trainer.plan(t, cohort, trainer.model.flat.clone(), 0.05))
        sizes = [len(trainer.inputs.client_index[c]) for c in cohort]
        b = [batches(t, c, n) for c, n in zip(cohort, sizes)]
        assert all(10 <= bi < n for bi, n in zip(b, sizes))
        drawn.update(b)
        assert updates.steps.tolist() == [epochs(t, c) * math.ceil(n / bi) for c, n, bi in zip(cohort, sizes, b)]
    assert len(drawn) > 3  # drawn afresh, not one size for all
    assert RandomBatch(1, 10)(0, 0, 10) == 10 and RandomBatch(1, 10)(0, 0, 4) == 4  # n_i <= 10: one batch


@pytest.mark.parametrize("mean", ["data_size", "uniform"])
def test_fedprox_mean_weighs_by_data_size_or_uniformly(mean):
    """fedprox.mean: uniform is FedAWARE's code (FedLab's SyncServerHandler: 1/|S| each)."""
    from fedrepro.parts import RoundUpdates

    algo = fedprox.build({**SETTING, "fedprox": {"mu": 0.5, "mean": mean}}, ctx())
    deltas = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    updates = RoundUpdates(
        0, torch.tensor([0, 1]), deltas, torch.tensor([1.0, 3.0]), torch.ones(2), torch.zeros(2), 0.1
    )
    x_new = algo.server_step(torch.zeros(2), updates)
    expected = torch.tensor([-0.5, -0.5]) if mean == "uniform" else torch.tensor([-0.25, -0.75])
    torch.testing.assert_close(x_new, expected)


# --------------------------------------------------------------------------- every term over several rounds


def _rounds(algo: Algorithm, x, plan, lr=0.1):
    """Rounds of quadratic clients (F_i(x) = 1/2 ||x - target_i||^2) with each client's own step count and data
    size: plan = [(cohort, steps, sizes), ...]. Returns the global models and each round's updates."""
    path, logs = [], []
    for cohort, steps, sizes in plan:
        locals_ = [local_gd(algo.corrections, c, x, TARGETS[c], lr, s) for c, s in zip(cohort, steps)]
        updates = RoundUpdates(
            len(path),
            torch.tensor(cohort),
            torch.stack([x - xi for xi in locals_]),
            vec(*sizes),
            vec(*map(float, steps)),
            torch.zeros(len(cohort)),
            lr,
        )
        x = algo.server_step(x, updates)
        path.append(x.clone())
        logs.append(updates)
    return path, logs


# clients 0 and 1 come back, with other step counts and sizes; the first global model is not zero, so no term
# of the form x - x_global or x + x_global can hide behind x_global = 0
PLAN = [([0, 2], [2, 3], [1.0, 3.0]), ([0, 1], [3, 1], [2.0, 1.0]), ([1, 2, 0], [2, 2, 1], [1.0, 4.0, 2.0])]
X0 = vec(0.3, -0.2)


@pytest.mark.parametrize("form", ["paper", "fedlaw_code"])
def test_feddyn_over_three_rounds_is_the_papers_recursion(form):
    """FedDyn (Acar et al., Algorithm 1), written out here: client i descends F_i - <l_i, x> + alpha/2 ||x - x_g||^2
    (FedLAW's code: alpha/2 ||x - x_g||, a unit vector's gradient), then l_i <- l_i - alpha (x_i - x_g); the server
    h <- h + (alpha/N) sum_S Delta_i and x <- mean_S x_i - h/alpha (FedLAW's code: data-size weights p_i for the
    mean, h <- h + alpha sum_S p_i Delta_i)."""
    alpha, lr, n = 0.1, 0.1, 3
    algo = as_f64(feddyn.build({**SETTING, "feddyn": {"alpha": alpha, "form": form}}, ctx()))
    path, logs = _rounds(algo, X0.clone(), PLAN, lr)
    state, h, x = torch.zeros(n, 2, dtype=F64), torch.zeros(2, dtype=F64), X0.clone()
    for (cohort, steps, sizes), got, updates in zip(PLAN, path, logs):
        ends = []
        for c, s in zip(cohort, steps):
            xi = x.clone()
            for _ in range(s):
                offset = xi - x
                pull = alpha * offset if form == "paper" else alpha / 2 * offset / max(float(offset.norm()), 1e-30)
                xi = xi - lr * ((xi - TARGETS[c]) - state[c] + pull)
            state[c] = state[c] - alpha * (xi - x)
            ends.append(xi)
        deltas = torch.stack([x - xi for xi in ends])
        if form == "paper":
            h = h + alpha / n * deltas.sum(0)
            x = x - (deltas.mean(0) + h / alpha)
        else:
            p = vec(*sizes) / sum(sizes)
            h = h + alpha * (p @ deltas)
            x = x - (p @ deltas + h / alpha)
        torch.testing.assert_close(got, x, rtol=1e-12, atol=1e-14)
        assert updates.info["feddyn_h_norm"] == pytest.approx(float(h.norm()), rel=1e-12)
    torch.testing.assert_close(algo.corrections[0].grad_state, state, rtol=1e-12, atol=1e-14)


def test_scaffold_over_three_rounds_is_the_papers_recursion():
    """SCAFFOLD option II (Karimireddy et al., Algorithm 1), written out here, with each client's own step count:
    g <- g - c_i + c; c_i+ = c_i - c + (x - x_i) / (tau_i lr); c <- c + (1/N) sum_S (c_i+ - c_i) after the round;
    x <- x - (1/|S|) sum_S Delta_i."""
    lr, n = 0.1, 3
    algo = as_f64(scaffold.build(SETTING, ctx()))
    path, logs = _rounds(algo, X0.clone(), PLAN, lr)
    c, c_i, x = torch.zeros(2, dtype=F64), torch.zeros(n, 2, dtype=F64), X0.clone()
    for (cohort, steps, _), got, updates in zip(PLAN, path, logs):
        ends, change = [], torch.zeros(2, dtype=F64)
        for k, s in zip(cohort, steps):
            xi = x.clone()
            for _ in range(s):
                xi = xi - lr * ((xi - TARGETS[k]) - c_i[k] + c)
            new = c_i[k] - c + (x - xi) / (s * lr)
            change, c_i[k] = change + new - c_i[k], new
            ends.append(xi)
        c = c + change / n
        x = torch.stack(ends).mean(0)
        torch.testing.assert_close(got, x, rtol=1e-12, atol=1e-14)
        assert updates.info["control_norm"] == pytest.approx(float(c.norm()), rel=1e-12)
    torch.testing.assert_close(algo.corrections[0].c_clients, c_i, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "method",
    ["fedavg", "fedavgm", "fedprox", "scaffold", "feddyn", "fedcm", "fedadam", "fedyogi", "fedams", "fedadagrad"],
)
def test_each_method_is_built_under_its_own_name(method):
    """The name is the one its checkpoints, logs and the registry know it by."""
    from fedrepro import algorithms

    setting = settings.resolve({"algorithm": method, "num_clients": 3})
    assert algorithms.build(setting, 3, 2, torch.device("cpu"), torch.ones(3)).name == method


def test_fedadagrads_server_defaults_are_its_declared_defaults():
    """ServerAdagrad built with its own defaults steps as the one the resolved setting builds (beta1 0.9,
    tau 1e-5, v0 0), two steps (the first moment and the sum of squares both carry over)."""
    from fedrepro.algorithms.fedadagrad import ServerAdagrad

    c = settings.resolve({"algorithm": "fedadagrad", "num_clients": 3})["fedadagrad"]
    declared, default = ServerAdagrad(0.1, c["beta1"], c["tau"], c["v0"]), ServerAdagrad(0.1)
    x_a = x_b = vec(0.5, -0.5, 1.0)
    for d in (D1, D2):
        x_a, x_b = declared(x_a, d, updates_with(d[None])), default(x_b, d, updates_with(d[None]))
    assert torch.equal(x_a, x_b)


def test_feddyns_parts_default_to_the_papers_form():
    """Built directly, without the form's flags: the squared penalty and FedDyn's uniform 1/|S| mean."""
    reg = feddyn.DynamicRegulariser(0.1, 3, 2)
    g = torch.zeros(2)
    reg(g, ClientRun(0, 0, SimpleNamespace(flat=torch.tensor([3.0, 0.0])), torch.tensor([1.0, 0.0]), 0.1))
    torch.testing.assert_close(g, torch.tensor([0.2, 0.0]))  # alpha (x - x_g), not alpha/2 times a unit vector
    agg = feddyn.DynamicAggregate(0.1, 3, 2)
    updates = updates_with(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), sizes=torch.tensor([1.0, 3.0]))
    torch.testing.assert_close(agg(torch.zeros(2), updates), torch.tensor([0.5, 0.5]) + agg.h / 0.1)
