"""FedAWARE and the +aware plug-in as a setting builds them: every key of the section reaches the momenta and
the solver, the server lr and the host reach the step, and what a round logs is what the formulas give."""

import pytest
import torch

from fedrepro import algorithms
from fedrepro.algorithms.aware import ProjectOntoAware, project
from fedrepro.algorithms.fedaware import AwareAggregator, ClientMomenta
from fedrepro.configure import settings
from fedrepro.minnorm import min_norm_weights
from fedrepro.parts import RoundUpdates

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

# every key away from its default, so a key dropped or swapped on the way shows
SECTION = {"alpha": 0.3, "normalize": False, "warmup": False, "fw_max_iter": 7, "fw_tol": 0.05}


def updates_for(t, clients, deltas, sizes=None, lr=0.1):
    k = len(clients)
    sizes = torch.ones(k, dtype=deltas.dtype) if sizes is None else sizes
    return RoundUpdates(t, torch.tensor(clients), deltas, sizes, torch.full((k,), 3.0), torch.zeros(k), lr)


def build(setting: dict, num_clients=3, dim=2):
    resolved = settings.resolve({"num_clients": num_clients, **setting})
    return algorithms.build(resolved, num_clients, dim, torch.device("cpu"), torch.ones(num_clients))


def momenta_keys(m: ClientMomenta) -> dict:
    return {"alpha": m.alpha, "normalize": m.normalize, "warmup": m.warmup, "fw_max_iter": m.max_iter, "fw_tol": m.tol}


def test_fedaware_is_built_from_its_section_and_the_server_lr():
    algo = build({"algorithm": "fedaware", "fedaware": {**SECTION, "weights": "static"}, "server": {"lr": 0.7}})
    assert algo.name == "fedaware"
    assert isinstance(algo.aggregator, AwareAggregator)
    assert momenta_keys(algo.aggregator.momenta) == SECTION and algo.aggregator.momenta.weights == "static"
    x, d = torch.tensor([1.0, 2.0]), torch.tensor([0.5, -1.0])
    assert torch.equal(algo.optimizer(x, d, updates_for(0, [0], d[None])), x - 0.7 * d)


def test_the_aware_plugin_wraps_the_hosts_optimizer_with_its_own_section():
    algo = build({"algorithm": "fedavgm+aware", "aware": SECTION, "fedavgm": {"momentum": 0.6}})
    assert algo.name == "fedavgm"
    assert isinstance(algo.optimizer, ProjectOntoAware)
    assert momenta_keys(algo.optimizer.momenta) == SECTION
    assert algo.optimizer.momenta.weights == "minnorm"  # the projection is AWARE's min-norm direction
    assert algo.optimizer.host.momentum == 0.6


def test_a_host_that_reads_the_round_gets_it_through_the_projection():
    """FedNova's server step divides by the round's client lr (d / eta_l), so the projector must hand the host
    the round's updates; one ready round of fednova+aware against the host's own step projected by hand."""
    nova = {"fednova": {"server_momentum": 0.9}, "server": {"lr": 1.0}}  # the momentum form reads the round's lr
    algo = build({"algorithm": "fednova+aware", "aware": {**SECTION, "alpha": 1.0}, **nova})
    deltas = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    u = updates_for(0, [0, 1, 2], deltas, lr=0.25)
    x = torch.tensor([0.5, 0.5])
    d_host = algo.aggregator(x, u)
    x_host = build({"algorithm": "fednova", **nova}).optimizer(x, d_host, u)
    d = min_norm_weights(deltas @ deltas.T, 7, 0.05).weights.float() @ deltas
    expected = x - (x - x_host).dot(d) / d.dot(d) * d
    torch.testing.assert_close(algo.optimizer(x, d_host, u), expected)


def test_projection_onto_a_zero_direction_is_no_step():
    """0 in the hull: AWARE sees no common direction, and the projected step is 0, not 0/0."""
    info = {}
    assert torch.equal(project(torch.tensor([1.0, 2.0]), torch.zeros(2), info), torch.zeros(2))
    assert info["aware_scale"] == 0.0


def test_the_projections_cosine_is_exact_for_short_vectors():
    """The cosine's guard against 0/0 must not bound small norms: |step| |d| = 1.4e-6 here."""
    info = {}
    project(torch.tensor([1e-3, 0.0], dtype=torch.float64), torch.tensor([1e-3, 1e-3], dtype=torch.float64), info)
    assert info["aware_cosine"] == pytest.approx(2**-0.5, rel=1e-12)
    assert info["aware_scale"] == pytest.approx(0.5, rel=1e-12)


def test_fedaware_nas_support_counts_the_clients_seen():
    m = ClientMomenta(4, 2, "cpu", alpha=1.0, normalize=False, warmup=False, weights="static")
    m.update(updates_for(0, [1, 3], torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([1.0, 3.0])))
    info = {}
    assert m.direction(info).tolist() == [0.25, 0.75]
    assert info["support"] == 2 and info["lambda"].tolist() == [0.0, 0.25, 0.0, 0.75]


