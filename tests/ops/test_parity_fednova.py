"""FedNova's training script at Table I's other settings in the round check (fedrepro.parity.rounds_fednova_script,
docs/parity.md): the command line a fedrepro setting becomes, the two server-step bounds against float32 steps
written out here from the code's formulas (the new global model of FedAvg/FedProx, FedNova's server momentum),
each seen to fail on a term 1% off; and, where FEDREPRO_FEDNOVA_CHECKOUT names a checkout of JYWa/FedNova, the
script's own rounds (gloo processes on one thread, a minute or two a case) with one term broken on our side."""

from __future__ import annotations

import os

import pytest
import torch

from fedrepro.parity import clients_fednova, rounds_fednova_script as script
from fedrepro.parity.clients import EPS32, merged

FEDNOVA = os.environ.get("FEDREPRO_FEDNOVA_CHECKOUT")
needs_checkout = pytest.mark.skipif(not FEDNOVA, reason="FEDREPRO_FEDNOVA_CHECKOUT (JYWa/FedNova) is not set")


def _cases():
    """The three cases these tests break terms of: FedAvg with momentum and FedProx at E_i = 2, FedNova with server
    momentum at U(2,5)."""
    rows = script.script_cases()
    return {
        "fedavg": rows[(script.E2, "fedavg", 0.9, 0.0, 0.0)],
        "fedprox": rows[(script.E2, "fedprox", 0.0, 0.0, 0.0)],
        "fednova": rows[(script.U25, "fednova", 0.0, 0.9, 0.0)],
    }


def test_every_row_of_table_one_the_script_has_is_a_case():
    """Every U(2,5) row but SCAFFOLD and FedNova-VR (not in the script), and FedAvg with momentum and FedProx at
    E_i = 2 (the FedNova cases hold its other E_i = 2 rows): one case a row, each with its own label."""
    cases = script.script_cases()
    assert sorted(cases) == sorted(script.CASES) and len(script.script_settings()) == 10
    for (experiment, algorithm, momentum, gmf, mu), (label, s) in cases.items():
        assert (s["algorithm"], s["client"]["momentum"]) == (algorithm, momentum)
        assert ("random_epochs" in s["plugins"]) == (experiment == script.U25) == ("U(2,5)" in label)
        if algorithm == "fednova":
            assert (s["fednova"]["server_momentum"], s["fednova"]["mu"]) == (gmf, mu)
            argv = script.script_argv(s, 3, 0, "/tmp/f")
            assert (argv[argv.index("--gmf") + 1], argv[argv.index("--mu") + 1]) == (repr(gmf), repr(mu))
    u25 = {row[1:] for row in cases if row[0] == script.U25}
    assert {("fedavg", 0.0, 0.0, 0.0), ("fedavg", 0.9, 0.0, 0.0), ("fednova", 0.9, 0.9, 0.0)} <= u25
    assert cases[(script.U25, "fedprox", 0.0, 0.0, 0.0)][1]["fedprox"]["mu"] == 0.001


def test_each_case_is_the_scripts_command_line_of_its_table_row():
    by = _cases()

    def options(algorithm):
        argv = script.script_argv(by[algorithm][1], 3, 1, "/tmp/f")
        return dict(zip(argv[1::2], argv[2::2])) | {"rank": argv[argv.index("--rank") + 1]}

    fedavg, fedprox, fednova = options("fedavg"), options("fedprox"), options("fednova")
    assert (fedavg["--optimizer"], fedavg["--mu"], fedavg["--gmf"], fedavg["--momentum"]) == (
        "fedavg",
        "0.0",
        "0.0",
        "0.9",
    )
    assert (fedprox["--optimizer"], fedprox["--mu"], fedprox["--lr"]) == ("fedprox", "0.005", "0.05")
    assert (fedprox["--pattern"], fedprox["--localE"]) == ("constant", "2")
    # U(2,5) with both ends: the script's randint(2, localE) excludes localE
    assert (fednova["--gmf"], fednova["--pattern"], fednova["--localE"]) == ("0.9", "uniform_random", "6")
    assert fednova["rank"] == "1" and fednova["--size"] == "3"


@pytest.mark.parametrize(
    "change, named",
    [
        ({"client": {"weight_decay": 0.01}}, "client.weight_decay"),
        ({"server": {"lr": 0.5}}, "server.lr"),
        ({"client": {"lr_milestone_factor": 0.2}}, "lr_milestone_factor"),
        ({"random_epochs": {"low": 1}}, "random_epochs.low"),
    ],
)
def test_a_setting_the_script_cannot_run_is_refused_in_one_line(change, named):
    _, setting = _cases()["fednova"]
    with pytest.raises(ValueError, match=named) as err:
        script.script_argv(merged(setting, change), 3, 0, "/tmp/f")
    assert "\n" not in str(err.value)


