"""FedNova: the a_i normaliser, equality with FedAvg under equal local work, and the objective
inconsistency of the FedNova paper's quadratic example (section III, eqs. 5 and 32)."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch

from fedrepro.algorithms import BuildContext, fedavg, fednova
from fedrepro.algorithms.fednova import CrossClientVR, LrScaledMomentum, NormalisedAveraging, a_norm
from fedrepro.algorithms.random_epochs import RandomEpochs
from fedrepro.configure import schema, settings
from fedrepro.data import TensorDataset
from fedrepro.flat import FlatModel
from fedrepro.models import build as build_model
from fedrepro.parts import Algorithm, ClientObjective, ClientRun, GradientCorrection, RoundUpdates
from fedrepro.run.client import LocalSGD, client_generator
from fedrepro.server import ServerSGD, WeightedMean

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats


def setting(momentum=0.0, mu=0.0, tau_eff="auto", server_momentum=0.0, lr=1.0, vr=False):
    return {
        "server": {"lr": lr},
        "client": {"momentum": momentum},
        "fednova": {"mu": mu, "tau_eff": tau_eff, "server_momentum": server_momentum, "vr": vr},
    }


def ctx(dim=1, num_clients=1):
    return BuildContext(num_clients, dim, torch.device("cpu"), torch.ones(num_clients))


# --------------------------------------------------------------------------- a_i


@pytest.mark.parametrize("tau", [1, 2, 7, 40])
def test_a_norm_matches_the_papers_closed_forms(tau):
    assert a_norm(tau, lr=0.1) == tau
    rho = 0.9
    momentum = (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)  # FedNova Table (momentum SGD)
    assert a_norm(tau, lr=0.1, rho=rho) == pytest.approx(momentum, rel=1e-12)
    lr, mu = 0.05, 0.5
    prox = (1 - (1 - lr * mu) ** tau) / (lr * mu)  # eq. (8): [1 - (1 - alpha)^tau] / alpha
    assert a_norm(tau, lr=lr, mu=mu) == pytest.approx(prox, rel=1e-12)


def test_a_norm_of_momentum_is_the_accumulated_weight_of_a_constant_gradient():
    # with a constant gradient g, heavy-ball SGD moves by lr * ||a||_1 * g: the definition of a_i
    g, lr, rho, x, buf = 0.3, 0.1, 0.8, 0.0, 0.0
    for _ in range(9):
        buf = rho * buf + g
        x -= lr * buf
    assert -x == pytest.approx(lr * g * a_norm(9, lr, rho=rho), rel=1e-12)


# --------------------------------------------------------------------------- FedNova == FedAvg


def local_round(rho: float, sizes: list[int], batch_size: int = 16, epochs: int = 2):
    """Real local training (LocalSGD on the MLP) of clients with the given data sizes."""
    torch.manual_seed(0)
    n = sum(sizes)
    data = TensorDataset(torch.randint(0, 255, (n, 1, 28, 28), dtype=torch.uint8), torch.arange(n) % 10, 0.0, 1.0)
    model = FlatModel(build_model("mlp", "fmnist"), torch.device("cpu"))
    x = model.flat.clone()
    local, lr = LocalSGD(momentum=rho), 0.05
    deltas, steps, start = [], [], 0
    for c, size in enumerate(sizes):
        index = torch.arange(start, start + size)
        start += size
        result = local.train(ClientRun(0, c, model, x, lr), data, index, epochs, batch_size, client_generator(1, 0, c))
        deltas.append(x - model.flat)
        steps.append(result.steps)
    updates = RoundUpdates(
        0,
        torch.arange(len(sizes)),
        torch.stack(deltas),
        torch.tensor(sizes, dtype=torch.float32),
        torch.tensor(steps, dtype=torch.float32),
        torch.zeros(len(sizes)),
        lr,
    )
    return x, updates


@pytest.mark.parametrize("rho", [0.0, 0.9])
def test_fednova_equals_fedavg_when_every_client_takes_the_same_steps(rho):
    # 60 and 64 samples in batches of 16 are both 4 steps per epoch, with unequal weights p_i
    x, updates = local_round(rho, [60, 64, 50])
    assert len(set(updates.steps.tolist())) == 1
    nova = fednova.build(setting(momentum=rho), ctx()).server_step(x, updates)
    avg = fedavg.build(setting(), ctx()).server_step(x, updates)
    torch.testing.assert_close(x - nova, x - avg, rtol=1e-5, atol=1e-8)


def test_fednova_differs_from_fedavg_when_steps_differ():
    x, updates = local_round(0.0, [30, 64, 50])  # 2, 4 and 4 steps per epoch
    nova = fednova.build(setting(), ctx()).server_step(x, updates)
    avg = fedavg.build(setting(), ctx()).server_step(x, updates)
    assert (nova - avg).norm() > 1e-3 * (x - avg).norm()
    # and the difference is exactly the reweighting tau_eff p_i / tau_i
    p = updates.weights
    expected = (p @ updates.steps) * (p / updates.steps) @ updates.deltas
    torch.testing.assert_close(x - nova, expected)


def test_fednova_prox_rescales_fedprox_by_tau_over_a():
    # equal steps: FedNova-Prox uses tau_eff = sum p_i tau_i, so d = tau / ||a||_1 * (FedAvg's d)
    lr, mu, tau = 0.05, 2.0, 8
    deltas = torch.randn(3, 5, dtype=torch.float64)
    sizes = torch.tensor([10.0, 30.0, 20.0], dtype=torch.float64)
    updates = RoundUpdates(
        0, torch.arange(3), deltas, sizes, torch.full((3,), float(tau), dtype=torch.float64), torch.zeros(3), lr
    )
    d = NormalisedAveraging(mu=mu)(torch.zeros(5, dtype=torch.float64), updates)
    a = (1 - (1 - lr * mu) ** tau) / (lr * mu)
    torch.testing.assert_close(d, tau / a * (sizes / sizes.sum()) @ deltas)
    assert updates.info["tau_eff"] == pytest.approx(tau)


def test_server_momentum_follows_the_official_lr_scaled_buffer():
    opt = LrScaledMomentum(lr=2.0, momentum=0.5)
    x = torch.tensor([1.0], dtype=torch.float64)
    u1 = RoundUpdates(0, torch.arange(1), torch.zeros(1, 1), torch.ones(1), torch.ones(1), torch.zeros(1), 0.1)
    u2 = RoundUpdates(1, torch.arange(1), torch.zeros(1, 1), torch.ones(1), torch.ones(1), torch.zeros(1), 0.05)
    x1 = opt(x, torch.tensor([0.2], dtype=torch.float64), u1)  # v = 0.2 / 0.1 = 2;  x = 1 - 2 * 0.1 * 2
    assert float(x1) == pytest.approx(0.6)
    x2 = opt(x1, torch.tensor([0.1], dtype=torch.float64), u2)  # v = 0.5 * 2 + 0.1 / 0.05 = 3;  x -= 2 * 0.05 * 3
    assert float(x2) == pytest.approx(0.3)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    again = LrScaledMomentum(lr=2.0, momentum=0.5)
    again.load_state_dict(torch.load(buffer, weights_only=True))
    torch.testing.assert_close(
        again(x2, torch.tensor([0.1], dtype=torch.float64), u2), opt(x2, torch.tensor([0.1], dtype=torch.float64), u2)
    )


# --------------------------------------------------------------------------- the quadratic example


M, DIM = 8, 4


def quadratic_problem():
    gen = torch.Generator().manual_seed(3)
    e = torch.randn(M, DIM, generator=gen, dtype=torch.float64)
    sizes = torch.tensor([5.0, 1.0, 3.0, 2.0, 8.0, 1.0, 4.0, 6.0], dtype=torch.float64)
    tau = torch.tensor([1.0, 40.0, 3.0, 25.0, 2.0, 60.0, 10.0, 5.0], dtype=torch.float64)
    return e, sizes, tau


def run_quadratic(algorithm: Algorithm, e, sizes, tau, lrs) -> torch.Tensor:
    """Clients run full-gradient GD on F_i(x) = 1/2 ||x - e_i||^2: after tau_i steps from x,
    x_i = e_i + (1 - lr)^tau_i (x - e_i), so Delta_i = [1 - (1 - lr)^tau_i] (x - e_i)."""
    x = torch.zeros(DIM, dtype=torch.float64)
    for t, lr in enumerate(lrs):
        shrink = 1 - (1 - lr) ** tau
        deltas = shrink[:, None] * (x - e)
        updates = RoundUpdates(t, torch.arange(M), deltas, sizes, tau, torch.zeros(M), lr)
        x = algorithm.server_step(x, updates)
    return x


def nova():
    return Algorithm("fednova", NormalisedAveraging(), ServerSGD(1.0))


def avg():
    return Algorithm("fedavg", WeightedMean(), ServerSGD(1.0))


def test_fixed_points_at_a_fixed_lr_match_the_closed_forms():
    e, sizes, tau = quadratic_problem()
    p, lr = sizes / sizes.sum(), 0.05
    c = 1 - (1 - lr) ** tau
    fedavg_limit = (p * c) @ e / (p * c).sum()  # eq. (32) with weights p_i
    fednova_limit = (p * c / tau) @ e / (p * c / tau).sum()  # d = 0 in FedNova's update
    torch.testing.assert_close(run_quadratic(avg(), e, sizes, tau, [lr] * 3000), fedavg_limit, rtol=0, atol=1e-10)
    torch.testing.assert_close(run_quadratic(nova(), e, sizes, tau, [lr] * 3000), fednova_limit, rtol=0, atol=1e-10)


def test_fednova_reaches_the_true_minimiser_as_the_lr_decays_and_fedavg_does_not():
    e, sizes, tau = quadratic_problem()
    p = sizes / sizes.sum()
    x_star = p @ e  # minimiser of sum_i p_i F_i
    x_fedavg_biased = (p * tau) @ e / (p * tau).sum()  # eq. (33): FedAvg's limit as lr -> 0
    bias = (x_fedavg_biased - x_star).norm()
    assert bias > 0.3
    # the paper's Fig. 2 schedule: 0.05, divided by 5 at rounds 600 and 900, then twice more
    lrs = [0.05] * 600 + [0.01] * 300 + [0.002] * 1500 + [0.0004] * 6000
    x_nova = run_quadratic(nova(), e, sizes, tau, lrs)
    x_avg = run_quadratic(avg(), e, sizes, tau, lrs)
    assert (x_nova - x_star).norm() < 0.02 * bias
    # FedAvg sits at eq. (32) for the last lr, which is within O(lr) of eq. (33), far from x*
    c = 1 - (1 - 0.0004) ** tau
    torch.testing.assert_close(x_avg, (p * c) @ e / (p * c).sum(), rtol=0, atol=1e-8)
    assert (x_avg - x_fedavg_biased).norm() < 0.05 * bias
    assert (x_avg - x_star).norm() > 0.9 * bias
    # and FedNova's error shrinks with the lr (its fixed point is x* only in the limit)
    errors = []
    for lr in (0.05, 0.01, 0.002):
        c = 1 - (1 - lr) ** tau
        errors.append(float(((p * c / tau) @ e / (p * c / tau).sum() - x_star).norm()))
    assert errors[0] > errors[1] > errors[2]


# --------------------------------------------------------------------------- random epochs


def test_random_epochs_cover_both_ends_and_repeat_exactly():
    draws = RandomEpochs(seed=7, low=2, high=5)
    values = [draws(t, c) for t in range(50) for c in range(10)]
    assert set(values) == {2, 3, 4, 5}
    again = RandomEpochs(seed=7, low=2, high=5)  # a resumed run rebuilds the hook
    assert values == [again(t, c) for t in range(50) for c in range(10)]
    assert values != [RandomEpochs(seed=8, low=2, high=5)(t, c) for t in range(50) for c in range(10)]


# --------------------------------------------------------------------------- FedNova-VR


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the VR state is allocated in the default dtype
    yield
    torch.set_default_dtype(old)


class Quadratic(ClientObjective):
    """F_i(x) = h_i/2 ||x - e_i||^2 + b_i.x with its exact gradient (one 'sample' per client)."""

    def __init__(self, h, e, b=None):
        self.h, self.e = h, e
        self.b = torch.zeros_like(e) if b is None else b

    def begin(self, run):
        self.client = run.client

    def __call__(self, run, inputs, labels):
        i, model = self.client, run.model
        model.grad = self.h[i] * (model.flat - self.e[i]) + self.b[i]
        return (0.5 * self.h[i] * (model.flat - self.e[i]).square().sum()).detach()


class OneSample:
    def batch(self, index):
        return index, index


def quadratic_round(algorithm, objective, x, lr, taus, sizes, t, rho=0.0):
    """One FedNova round of real LocalSGD (tau_i full-gradient steps) and the server step."""
    local, model, deltas = LocalSGD(momentum=rho), SimpleNamespace(flat=torch.empty_like(x), grad=None), []
    for i, tau in enumerate(taus):
        local.train(
            ClientRun(t, i, model, x, lr),
            OneSample(),
            torch.arange(1),
            tau,
            1,
            torch.Generator().manual_seed(0),
            algorithm.corrections,
            objective,
        )
        deltas.append(x - model.flat)
    m = len(taus)
    updates = RoundUpdates(
        t, torch.arange(m), torch.stack(deltas), sizes, torch.tensor(taus, dtype=x.dtype), torch.zeros(m), lr
    )
    return algorithm.server_step(x, updates), updates


def test_vr_matches_the_hand_computed_two_round_trajectory(float64):
    # plain GD with a constant correction c on h/2 (x - e)^2 is GD towards e - c/h:
    #   Delta_i = (1 - q_i)(x - e_i + c_i/h_i),  q_i = (1 - lr h_i)^tau_i,  d_i = Delta_i/(lr tau_i) - c_i
    m, dim, lr = 4, 3, 0.1
    gen = torch.Generator().manual_seed(5)
    e = torch.randn(m, dim, generator=gen)
    h = torch.tensor([0.5, 1.0, 2.0, 1.5])
    taus, sizes = [1, 3, 5, 8], torch.tensor([1.0, 2.0, 3.0, 4.0])
    p, tau = sizes / sizes.sum(), torch.tensor([1.0, 3.0, 5.0, 8.0])
    q, tau_eff = (1 - lr * h) ** tau, float(p @ tau)
    x0 = torch.randn(dim, generator=gen)
    delta1 = (1 - q)[:, None] * (x0 - e)  # round 1: no previous d, c = 0
    d1 = delta1 / (lr * tau[:, None])
    x1 = x0 - tau_eff * (p / tau) @ delta1
    c = p @ d1 - d1  # round 2: c_i = sum_j p_j d_j - d_i
    delta2 = (1 - q)[:, None] * (x1 - e + c / h[:, None])
    d2 = delta2 / (lr * tau[:, None]) - c
    x2 = x1 - tau_eff * (p / tau) @ delta2

    algorithm = fednova.build(setting(vr=True), ctx(dim, m))
    vr = algorithm.corrections[-1]
    objective = Quadratic(h, e)
    got1, _ = quadratic_round(algorithm, objective, x0, lr, taus, sizes, 0)
    torch.testing.assert_close(got1, x1, rtol=0, atol=1e-12)
    torch.testing.assert_close(vr.d_clients, d1, rtol=0, atol=1e-12)
    got2, updates = quadratic_round(algorithm, objective, got1, lr, taus, sizes, 1)
    torch.testing.assert_close(updates.deltas, delta2, rtol=0, atol=1e-12)
    torch.testing.assert_close(got2, x2, rtol=0, atol=1e-12)
    torch.testing.assert_close(vr.d_clients, d2, rtol=0, atol=1e-12)
    torch.testing.assert_close(vr.d_mean, p @ d2, rtol=0, atol=1e-12)
    # the corrections cancel with weights p; the trajectory still differs from plain FedNova's
    torch.testing.assert_close(p @ c, torch.zeros(dim), rtol=0, atol=1e-12)
    plain = fednova.build(setting(), ctx(dim, m))
    y1, _ = quadratic_round(plain, objective, x0, lr, taus, sizes, 0)
    y2, _ = quadratic_round(plain, objective, y1, lr, taus, sizes, 1)
    assert torch.equal(y1, got1)
    assert (y2 - x2).norm() > 1e-3 * (x2 - x1).norm()


@pytest.mark.parametrize("rho,mu", [(0.0, 0.0), (0.9, 0.0), (0.0, 0.5)])
def test_vr_removes_client_drift_on_linear_objectives_with_momentum_and_prox(float64, rho, mu):
    # constant gradients g_i: the correction goes through the momentum buffer (and the proximal
    # recursion) like the gradient, so Delta_i = lr ||a_i||_1 (g_i + c_i) and d_i = g_i exactly.
    # From round 2 on every client then steps along sum_j p_j g_j, whatever its tau_i.
    m, dim, lr = 3, 4, 0.05
    gen = torch.Generator().manual_seed(9)
    g = torch.randn(m, dim, generator=gen)
    objective = Quadratic(torch.zeros(m), torch.zeros(m, dim), b=g)
    taus, sizes = [2, 7, 4], torch.tensor([3.0, 1.0, 2.0])
    p = sizes / sizes.sum()
    norms = torch.tensor([a_norm(t, lr, rho, mu) for t in taus])
    algorithm = fednova.build(setting(momentum=rho, mu=mu, vr=True), ctx(dim, m))
    x = torch.randn(dim, generator=gen)
    for t in range(3):
        x, updates = quadratic_round(algorithm, objective, x, lr, taus, sizes, t, rho)
        normalised = updates.deltas / (lr * norms[:, None])
        torch.testing.assert_close(normalised, g if t == 0 else (p @ g).expand(m, dim), rtol=0, atol=1e-12)
        torch.testing.assert_close(algorithm.corrections[-1].d_clients, g, rtol=0, atol=1e-12)


def test_vr_with_identical_clients_is_plain_fednova(float64):
    m, dim, lr, taus = 4, 3, 0.1, [5, 5, 5, 5]
    gen = torch.Generator().manual_seed(2)
    objective = Quadratic(torch.full((m,), 1.3), torch.randn(1, dim, generator=gen).expand(m, dim))
    sizes = torch.tensor([1.0, 5.0, 2.0, 3.0])
    with_vr, without = fednova.build(setting(vr=True), ctx(dim, m)), fednova.build(setting(), ctx(dim, m))
    x = y = torch.randn(dim, generator=gen)
    for t in range(4):
        x, _ = quadratic_round(with_vr, objective, x, lr, taus, sizes, t)
        y, _ = quadratic_round(without, objective, y, lr, taus, sizes, t)
        vr = with_vr.corrections[-1]
        assert float((vr.d_mean - vr.d_clients).abs().max()) < 1e-15  # next round's corrections are zero
        torch.testing.assert_close(x, y, rtol=0, atol=1e-14)


class CorrectionSpy(GradientCorrection):
    """Records the VR correction each client trained with (placed after it in the list)."""

    def __init__(self, vr):
        self.vr, self.seen = vr, {}

    def begin(self, run):
        self.seen[run.client] = self.vr.current.clone()

    def __call__(self, grad, run):
        pass


def test_vr_corrections_cancel_with_weights_p_in_every_round():
    sizes = [30, 64, 50, 41]  # unequal p_i and unequal steps, real MLP training with momentum
    torch.manual_seed(0)
    n, m = sum(sizes), len(sizes)
    data = TensorDataset(torch.randint(0, 255, (n, 1, 28, 28), dtype=torch.uint8), torch.arange(n) % 7, 0.0, 1.0)
    model = FlatModel(build_model("mlp", "fmnist"), torch.device("cpu"))
    algorithm = fednova.build(setting(momentum=0.9, vr=True), ctx(model.numel, m))
    spy = CorrectionSpy(algorithm.corrections[-1])
    algorithm.corrections.append(spy)
    local, lr, x = LocalSGD(momentum=0.9), 0.02, model.flat.clone()
    p = torch.tensor(sizes, dtype=torch.float32) / sum(sizes)
    for t in range(3):
        deltas, steps, start = [], [], 0
        for c, size in enumerate(sizes):
            result = local.train(
                ClientRun(t, c, model, x, lr),
                data,
                torch.arange(start, start + size),
                1,
                16,
                client_generator(1, t, c),
                algorithm.corrections,
            )
            start += size
            deltas.append(x - model.flat)
            steps.append(result.steps)
        updates = RoundUpdates(
            t,
            torch.arange(m),
            torch.stack(deltas),
            torch.tensor(sizes, dtype=torch.float32),
            torch.tensor(steps, dtype=torch.float32),
            torch.zeros(m),
            lr,
        )
        x = algorithm.server_step(x, updates)
        corrections = torch.stack([spy.seen[c] for c in range(m)])
        if t == 0:
            assert not corrections.any(), "round 1 has no previous d: zero correction"
            continue
        size = corrections.norm(dim=1).max()
        assert size > 0
        assert float((p @ corrections).norm()) < 1e-6 * float(size)
        assert updates.info["vr_correction_norm"] > 0


def test_vr_refuses_partial_participation_before_any_work():
    raw = {
        "dataset": "fmnist",
        "model": "mlp",
        "num_clients": 4,
        "participation": 0.5,
        "algorithm": "fednova",
        "fednova": {"vr": True},
        "partition": {"kind": "iid", "seed": 1},
    }
    with pytest.raises(schema.ConfigError, match=r"fednova\.vr.*participation = 0\.5"):
        settings.resolve(raw)
    assert settings.resolve({**raw, "participation": 1.0})["fednova"]["vr"] is True
    assert settings.resolve({**raw, "fednova": {"vr": False}})["fednova"]["vr"] is False
    both = {**raw, "participation": 1.0, "fednova": {"vr": True, "mu": 0.001}, "client": {"momentum": 0.9}}
    with pytest.raises(
        schema.ConfigError,
        match=r"fednova\.vr = True, fednova\.mu = 0\.001, client\.momentum = 0\.9\)"
        r".*set fednova\.mu or client\.momentum to 0",
    ):
        settings.resolve(both)
    # and the part itself will not average over a partial cohort
    vr = CrossClientVR(4, 2)
    updates = RoundUpdates(
        0, torch.tensor([0, 2]), torch.zeros(2, 2), torch.ones(2), torch.ones(2), torch.zeros(2), 0.1
    )
    with pytest.raises(RuntimeError, match="participation"):
        vr.end_round(updates)


# --------------------------------------------------------------------------- the setting wired to the parts


def _round_updates(t, lr, steps, seed):
    g = torch.Generator().manual_seed(seed)
    sizes = torch.tensor([10.0, 30.0, 20.0], dtype=torch.float64)
    deltas = torch.randn(3, 4, generator=g, dtype=torch.float64)
    return RoundUpdates(t, torch.arange(3), deltas, sizes, torch.tensor(steps, dtype=torch.float64), torch.zeros(3), lr)


def test_build_hands_momentum_tau_eff_and_server_momentum_to_the_papers_step():
    """Client momentum rho with unequal steps (a_i = sum_k (1 - rho^k) / (1 - rho), the paper's closed form),
    tau_eff = sum p_i tau_i as asked, and the code's lr-scaled server momentum over two rounds of different lr."""
    rho, beta, eta_g, steps = 0.5, 0.9, 2.0, [2, 5, 3]
    method = fednova.build(setting(momentum=rho, tau_eff="steps", server_momentum=beta, lr=eta_g), ctx(4, 3))
    assert method.name == "fednova" and not method.corrections  # mu = 0, no VR: FedNova with momentum alone
    a = torch.tensor([sum((1 - rho**k) / (1 - rho) for k in range(1, tau + 1)) for tau in steps], dtype=torch.float64)
    p = torch.tensor([1 / 6, 3 / 6, 2 / 6], dtype=torch.float64)
    tau_eff = float(p @ torch.tensor(steps, dtype=torch.float64))
    x, v = torch.zeros(4, dtype=torch.float64), None
    expected = x.clone()
    for t, lr in enumerate((0.1, 0.05)):
        updates = _round_updates(t, lr, steps, seed=t)
        x = method.server_step(x, updates)
        d = (tau_eff * p / a) @ updates.deltas
        v = d / lr if v is None else beta * v + d / lr
        expected = expected - eta_g * lr * v
        torch.testing.assert_close(x, expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(updates.info["weights"], p, rtol=1e-15, atol=0)
        torch.testing.assert_close(updates.info["a_norm"], a, rtol=1e-12, atol=0)
        torch.testing.assert_close(updates.info["nova_scale"], tau_eff * p / a, rtol=1e-12, atol=0)
        assert updates.info["tau_eff"] == pytest.approx(tau_eff, rel=1e-12)


def test_build_hands_mu_and_an_explicit_tau_eff_to_the_aggregator():
    """FedNova-Prox with tau_eff = sum p_i a_i asked for (its 'auto' would take the steps):
    a_i = (1 - (1 - lr mu)^tau_i) / (lr mu)."""
    mu, lr, steps = 0.1, 0.2, [2, 5, 3]
    method = fednova.build(setting(mu=mu, tau_eff="a_norm"), ctx(4, 3))
    a = torch.tensor([(1 - (1 - lr * mu) ** tau) / (lr * mu) for tau in steps], dtype=torch.float64)
    p = torch.tensor([1 / 6, 3 / 6, 2 / 6], dtype=torch.float64)
    updates = _round_updates(0, lr, steps, seed=3)
    x = method.server_step(torch.zeros(4, dtype=torch.float64), updates)
    torch.testing.assert_close(x, -((p @ a) * p / a) @ updates.deltas, rtol=1e-12, atol=1e-12)


def test_vr_logs_the_weighted_size_of_next_rounds_corrections():
    vr = CrossClientVR(3, 2)
    vr.d_clients = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]], dtype=torch.float64)
    vr.d_mean = torch.zeros(2, dtype=torch.float64)
    updates = _round_updates(0, 0.1, [1, 1, 1], seed=0)
    vr.end_round(updates)
    p = [1 / 6, 3 / 6, 2 / 6]
    mean = [sum(p[i] * float(vr.d_clients[i, k]) for i in range(3)) for k in range(2)]
    assert vr.d_mean.tolist() == pytest.approx(mean, rel=1e-12)
    spread = sum(p[i] * sum((float(vr.d_clients[i, k]) - mean[k]) ** 2 for k in range(2)) ** 0.5 for i in range(3))
    assert updates.info["vr_correction_norm"] == pytest.approx(spread, rel=1e-12)
