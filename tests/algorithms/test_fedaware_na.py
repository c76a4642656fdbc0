"""FedAWARE-NA (FedAWARE Fig. 4): the clients' moving-averaged updates with static data-size
weights in place of the min-norm solve, checked against a case computed by hand."""

from __future__ import annotations

import pytest
import torch

from fedrepro import algorithms, identity
from fedrepro.algorithms.fedaware import AwareAggregator, ClientMomenta
from fedrepro.configure import schema, settings
from fedrepro.parts import RoundUpdates

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats


def updates(t, clients, deltas, sizes):
    k = len(clients)
    return RoundUpdates(
        t, torch.tensor(clients), torch.tensor(deltas), torch.tensor(sizes), torch.ones(k), torch.zeros(k), 0.1
    )


def test_static_weights_average_the_momenta_of_all_clients_seen_by_data_size():
    m = ClientMomenta(3, 2, "cpu", alpha=0.5, normalize=True, warmup=False, weights="static")
    agg = AwareAggregator(m)
    x = torch.zeros(2)
    # round 0: m0 = 0.5 [2, 0] = [1, 0], m1 = 0.5 [0, 4] = [0, 2]; n = 10, 30 (client 2 unseen)
    r0 = updates(0, [0, 1], [[2.0, 0.0], [0.0, 4.0]], [10.0, 30.0])
    d = agg(x, r0)
    assert d.tolist() == pytest.approx([10 / 40 * 1, 30 / 40 * 2])  # [0.25, 1.5]
    assert r0.info["lambda"].tolist() == pytest.approx([0.25, 0.75, 0.0])
    # round 1: m1 = 0.5 [0, 2] + 0.5 [0, 0] = [0, 1], m2 = 0.5 [4, 4] = [2, 2]; m0 stale at [1, 0]
    r1 = updates(1, [1, 2], [[0.0, 0.0], [4.0, 4.0]], [30.0, 60.0])
    d = agg(x, r1)
    # p = (10, 30, 60) / 100 over every client seen, stale ones included; raw (unnormalised) momenta
    assert d.tolist() == pytest.approx([0.1 * 1 + 0.6 * 2, 0.3 * 1 + 0.6 * 2])  # [1.3, 1.5]
    assert r1.info["support"] == 3


def test_static_is_not_the_min_norm_point():
    # The same momenta under FedAWARE's min-norm weights: {[1, 0], [0, 2]} unit-normalised -> e1, e2,
    # min-norm point [0.5, 0.5], rescaled per client: lambda_i / ||m_i|| m_i = [0.5, 0.5].
    r = [updates(0, [0, 1], [[2.0, 0.0], [0.0, 4.0]], [10.0, 30.0])]
    minnorm = ClientMomenta(2, 2, "cpu", alpha=0.5, normalize=True, warmup=True)
    static = ClientMomenta(2, 2, "cpu", alpha=0.5, normalize=True, warmup=True, weights="static")
    for m in (minnorm, static):
        m.update(r[0])
    assert minnorm.direction({}).tolist() == pytest.approx([0.5, 0.5])
    assert static.direction({}).tolist() == pytest.approx([0.25, 1.5])


def test_warmup_still_takes_fedavg_steps_until_every_client_was_seen():
    agg = AwareAggregator(ClientMomenta(3, 2, "cpu", alpha=0.5, normalize=True, warmup=True, weights="static"))
    r = updates(0, [0, 1], [[2.0, 0.0], [0.0, 4.0]], [10.0, 30.0])
    assert agg(torch.zeros(2), r).tolist() == pytest.approx([0.5, 3.0])  # the cohort's FedAvg of the deltas
    assert r.info["aware_warmup"] == 1


def test_sizes_survive_a_checkpoint():
    a = ClientMomenta(3, 2, "cpu", alpha=0.5, normalize=True, warmup=False, weights="static")
    a.update(updates(0, [0, 2], [[2.0, 0.0], [0.0, 4.0]], [10.0, 30.0]))
    b = ClientMomenta(3, 2, "cpu", alpha=0.5, normalize=True, warmup=False, weights="static")
    b.load_state_dict({k: v.clone() for k, v in a.state_dict().items()})
    assert torch.equal(a.direction({}), b.direction({}))
    assert torch.equal(b.sizes, torch.tensor([10.0, 0.0, 30.0])) and b.sizes.data_ptr() != a.sizes.data_ptr()
    # a checkpoint written before FedAWARE-NA holds no sizes: the min-norm method (which never reads them)
    # resumes from it with its momenta and seen clients restored and the same direction
    old = ClientMomenta(3, 2, "cpu", alpha=0.5, normalize=True, warmup=False)
    old.load_state_dict({"momenta": a.momenta.clone(), "seen": a.seen.clone()})
    assert torch.equal(old.momenta, a.momenta) and torch.equal(old.seen, a.seen)
    assert torch.equal(old.sizes, torch.zeros(3))
    fresh = ClientMomenta(3, 2, "cpu", alpha=0.5, normalize=True, warmup=False)
    fresh.update(updates(0, [0, 2], [[2.0, 0.0], [0.0, 4.0]], [10.0, 30.0]))
    assert torch.equal(old.direction({}), fresh.direction({}))


def test_setting_reaches_the_aggregator_and_leaves_other_hashes_alone():
    plain = settings.resolve({"algorithm": "fedaware"})
    na = settings.resolve({"algorithm": "fedaware", "fedaware": {"weights": "static"}})
    # the trainer reads minnorm; the name leaves the default out, as before the key existed
    assert plain["fedaware"]["weights"] == "minnorm" and "weights" not in identity.identity_setting(plain)["fedaware"]
    assert identity.run_id(plain) != identity.run_id(na)
    algo = algorithms.build(na, 3, 2, torch.device("cpu"), torch.tensor([10.0, 30.0, 60.0]))
    assert algo.aggregator.momenta.weights == "static"
    with pytest.raises(schema.ConfigError, match="weights"):
        settings.resolve({"algorithm": "fedaware", "fedaware": {"weights": "uniform"}})
    with pytest.raises(schema.ConfigError, match="weights"):
        settings.resolve({"algorithm": "fedavg+aware", "aware": {"weights": "static"}})
    with pytest.raises(ValueError, match="minnorm or static"):
        ClientMomenta(2, 2, "cpu", 0.5, True, True, weights="uniform")