def test_the_projection_logs_its_scale_cosine_and_the_directions_solve():
    momenta = ClientMomenta(4, 3, "cpu", alpha=1.0, normalize=False, warmup=False, dtype=torch.float64)
    host = algorithms.build(settings.resolve({"algorithm": "fedavg", "num_clients": 4}), 4, 3, "cpu", torch.ones(4))
    opt = ProjectOntoAware(host.optimizer, momenta)
    # client 1's momentum is the hull's min-norm point on its own: the others get weight 0, client 3 is unseen
    deltas = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [3.0, -1.0, 2.0]], dtype=torch.float64)
    u = updates_for(0, [0, 1, 2], deltas)
    x = torch.zeros(3, dtype=torch.float64)
    assert torch.equal(opt(x, torch.zeros(3, dtype=torch.float64), u), x)
    info = u.info
    assert info["aware_projected"] == 1 and info["aware_support"] == 1
    assert info["aware_lambda"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert info["aware_min_norm_sq"] == 0.0 and info["aware_fw_iters"] >= 0 and info["aware_fw_gap"] >= 0

    g = torch.Generator().manual_seed(4)
    deltas = torch.randn(3, 3, generator=g, dtype=torch.float64) + torch.tensor([3.0, 0.0, 0.0], dtype=torch.float64)
    u = updates_for(1, [0, 1, 2], deltas)
    step = torch.randn(3, generator=g, dtype=torch.float64)
    opt(x, step, u)  # ServerSGD at lr 1: the host's step is `step`
    solved = min_norm_weights(deltas @ deltas.T, 1000, 1e-6)
    d = solved.weights @ deltas
    assert u.info["aware_scale"] == pytest.approx(float(step.dot(d) / d.dot(d)), rel=1e-12)
    assert u.info["aware_cosine"] == pytest.approx(float(step.dot(d) / (step.norm() * d.norm())), rel=1e-12)
    assert u.info["aware_min_norm_sq"] == pytest.approx(solved.value, rel=1e-12)
    assert u.info["aware_fw_iters"] == solved.iterations and u.info["aware_support"] == int((solved.weights > 0).sum())
    assert u.info["aware_fw_gap"] == pytest.approx(solved.gap, rel=1e-9, abs=1e-15)


def test_the_projection_logs_that_it_did_not_project_before_the_momenta_are_ready():
    host = algorithms.build(settings.resolve({"algorithm": "fedavg", "num_clients": 3}), 3, 2, "cpu", torch.ones(3))
    opt = ProjectOntoAware(host.optimizer, ClientMomenta(3, 2, "cpu", alpha=0.5, normalize=True, warmup=True))
    u = updates_for(0, [0], torch.tensor([[1.0, 0.0]]))
    opt(torch.zeros(2), torch.tensor([1.0, 0.0]), u)
    assert u.info["aware_projected"] == 0 and "aware_lambda" not in u.info


def test_fedawares_warmup_round_logs_fedavgs_weights_and_its_aware_rounds_the_solve():
    f64 = torch.float64
    momenta = ClientMomenta(2, 2, "cpu", alpha=1.0, normalize=True, warmup=True, max_iter=3, tol=0.5, dtype=f64)
    agg = AwareAggregator(momenta)
    u = updates_for(0, [0], torch.tensor([[2.0, 0.0]], dtype=f64), torch.tensor([3.0], dtype=f64))
    agg(torch.zeros(2, dtype=f64), u)
    assert u.info["aware_warmup"] == 1 and u.info["weights"].tolist() == [1.0]
    u = updates_for(1, [1], torch.tensor([[1.0, 3.0]], dtype=f64))
    agg(torch.zeros(2, dtype=f64), u)
    unit = torch.tensor([[1.0, 0.0], [1.0 / 10**0.5, 3.0 / 10**0.5]], dtype=f64)
    solved = min_norm_weights(unit @ unit.T, 3, 0.5)
    assert u.info["lambda"].tolist() == pytest.approx(solved.weights.tolist())
    assert u.info["fw_iters"] == solved.iterations and u.info["min_norm_sq"] == pytest.approx(solved.value)
    assert u.info["support"] == int((solved.weights > 0).sum()) and u.info["fw_gap"] == pytest.approx(solved.gap)


def test_the_solvers_tolerance_and_iteration_cap_reach_it():
    """A loose tolerance stops Frank-Wolfe early: the weights differ from the default tolerance's."""
    g = torch.Generator().manual_seed(5)
    rows = torch.randn(6, 8, generator=g, dtype=torch.float64) + 1.0
    loose, default = min_norm_weights(rows @ rows.T, 1000, 0.5), min_norm_weights(rows @ rows.T)
    assert not torch.equal(loose.weights, default.weights)  # the check below can fail
    m = ClientMomenta(6, 8, "cpu", alpha=1.0, normalize=False, warmup=True, tol=0.5, dtype=torch.float64)
    m.update(updates_for(0, list(range(6)), rows))
    info = {}
    torch.testing.assert_close(m.direction(info), loose.weights @ rows, rtol=0, atol=0)
    assert info["fw_iters"] == loose.iterations


def test_a_zero_momentum_is_left_unscaled_by_normalize():
    """A client whose momentum is 0 puts 0 in the hull: the direction is 0 and its weight 1, not 0/0."""
    m = ClientMomenta(2, 2, "cpu", alpha=1.0, normalize=True, warmup=True, dtype=torch.float64)
    m.update(updates_for(0, [0, 1], torch.tensor([[1.0, 2.0], [0.0, 0.0]], dtype=torch.float64)))
    info = {}
    assert torch.equal(m.direction(info), torch.zeros(2, dtype=torch.float64))
    assert info["lambda"].tolist() == [0.0, 1.0]
