"""IMA's other methods over whole rounds (fedrepro.parity.rounds_ima_methods, docs/parity.md): the code's Server
loops of FedProx, FedASAM, FedGMA, FedFA, FedAdam and FedYogi + IMA against fedrepro's trainer, and its cyclic
decay. The checks that run the code need FEDREPRO_IMA_CHECKOUT (a checkout of TailinZhou/FedIMA); the FedGMA form
the harness writes out is checked without it, against the aliasing it describes, done on parameters."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

IMA = os.environ.get("FEDREPRO_IMA_CHECKOUT")
needs_checkout = pytest.mark.skipif(
    not IMA, reason="FEDREPRO_IMA_CHECKOUT (a checkout of TailinZhou/FedIMA) is not set"
)


def _gma_with_an_aliased_global(x, clients, order, weights, lr, threshold):
    """The mechanism read in IMA's ``aggregation(..., 'gma')``, on parameters: the new model starts as the weighted
    mean, and after the first client the old global parameter's ``.data`` is the new model's storage, so every
    in-place correction also moves the point the next client's update is measured from. The oracle of
    ``gma_as_the_code_runs_it``, which writes it as a recurrence."""
    old = torch.nn.Parameter(x.clone(), requires_grad=False)
    new = torch.nn.Parameter(sum(weights[k] * clients[k] for k in order), requires_grad=False)
    signs = sum(torch.sign(clients[k] - x) for k in order)
    strong = signs.abs() > threshold * len(order)
    for k in order:
        update = clients[k] - old
        step = update * (((update > 0) == (signs > 0)) & strong) * (lr / len(order))
        old.data = new.data
        old.data.sub_(step)
    return new.detach()


def _gma_case(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4000, generator=gen, dtype=torch.float64)
    clients = {k: x + 0.05 * torch.randn(4000, generator=gen, dtype=torch.float64) + 0.02 for k in range(3)}
    return x, clients, {0: 0.3, 1: 0.5, 2: 0.2}


def test_fedgmas_code_form_is_the_codes_aliased_step_and_depends_on_the_order():
    from fedrepro.parity.rounds_ima_methods import gma_as_the_code_runs_it

    x, clients, weights = _gma_case()
    for order in ([0, 1, 2], [2, 0, 1]):
        code = _gma_with_an_aliased_global(x, clients, order, weights, 0.5, 0.8)
        form = gma_as_the_code_runs_it(x, clients, order, weights, 0.5, 0.8)
        assert float((code - form).abs().max() / code.abs().max()) < 1e-14
    a = gma_as_the_code_runs_it(x, clients, [0, 1, 2], weights, 0.5, 0.8)
    b = gma_as_the_code_runs_it(x, clients, [2, 0, 1], weights, 0.5, 0.8)
    assert float((a - b).abs().max()) > 1e-3  # the alias makes the step depend on the sampled order


def test_fedrepros_fedgma_is_the_step_from_the_round_start_not_the_codes():
    from fedrepro.algorithms.fedgma import MaskedAveraging
    from fedrepro.parity.rounds_ima_methods import gma_as_the_code_runs_it
    from fedrepro.parts import RoundUpdates

    x, clients, weights = _gma_case(1)
    order = [1, 2, 0]
    deltas = torch.stack([x - clients[k] for k in order])
    sizes = torch.tensor([weights[k] * 10 for k in order], dtype=torch.float64)  # n_i: weights 0.3, 0.5, 0.2
    ones = torch.ones(3)
    updates = RoundUpdates(0, torch.tensor(order), deltas, sizes, ones, ones, 0.1)
    ours = x - MaskedAveraging(0.5, 0.8)(x, updates)  # x <- x - d (eta_g = 1)
    agree = ((deltas < 0) == (deltas.sign().sum(0) < 0)) & (deltas.sign().sum(0).abs() > 0.8 * 3)
    # every client's update w_i - x measured from the round's start, the masked step taken against it
    from_the_start = sum(weights[k] * clients[k] for k in order) - 0.5 * ((-deltas) * agree).sum(0) / 3
    assert float((ours - from_the_start).abs().max() / from_the_start.abs().max()) < 1e-14
    code = gma_as_the_code_runs_it(x, clients, order, weights, 0.5, 0.8)
    assert float((ours - code).abs().max()) > 1e-3


@needs_checkout
@pytest.mark.parametrize("method", ["fedprox", "fedasam", "fedfa"])  # FedGMA: below
def test_imas_own_loop_of_a_method_runs_as_ours_and_its_term_1_percent_off_is_far_outside(method):
    from fedrepro.parity import rounds, rounds_ima_methods
    from fedrepro.parity.clients import merged

    setting = rounds_ima_methods.method_settings()[method]
    row = rounds.compare_case(IMA, setting)  # float32, as both programs train
    assert row["status"] == "equal" and row["rounds"] == 8 and row["client_gap_over_bound"] > 0, row
    exact = rounds.compare_case(IMA, setting, torch.float64)
    assert exact["status"] == "equal", exact
    section, key = rounds_ima_methods.WRONG[method]
    wrong = merged(setting, {section: {key: setting[section][key] * 1.01}})
    off = rounds.compare_case(IMA, setting, torch.float64, ours_setting=wrong)
    assert off["status"] == "differs" and min(off["global_gap_over_bound_by_round"][1:]) > 100, off
    if method == "fedfa":
        assert exact["anchor_gap_over_bound"] <= 1 and len(exact["anchor_gap_by_round"]) == 8


@needs_checkout
def test_imas_fedgma_loop_is_its_aliased_step_which_ours_is_not():
    from fedrepro.parity import rounds, rounds_ima_methods

    setting = rounds_ima_methods.method_settings()["fedgma"]
    row = rounds.compare_case(IMA, setting, torch.float64, extra=rounds_ima_methods.gma_code_form_gaps)
    assert row["client_gap_over_bound"] == 0 and not row["rounds_rates_differ"], row  # the clients: bit for bit
    assert row["status"] == "differs" and min(row["global_gap_over_bound_by_round"]) > 1e6, row
    assert row["code_form_gap_by_round"] == [0.0] * setting["ima"]["start_round"], row


@needs_checkout
def test_the_codes_cyclic_rate_climbs_back_where_ours_decays():
    from fedrepro.parity import rounds

    setting = rounds.ima_settings()["cyclic"]
    row = rounds.compare_case(IMA, setting)
    t_s, top = setting["ima"]["start_round"], setting["ima"]["cyclic_lr_max"]
    code, ours = ({t: rates[i] for t, rates in ((int(t), r) for t, r in row["rates"].items())} for i in (0, 1))
    # at mid-descent (t_s + 1) the two shapes meet: the code halfway down its half cycle, ours halfway down its cycle
    assert row["status"] == "differs" and row["rounds_rates_differ"] == [4, 6, 7], row
    assert all(code[t] == ours[t] for t in range(t_s))
    assert code[t_s] == pytest.approx(top, rel=1e-12) and code[t_s + 2] == pytest.approx(top, rel=1e-12)
    assert code[t_s + 3] > top  # the code's second half climbs past its maximum
    assert all(ours[t + 1] < ours[t] for t in range(t_s, t_s + 3)) and ours[t_s + 3] == pytest.approx(5e-5)


@needs_checkout
@pytest.mark.parametrize("method", ["fedadam", "fedyogi"])
def test_imas_adaptive_servers_agree_before_t_s_and_put_ima_inside_the_step_after(method):
    from fedrepro.parity import rounds, rounds_ima_methods
    from fedrepro.parity.clients import merged

    setting = rounds_ima_methods.method_settings()[method]
    t_s = setting["ima"]["start_round"]
    exact = rounds.compare_case(IMA, setting, torch.float64, extra=rounds_ima_methods.adaptive_as_the_code_runs_it)
    by_round = exact["global_gap_over_bound_by_round"]
    assert max(by_round[:t_s]) <= 1 and min(by_round[t_s:]) > 1e6, exact  # equal before t_s, not after
    assert max(exact["code_form_gap_by_round"]) < 1e-14, exact  # the code's placement, written out
    wrong = merged(setting, {"server": {"lr": setting["server"]["lr"] * 1.01}})
    off = rounds.compare_case(IMA, setting, ours_setting=wrong)  # float32
    assert min(off["global_gap_over_bound_by_round"][:t_s]) > 50, off


@needs_checkout
def test_imas_fednova_loop_normalises_as_ours_and_a_server_lr_1_percent_off_is_seen():
    from fedrepro.parity import rounds, rounds_ima_methods
    from fedrepro.parity.clients import merged

    setting = rounds_ima_methods.method_settings()["fednova"]
    row = rounds.compare_case(IMA, setting)  # float32: client models bit for bit, unequal steps (6, 8, 4)
    assert row["status"] == "equal" and row["client_gap_over_bound"] == 0, row
    wrong = merged(setting, {"server": {"lr": setting["server"]["lr"] * 1.01}})
    off = rounds.compare_case(IMA, setting, ours_setting=wrong)
    assert off["status"] == "differs" and min(off["global_gap_over_bound_by_round"]) > 50, off


def test_the_codes_draw_of_a_rounds_clients_is_numpys_global_stream_seeded_with_seed_plus_round():
    """``code_cohort`` against what IMA's server loops do, done here on numpy's global stream: ``np.random.seed(seed
    + t)``, then ``np.random.choice(range(K), m, replace=False)``."""
    from fedrepro.parity.ima_code_args import code_cohort

    state = np.random.get_state()
    try:
        for seed, t, k in [(1, 0, 2), (1, 5, 2), (3, 7, 4), (10, 0, 9)]:
            np.random.seed(seed + t)
            assert code_cohort(seed, t, 10, k).tolist() == np.random.choice(range(0, 10), k, replace=False).tolist()
    finally:
        np.random.set_state(state)
    assert code_cohort(1, 0, 10, 3).tolist() != code_cohort(1, 1, 10, 3).tolist()  # a new draw each round


def test_a_method_without_ima_runs_the_code_modes_of_its_notebook():
    from fedrepro.parity.ima_code_args import code_method

    def mode(algorithm, plugins):
        return code_method({"algorithm": algorithm, "plugins": plugins})

    assert mode("fedavg", ["ima"]) == ("fedavg", "ima") and mode("fedavg", []) == ("fedavg", "wa")
    assert mode("fedgma", []) == ("fedavg", "gma") and mode("fedadam", []) == ("fedavg", "fedadam")
    assert mode("fednova", []) == ("fednova", "fednova") and mode("fedasam", []) == ("fedsam", "wa")
    assert mode("fedfa", []) == ("fedfa_anchorloss", "wa") and mode("fedyogi", ["ima"]) == ("fedavg", "fedyogi+ima")


@needs_checkout
def test_the_methods_without_ima_run_as_the_codes_past_the_round_ima_would_start():
    """Every method's own loop without IMA over all 8 rounds: equal but FedGMA (the code's aliased step, as with
    IMA); FedAdam and FedYogi equal throughout, so their difference with IMA is IMA's place alone."""
    from fedrepro.parity import rounds, rounds_ima_methods

    settings = rounds_ima_methods.protocol_settings()
    for name in ("fedadam without ima", "fedgma without ima"):
        row = rounds.compare_case(IMA, settings[name])
        assert (row["status"] == "equal") == (name != "fedgma without ima"), row
        assert "without IMA" in row["case"] and not row["rounds_rates_differ"]


@needs_checkout
def test_fedavg_with_ima_below_full_participation_runs_as_the_code_on_its_draws(monkeypatch):
    """Two of three clients a round, fedrepro's cohort pinned to the code's sampler: equal, over cohorts that
    change; pinned to another draw (the code's of another seed), the rounds whose cohorts differ are named."""
    from fedrepro.parity import rounds, rounds_ima_methods
    from fedrepro.parity.ima_code_args import code_cohort

    setting = rounds_ima_methods.protocol_settings()["fedavg partial"]
    row = rounds.compare_case(IMA, setting)
    assert row["status"] == "equal" and not row["rounds_cohorts_differ"]
    assert {len(c) for c in row["cohorts"]} == {2} and len({tuple(c) for c in row["cohorts"]}) > 1
    monkeypatch.setattr(rounds, "code_cohort", lambda seed, t, n, k: code_cohort(seed + 50, t, n, k))
    off = rounds.compare_case(IMA, setting)
    assert off["status"] == "differs" and off["rounds_cohorts_differ"]
