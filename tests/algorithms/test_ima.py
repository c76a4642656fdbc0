"""IMA: the window average against hand-computed means, its lr schemes, its checks and its state."""

import pytest
import torch

from fedrepro.algorithms import ima
from fedrepro.configure import schema, settings
from fedrepro.parts import Algorithm, ClientPlan, RoundUpdates
from fedrepro.run import checkpoint
from fedrepro.server import ServerSGD, WeightedMean

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats


def at_round(t):
    return RoundUpdates(t, torch.tensor([0]), torch.zeros(1, 3), torch.ones(1), torch.ones(1), torch.zeros(1), 0.1)


def aggregates(n=12):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(3, generator=g, dtype=torch.float64) for _ in range(n)]


def test_window_of_one_changes_nothing():
    hook = ima.WindowAverage(window=1, start=0)
    for t, w in enumerate(aggregates()):
        assert torch.equal(hook(w, at_round(t)), w)


@pytest.mark.parametrize("window,start", [(3, 3), (4, 6), (5, 5)])
def test_window_is_the_mean_of_the_last_k_aggregates(window, start):
    hook = ima.WindowAverage(window, start)
    seen = aggregates()
    for t, w in enumerate(seen):
        out = hook(w, at_round(t))
        if t < start:
            assert torch.equal(out, w)
        else:  # the window includes aggregates from before t_s and never IMA's own outputs
            expected = sum(seen[t - window + 1 : t + 1]) / window
            assert torch.allclose(out, expected, rtol=0, atol=1e-14)


def test_window_survives_a_checkpoint(tmp_path):
    seen = aggregates()
    a = ima.WindowAverage(4, 5)
    for t in range(6):
        a(seen[t], at_round(t))
    checkpoint.save(a.state_dict(), tmp_path / "ima.pt")
    b = ima.WindowAverage(4, 5)
    b.load_state_dict(checkpoint.load(tmp_path / "ima.pt"))
    for t in range(6, 12):
        assert torch.equal(a(seen[t], at_round(t)), b(seen[t], at_round(t)))


def setting(**ima_keys):
    return settings.resolve(
        {
            "algorithm": "fedavg+ima",
            "rounds": 100,
            "local_epochs": 5,
            "client": {"lr": 0.01, "lr_decay": 0.99},
            "ima": ima_keys,
        }
    )


def applied(s):
    algorithm = Algorithm("fedavg", WeightedMean(), ServerSGD(1.0))
    ima.apply(algorithm, s, None)
    return algorithm


def test_exponential_decay_is_the_reference_codes():
    alg = applied(setting(start_round=60))
    for t in (0, 30, 59):
        assert alg.client_plan.lr_schedule(t) == pytest.approx(0.01 * 0.99**t)
    for t in (60, 61, 99):
        assert alg.client_plan.lr_schedule(t) == pytest.approx(0.01 * 0.99**60 * 0.97 ** (t - 60))


def test_default_start_is_three_quarters_of_the_rounds():
    s = setting()
    # resolved before the run is named: an unset start and an explicit 0.75 R are one run
    assert s["ima"]["start_round"] == 75
    assert settings.resolve({**s, "ima": {**s["ima"], "start_round": None}}) == s


def test_other_decay_schemes():
    start, lr_start = 60, 0.01 * 0.99**60
    const = applied(setting(start_round=start, decay="constant"))
    assert (
        const.client_plan.lr_schedule(59) == pytest.approx(0.01 * 0.99**59)
        and const.client_plan.lr_schedule(70) == 5e-5
    )
    # SWA: (1 - f) lr_max + f lr_min with f = (k + 1) / c at position k of the cycle; lr_max is the paper's
    # 1e-2 by default, the lr at t_s (the code's) with cyclic_lr_max: null
    for top, cyclic_lr_max in ((0.01, 0.01), (lr_start, None)):
        resolved = setting(start_round=start, decay="cyclic", cycle_rounds=4, cyclic_lr_max=cyclic_lr_max)
        # null is resolved before the run is named, to the lr at t_s of the client schedule the run trains with
        assert resolved["ima"]["cyclic_lr_max"] == top
        cyclic = applied(resolved)
        assert [cyclic.client_plan.lr_schedule(t) for t in range(60, 65)] == pytest.approx(
            [0.75 * top + 0.25 * 5e-5, 0.5 * top + 0.5 * 5e-5, 0.25 * top + 0.75 * 5e-5, 5e-5, 0.75 * top + 0.25 * 5e-5]
        )
    none = applied(setting(start_round=start, decay="none"))
    assert none.client_plan.lr_schedule(90) == pytest.approx(0.01 * 0.99**90)
    epoch = applied(setting(start_round=start, decay="epoch", cycle_rounds=20))
    assert epoch.client_plan.lr_schedule(90) == pytest.approx(0.01 * 0.99**90)
    assert [epoch.client_plan.local_epochs(t, 0) for t in (59, 60, 79, 80, 100, 140)] == [5, 5, 5, 4, 3, 1]


