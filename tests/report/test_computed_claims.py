"""FedNova Figs. 2 and 4 as claim checks on numbers computed in closed form (fedrepro.report.computed): the
numbers equal an independent float64 computation, every check holds on them, and each check fails when the
number it reads is changed the other way."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedrepro.report import claims, computed, paper

FIG4 = {"params": "params/fednova.yaml", "figure": "fednova_fig4_fedprox_alpha"}


def _table(name: str):
    table = paper.load_results()[name]
    cells = paper.cells({name: table})
    computed.fill(table, cells)
    return table, cells


def _verdicts(name, table, cells):
    return [claims.evaluate(check, name, cells) for check in table["checks"]]


def test_fig4_numbers_equal_the_sums_over_each_clients_a_i_written_out():
    """a_i = [(1 - alpha)^(tau_i - 1), ..., 1] (eq. 8) summed term by term, tau_i drawn as the figure draws them."""
    spec = computed.figure_spec(FIG4["params"], FIG4["figure"])
    rng = np.random.default_rng(spec["seed"])
    tau = np.maximum(1, np.rint(rng.normal(spec["tau"], spec["tau_std"], spec["clients"]))).astype(int)
    p = np.full(len(tau), 1.0 / len(tau))
    for alpha in (0.001, 0.0316, 0.316, 1.0):
        norms = np.array([sum((1 - alpha) ** k for k in range(t)) for t in tau])  # ||a_i||_1
        tau_eff = float(p @ norms)
        w = p * norms / tau_eff
        expect = {
            "tau_eff": tau_eff,
            "weight_bias": float(((p - w) ** 2 / w).sum()),
            "slowdown": float(p @ tau) / tau_eff,
        }
        for curve, oracle in expect.items():
            got = computed.value(FIG4, {"curve": curve, "alpha": alpha})
            # a few dozen float64 operations per client, 30 clients: far inside 1e-12 relative
            assert got == pytest.approx(oracle, rel=1e-12, abs=1e-15), (curve, alpha)


@pytest.mark.parametrize(
    "name, holds", [("fednova_fig2", [(1, 1), (3, 3), (1, 1)]), ("fednova_fig4", [(6, 6), (6, 6), (1, 1), (1, 1)])]
)
def test_every_check_of_figs_2_and_4_holds_on_the_closed_form(name, holds):
    table, cells = _table(name)
    assert [(v.ours.holds, v.ours.total) for v in _verdicts(name, table, cells)] == holds


def test_fig2_is_the_final_gap_of_the_figures_own_simulation():
    table, cells = _table("fednova_fig2")
    by = {(c.row, c.column): c for c in cells}
    # equal steps: every method converges to x* (the gap is float rounding); random steps: FedAvg keeps a gap
    assert by[("same local steps, tau_i = 30", "FedAvg")].ours[0] < 1e-30
    assert 1e-6 < by[("random tau_i(t)", "FedAvg")].ours[0] < 1e-3
    assert by[("random tau_i(t)", "VRLSGD")].diverged == [computed.DIVERGED]  # the paper: it "even diverge[s]"


@pytest.mark.parametrize(
    "name, row, column, number, broken",
    [
        # FedNova no longer ties FedAvg with equal steps
        ("fednova_fig2", "same local steps, tau_i = 30", "FedNova", 1e-6, 0),
        # FedNova above FedProx with random steps
        ("fednova_fig2", "random tau_i(t)", "FedNova", 1.02e-5, 1),
        # FedProx above FedAvg with random steps
        ("fednova_fig2", "random tau_i(t)", "FedProx", 2e-5, 2),
        # the weight bias rising between alpha = 0.01 and 0.0316
        ("fednova_fig4", "weight bias χ²(p‖w)", "α = 0.0316", 1e3, 0),
        # the slowdown falling at alpha = 1
        ("fednova_fig4", "slowdown τ̄/τ_eff", "α = 1", 1.0, 1),
        ("fednova_fig4", "weight bias χ²(p‖w)", "α = 1", 1e-6, 2),
        ("fednova_fig4", "τ_eff", "α = 1", 1.0 + 1e-6, 3),
    ],
)
def test_a_changed_number_fails_its_check(name, row, column, number, broken):
    table, cells = _table(name)
    (cell,) = [c for c in cells if (c.row, c.column) == (row, column)]
    cell.ours = [number]
    verdicts = _verdicts(name, table, cells)
    assert [i for i, v in enumerate(verdicts) if v.ours.holds < v.ours.total] == [broken]


def test_a_figure_without_a_closed_form_is_refused_naming_it():
    with pytest.raises(ValueError, match="fednova_fig5_synthetic: kind loss_curves has no closed form"):
        computed.value({"params": "params/fednova.yaml", "figure": "fednova_fig5_synthetic"}, {})
    with pytest.raises(ValueError, match="params/fednova.yaml: no figure nope"):
        computed.figure_spec("params/fednova.yaml", "nope")
    assert math.isfinite(computed.value(FIG4, {"curve": "slowdown", "alpha": 0.1}))