def _mean_steps(weight_change: float = 1.0):
    """FedAvg's new model both ways in float32 from the same client models: the code's sum of ratio * x_i (its
    FedProx.average, the ranks' all-reduce summing in rank order), fedrepro's WeightedMean and ServerSGD."""
    from fedrepro.parts import RoundUpdates
    from fedrepro.server import ServerSGD, WeightedMean

    g = torch.Generator().manual_seed(0)
    sizes = torch.tensor([12.0, 9.0, 20.0])
    x = torch.randn(20_000, generator=g)
    clients = x + 0.3 * torch.randn(3, 20_000, generator=g)
    code = sum((float(n) / float(sizes.sum())) * xi for n, xi in zip(sizes, clients))
    ours_sizes = sizes * torch.tensor([weight_change, 1.0, 1.0])
    updates = RoundUpdates(0, torch.arange(3), x - clients, ours_sizes, torch.ones(3), torch.zeros(3), 0.05)
    ours = ServerSGD(1.0)(x, WeightedMean()(x, updates), updates)
    weights = updates.weights
    spread = sum(float(w) * float((x - c).abs().max()) for w, c in zip(weights, clients))
    ends = [float(c.abs().max()) for c in clients]
    xmax = float(x.abs().max())
    # client models equal here (0 steps: no client term), so the bound is the roundings alone
    bound = clients_fednova.mean_bound(weights.tolist(), [0, 0, 0], 0.0, ends, xmax, spread)
    return float((code - ours).abs().max()) / xmax, bound


def test_the_weighted_mean_bound_holds_and_sees_a_weight_one_percent_off():
    gap, bound = _mean_steps()
    assert 0 < gap <= bound < 30 * EPS32
    gap, bound = _mean_steps(1.01)
    assert gap > 10 * bound


def _momentum_rounds(gmf_ours: float, d_noise: float = 1e-3):
    """FedNova's server momentum over 6 rounds both ways in float32, each round from the same pinned x: the code's
    average() (buf = d / lr, then buf * gmf + d / lr; x - lr buf) and fedrepro's LrScaledMomentum, the code's d
    off by ``d_noise`` (relative) in round 0 alone, so only the carried buffer can explain later gaps."""
    from fedrepro.algorithms.fednova import LrScaledMomentum
    from fedrepro.parts import RoundUpdates

    g = torch.Generator().manual_seed(1)
    ours, buf, carried = LrScaledMomentum(1.0, gmf_ours), None, script.CarriedMomentum(0.9)
    ratios = []
    for t, lr in enumerate([0.05, 0.05, 0.005, 0.005, 0.0005, 0.0005]):
        x = torch.randn(20_000, generator=g)
        d = lr * torch.randn(20_000, generator=g)
        d_code = d * (1 + d_noise) if t == 0 else d.clone()
        if buf is None:
            buf = d_code.clone().div_(lr)
        else:
            buf.mul_(0.9).add_(d_code, alpha=1 / lr)
        code = x.clone().sub_(buf, alpha=lr)
        updates = RoundUpdates(t, torch.arange(3), torch.zeros(3, 1), torch.ones(3), torch.ones(3), torch.zeros(3), lr)
        x_new = ours(x, d, updates)
        step = x - x_new
        bound = carried(lr, float((d_code - d).abs().max()), float(d.abs().max()), float(step.abs().max()),
                        float((step - d).abs().max()), float(x_new.abs().max()))  # fmt: skip
        ratios.append(float((code - x_new).abs().max()) / bound)
    return ratios


def test_the_server_momentum_bound_carries_the_buffers_gap_and_sees_gmf_one_percent_off():
    ratios = _momentum_rounds(0.9)
    # rounds 1 and 2: the gap of round 0's buffer, carried (times gmf, then times lr_2 / lr_1 = 0.1 as well), is
    # most of the bound: a bound that forgot either factor would be far looser, one without the carry exceeded
    assert max(ratios) <= 1 and ratios[1] > 0.9 and ratios[2] > 0.5
    assert max(_momentum_rounds(0.891, d_noise=0.0)[1:]) > 10


