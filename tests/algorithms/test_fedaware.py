"""FedAWARE: the min-norm solver against an exact QP, the momenta, the xAWARE projection, and state."""

import itertools

import numpy as np
import pytest
import torch

from fedrepro.algorithms.aware import ProjectOntoAware, project
from fedrepro.algorithms.fedaware import AwareAggregator, ClientMomenta
from fedrepro.configure import schema, settings
from fedrepro.minnorm import min_norm_weights
from fedrepro.parts import RoundUpdates
from fedrepro.run import checkpoint
from fedrepro.server import ServerSGD

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats


def exact_min_norm(gram: np.ndarray) -> float:
    """Exact QP by enumerating supports: on each support S the KKT system of
    min l^T M_SS l s.t. sum l = 1 is linear; keep the feasible (l >= 0) solutions, take the least."""
    n, best = len(gram), np.inf
    for r in range(1, n + 1):
        for support in itertools.combinations(range(n), r):
            s = list(support)
            kkt = np.zeros((r + 1, r + 1))
            kkt[:r, :r], kkt[:r, r], kkt[r, :r] = 2 * gram[np.ix_(s, s)], 1.0, 1.0
            rhs = np.zeros(r + 1)
            rhs[r] = 1.0
            try:
                sol = np.linalg.solve(kkt, rhs)
            except np.linalg.LinAlgError:
                continue
            lam = sol[:r]
            if (lam >= -1e-12).all() and np.allclose(kkt @ sol, rhs):
                best = min(best, float(lam @ gram[np.ix_(s, s)] @ lam))
    return best


def instances():
    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        n, p = 2 + trial % 5, 3 + trial % 7
        v = torch.randn(n, p, generator=g, dtype=torch.float64)
        kind = ["random", "duplicate", "collinear", "zero", "shifted"][trial % 5]
        if kind == "duplicate":
            v[1] = v[0]
        elif kind == "collinear":
            v[1] = -2.5 * v[0]  # 0 = (2.5 v0 + v1) / 3.5 lies in the hull
        elif kind == "zero":
            v[-1] = 0
        elif kind == "shifted":  # all vectors share a large common component: 0 is far from the hull
            v = v + 4 * torch.randn(1, p, generator=g, dtype=torch.float64)
        yield kind, v


@pytest.mark.parametrize("kind,v", list(instances()))
def test_min_norm_matches_exact_qp(kind, v):
    gram = v @ v.T
    result = min_norm_weights(gram, max_iter=5000, tol=1e-12)
    lam = result.weights
    assert lam.min() >= 0 and abs(float(lam.sum()) - 1) < 1e-12
    assert abs(result.value - float(lam @ gram @ lam)) < 1e-10
    assert result.value == pytest.approx(exact_min_norm(gram.numpy()), abs=1e-9)
    # KKT: every vertex's gradient entry is >= the value, with equality on the support
    u = gram @ lam
    assert float(u.min()) >= result.value - 1e-8
    assert float(u[lam > 1e-9].max()) <= result.value + 1e-8