@pytest.mark.parametrize(
    "keys,message",
    [
        ({"start_round": 100}, r"rounds = 100, ima.start_round = 100\).*IMA would never start"),
        ({"start_round": 3, "window": 5}, r"ima.window = 5, ima.start_round = 3.*the window would not be full"),
    ],
)
def test_inconsistent_keys_are_refused_by_name(keys, message):
    with pytest.raises(schema.ConfigError, match=message):
        setting(**keys)


def test_before_the_start_round_ima_keeps_the_hosts_whole_lr_schedule_milestones_included():
    from fedrepro import algorithms
    from fedrepro.configure import settings
    from fedrepro.parts import lr_schedule

    setting = settings.resolve(
        {
            "algorithm": "fedavg+ima",
            "rounds": 100,
            "ima": {"start_round": 80, "window": 5},
            "client": {"lr": 0.1, "lr_decay": 1.0, "lr_milestones": [0.5]},
        }
    )
    algo = algorithms.build(setting, 4, 3, torch.device("cpu"), torch.ones(4))
    assert algo.client_plan.lr_schedule(49) == lr_schedule(setting)(49) == 0.1
    assert algo.client_plan.lr_schedule(50) == lr_schedule(setting)(50) == pytest.approx(0.01)


def test_the_applied_window_averages_from_the_start_round_and_logs_active_and_shift():
    (hook,) = applied(setting(start_round=4, window=3)).post_steps  # window and start from the setting
    seen = aggregates(8)
    for t, w in enumerate(seen):
        updates = at_round(t)
        out = hook(w, updates)
        if t < 4:
            assert torch.equal(out, w) and "ima_active" not in updates.info and "ima_shift" not in updates.info
            continue
        expected = sum(seen[t - 2 : t + 1]) / 3  # float64: a mean of three, rounding far below 1e-14
        assert torch.allclose(out, expected, rtol=0, atol=1e-14)
        assert updates.info["ima_active"] == 1
        assert updates.info["ima_shift"] == pytest.approx(float((expected - w).norm()), rel=1e-12)


def test_the_cyclic_phase_counts_from_the_start_round():
    # 2 t_s is no multiple of the cycle here, so counting from -t_s or +t_s would give another phase
    cyclic = applied(setting(start_round=61, decay="cyclic", cycle_rounds=4, cyclic_lr_max=0.01))
    top, low = 0.01, 5e-5
    assert [cyclic.client_plan.lr_schedule(t) for t in range(61, 66)] == pytest.approx(
        [0.75 * top + 0.25 * low, 0.5 * top + 0.5 * low, 0.25 * top + 0.75 * low, low, 0.75 * top + 0.25 * low]
    )


def test_an_unknown_decay_scheme_is_named():
    schedule = ima.lr_schedule(lambda t: 0.1, {"decay": "bogus"}, 0)
    with pytest.raises(ValueError, match=r"ima.decay = 'bogus' is unknown"):
        schedule(1)


def test_epoch_decay_takes_from_the_hosts_own_epochs_of_each_round_and_client():
    host = lambda t, client: 2 + client + t % 3  # noqa: E731 - a host plan that varies by round and client
    algorithm = Algorithm("fedavg", WeightedMean(), ServerSGD(1.0), client_plan=ClientPlan(local_epochs=host))
    ima.apply(algorithm, setting(start_round=60, decay="epoch", cycle_rounds=20), None)
    for t in (10, 59, 60, 79, 80, 101, 140):
        drop = 0 if t < 60 else (t - 60) // 20
        for client in (0, 4):
            assert algorithm.client_plan.local_epochs(t, client) == max(1, host(t, client) - drop)


def test_a_fork_needs_exactly_the_hosts_last_window_minus_one_models():
    seen = aggregates(8)
    forked = ima.WindowAverage(4, 5)
    forked.start_from_fork(seen[2:5])  # exactly P - 1 = 3 models: enough
    through = ima.WindowAverage(4, 5)
    for t in range(5):
        through(seen[t], at_round(t))
    for t in range(5, 8):
        assert torch.equal(forked(seen[t], at_round(t)), through(seen[t], at_round(t)))
    with pytest.raises(
        ValueError, match=r"window 4 needs the host's last 3 models at the fork round; the fork state holds 2"
    ):
        ima.WindowAverage(4, 5).start_from_fork(seen[3:5])