@needs_checkout
def test_the_client_check_sees_fedprox_mu_one_percent_off_on_our_side():
    """The code's FedProx optimiser with every term up (mu 0.5): fedrepro at mu 0.505 must be seen (at Table I's
    mu 0.005 the round check cannot see 1%: the term is below VGG-11's grown float32 rounding)."""
    from fedrepro.parity import clients_fednova

    settings = clients_fednova.fednova_settings()
    strong = next(s for label, s in settings.items() if label.startswith("FedProx"))
    row = clients_fednova.compare_case(FEDNOVA, merged(strong, {"fedprox": {"mu": 0.505}}), strong)
    assert row["status"] == "differs" and row["client_gap_over_bound"] > 1
    assert clients_fednova.compare_case(FEDNOVA, strong)["status"] == "equal"


@needs_checkout
def test_the_scripts_draws_of_epochs_are_its_generators():
    """What the check gives fedrepro for U(2,5): the script's own draws, in {2, ..., 5}, each client's those of the
    next client a round before (np.random.seed(2020 + rank + round + seed))."""
    _, setting = _cases()["fednova"]
    drawn = script.code_epochs(FEDNOVA, setting, 3, 4)
    assert set(drawn.values()) <= {2, 3, 4, 5} and len(set(drawn.values())) > 1
    assert all(drawn[(t, r)] == drawn[(t - 1, r + 1)] for t in range(1, 4) for r in range(2))
    law = script.draw_law(FEDNOVA, setting)
    assert law["code"]["repeats_next_client_round_before"] == 1.0
    assert sorted(law["code"]["values"]) == sorted(law["ours"]["values"]) == [2, 3, 4, 5]
    assert law["ours"]["repeats_next_client_round_before"] < 0.4


@needs_checkout
@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "fednova"])
def test_the_scripts_rounds_at_table_one_settings_run_as_ours(algorithm):
    from fedrepro.parity import rounds_fednova

    _, setting = _cases()[algorithm]
    row = rounds_fednova.compare_script_case(FEDNOVA, setting)
    assert row["status"] == "equal" and not row["rounds_steps_differ"] and row["ranks_agree"]
    lr = setting["client"]["lr"]
    assert [r[0] for r in row["rates"]] == pytest.approx([lr, lr, lr / 10, lr / 100], rel=1e-12)


@needs_checkout
def test_the_round_check_sees_server_momentum_one_percent_off_on_our_side():
    from fedrepro.parity import rounds_fednova

    _, setting = _cases()["fednova"]
    row = rounds_fednova.compare_script_case(FEDNOVA, merged(setting, {"fednova": {"server_momentum": 0.891}}), setting)
    assert row["status"] == "differs" and row["global_gap_over_bound"] > 1 and row["client_gap_over_bound"] <= 1


@needs_checkout
def test_the_round_check_sees_our_own_draws_of_epochs():
    """fedrepro drawing its own U(2,5) epochs (not given the script's): the steps and epochs differ."""
    from fedrepro.parity import rounds_fednova

    _, setting = _cases()["fednova"]
    row = rounds_fednova.compare_script_case(FEDNOVA, setting, pin_epochs=False)
    assert row["status"] == "differs" and row["rounds_epochs_differ"] and row["rounds_steps_differ"]


@needs_checkout
def test_the_round_check_sees_fedavg_run_for_the_scripts_fedprox():
    """fedrepro without the proximal term (mu 0) against the script's FedProx at mu 0.005: 79 times the client
    bound when measured (a mu 1% off stays inside it, 0.34: the client check sees that one)."""
    from fedrepro.parity import rounds_fednova

    _, setting = _cases()["fedprox"]
    row = rounds_fednova.compare_script_case(FEDNOVA, merged(setting, {"fedprox": {"mu": 0.0}}), setting)
    assert row["status"] == "differs" and row["client_gap_over_bound"] > 1 and "float64_oracle" not in row


@needs_checkout
def test_the_float64_judgement_cannot_see_the_proximal_term_at_table_ones_mu():
    """Why the script's cases keep the float32 bound alone (docs/parity.md): judged against the code's float64 run
    (as the FedNova cases are past their bounds), fedrepro without the proximal term passes for the script's FedProx
    at mu 0.005, the term being smaller than float32's rounding there; the bound itself sees it (the test above)."""
    from fedrepro.parity import rounds_fednova, rounds_fednova_script as script

    _, setting = _cases()["fedprox"]
    row = rounds_fednova.compare_case(FEDNOVA, merged(setting, {"fedprox": {"mu": 0.0}}), setting, script.SIZES)
    assert row["client_gap_over_bound"] > 1 and "float64_oracle" in row and row["status"] == "equal"