def test_min_norm_degenerate_cases_by_hand():
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    assert min_norm_weights(v @ v.T).weights.tolist() == pytest.approx([0.5, 0.5])
    v = torch.tensor([[2.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)  # 0 = (v0 + 2 v1) / 3
    r = min_norm_weights(v @ v.T, tol=1e-14)
    assert r.weights.tolist() == pytest.approx([1 / 3, 2 / 3]) and r.value == pytest.approx(0, abs=1e-14)
    v = torch.tensor([[1.0, 1.0], [0.0, 0.0], [3.0, -1.0]], dtype=torch.float64)
    assert min_norm_weights(v @ v.T).weights.tolist() == [0.0, 1.0, 0.0]


def updates_for(t, clients, deltas, sizes=None):
    k = len(clients)
    sizes = torch.ones(k, dtype=deltas.dtype) if sizes is None else sizes
    return RoundUpdates(t, torch.tensor(clients), deltas, sizes, torch.ones(k), torch.zeros(k), 0.1)


def test_momenta_update_only_sampled_clients():
    m = ClientMomenta(3, 2, "cpu", alpha=0.25, normalize=False, warmup=True)
    m.update(updates_for(0, [0, 2], torch.tensor([[4.0, 0.0], [0.0, 8.0]])))
    m.update(updates_for(1, [0, 1], torch.tensor([[8.0, 4.0], [2.0, 2.0]])))
    # m0 = 0.75 * (0.25 * [4, 0]) + 0.25 * [8, 4]; m1 = 0.25 * [2, 2]; m2 stale at 0.25 * [0, 8]
    assert m.momenta.tolist() == [[2.75, 1.0], [0.5, 0.5], [0.0, 2.0]]
    assert m.ready


def test_fedaware_warms_up_with_fedavg_then_takes_the_min_norm_point():
    agg = AwareAggregator(ClientMomenta(3, 2, "cpu", alpha=1.0, normalize=True, warmup=True))
    x = torch.zeros(2)
    d = agg(x, updates_for(0, [0, 1], torch.tensor([[2.0, 0.0], [0.0, 4.0]]), torch.tensor([1.0, 3.0])))
    assert d.tolist() == [0.5, 3.0]  # FedAvg: weights 1/4, 3/4
    info = updates_for(1, [2], torch.tensor([[-3.0, 0.0]]))
    d = agg(x, info)
    # unit momenta e2, -e1 (client 0 is e1 too): 0 = (e1 + (-e1)) / 2 is in the hull
    assert d.norm() < 1e-6 and info.info["aware_warmup"] == 0


def test_fedaware_without_warmup_uses_the_clients_seen_so_far():
    agg = AwareAggregator(ClientMomenta(4, 2, "cpu", alpha=1.0, normalize=False, warmup=False))
    d = agg(torch.zeros(2), updates_for(0, [0, 1], torch.tensor([[2.0, 0.0], [0.0, 2.0]])))
    assert d.tolist() == pytest.approx([1.0, 1.0])  # min-norm of {2 e1, 2 e2}; clients 2, 3 unseen


def test_normalize_changes_lambda_not_only_the_scale():
    raw = ClientMomenta(2, 2, "cpu", alpha=1.0, normalize=False, warmup=True)
    unit = ClientMomenta(2, 2, "cpu", alpha=1.0, normalize=True, warmup=True)
    for m in (raw, unit):
        m.update(updates_for(0, [0, 1], torch.tensor([[4.0, 0.0], [0.0, 1.0]])))
    assert raw.direction({}).tolist() == pytest.approx([4 / 17, 16 / 17])  # min-norm of 4 e1, e2
    assert unit.direction({}).tolist() == pytest.approx([0.5, 0.5])  # min-norm of e1, e2


def test_projection_of_d_onto_itself_is_d():
    d = torch.randn(50, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert torch.allclose(project(d, d), d)
    assert torch.allclose(project(-3 * d, d), -3 * d)


def ready_projector(host, alpha=0.5):
    momenta = ClientMomenta(3, 4, "cpu", alpha=alpha, normalize=True, warmup=True, dtype=torch.float64)
    return ProjectOntoAware(host, momenta)


def test_aware_on_fedavg_steps_along_d_with_the_projected_length():
    g = torch.Generator().manual_seed(2)
    deltas = torch.randn(3, 4, generator=g, dtype=torch.float64)
    u = updates_for(0, [0, 1, 2], deltas, torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64))
    x = torch.randn(4, generator=g, dtype=torch.float64)
    opt = ready_projector(ServerSGD(lr=0.7))
    x_new = opt(x, u.weighted_mean(), u)
    unit = deltas / deltas.norm(dim=1, keepdim=True)
    lam = min_norm_weights(unit @ unit.T, tol=1e-14).weights
    d = lam @ unit
    step = x - x_new
    assert abs(float(torch.nn.functional.cosine_similarity(step, d, dim=0))) == pytest.approx(1.0)
    expected = (0.7 * u.weighted_mean()).dot(d) / d.dot(d) * d
    assert torch.allclose(step, expected, atol=1e-9)


def test_aware_keeps_the_host_momentum_unprojected_and_skips_warmup():
    host = ServerSGD(lr=1.0, momentum=0.9)
    opt = ready_projector(host)
    x = torch.zeros(4, dtype=torch.float64)
    d1 = torch.tensor([1.0, 0, 0, 0], dtype=torch.float64)
    u = updates_for(0, [0, 1], torch.eye(4, dtype=torch.float64)[:2])
    assert torch.equal(opt(x, d1, u), x - d1)  # client 2 unseen: the host's own step
    d2 = torch.tensor([0, 2.0, 0, 0], dtype=torch.float64)
    u = updates_for(1, [2], torch.tensor([[0, 0, 3.0, 0]], dtype=torch.float64))
    opt(x, d2, u)
    assert torch.equal(host.velocity, 0.9 * d1 + d2)


def test_aware_is_refused_for_feddyn():
    with pytest.raises(schema.ConfigError, match="aware.*feddyn"):
        settings.resolve({"algorithm": "feddyn+aware"})


def test_momenta_and_host_state_survive_a_checkpoint(tmp_path):
    g = torch.Generator().manual_seed(3)
    rounds = [
        updates_for(
            t, sorted(np.random.default_rng(t).choice(4, 2, replace=False).tolist()), torch.randn(2, 5, generator=g)
        )
        for t in range(6)
    ]

    def fresh():
        return ProjectOntoAware(
            ServerSGD(lr=1.0, momentum=0.5), ClientMomenta(4, 5, "cpu", alpha=0.3, normalize=False, warmup=True)
        )

    def step(opt, x, u):
        return opt(x, u.weighted_mean(), u)

    a, x = fresh(), torch.zeros(5)
    for u in rounds[:3]:
        x = step(a, x, u)
    checkpoint.save(a.state_dict(), tmp_path / "state.pt")
    b = fresh()
    b.load_state_dict(checkpoint.load(tmp_path / "state.pt"))
    xa = xb = x
    for u in rounds[3:]:
        xa, xb = step(a, xa, u), step(b, xb, u)
    assert torch.equal(xa, xb)
    assert torch.equal(a.momenta.momenta, b.momenta.momenta)
