"""Cells of the papers' closed-form figures, computed instead of trained, so their claims are checked in seconds.

A table of params/paper_results.yaml with ``computed: {params: <params file>, figure: <its figure>}`` takes each
cell's number from the figure's own computation (fedrepro.report.figures.fednova), at the options the params file
gives the figure over its kind's defaults; the cell's ``match`` says which number:

  quadratic       FedNova Fig. 2: {steps: equal | random, method: FedAvg | FedProx | VRLSGD | FedNova}: the final
                  optimality gap F(x) - F(x*) after the figure's rounds (its right-hand panel's last point).
  fedprox_alpha   FedNova Fig. 4: {curve: weight_bias | slowdown | tau_eff, alpha: a}: the curve's value at
                  alpha = eta mu.

A number that is not finite (VRLSGD diverging) leaves the cell without a number and marks it diverged, which a
claim check counts as the worst value (fedrepro.report.claims).
"""

from __future__ import annotations

import math
from functools import lru_cache

from fedrepro.configure.paramsfile import ROOT, read_yaml
from fedrepro.report.paper import Cell

DIVERGED = "closed form: not finite"


def figure_spec(params: str, figure: str) -> dict:
    """The figure's options: its kind's defaults (figures/<family>.yaml) under the params file's own."""
    from fedrepro.report import figures

    declared = (read_yaml(ROOT / params).get("figures") or {}).get(figure)
    if declared is None:
        raise ValueError(f"{params}: no figure {figure} under figures:")
    return {**figures.KINDS[declared["kind"]]["options"], **declared}


@lru_cache(maxsize=None)
def _quadratic_gap(params: str, figure: str, steps: str, method: str) -> float:
    import torch

    from fedrepro.report.figures import fednova

    spec = figure_spec(params, figure)
    e, p = fednova.problem(spec)
    taus = (
        fednova.random_taus(spec)
        if steps == "random"
        else (lambda t: torch.full((spec["clients"],), float(spec["tau"]), dtype=torch.float64))
    )
    path = fednova.simulate(method, e, p, taus, fednova.lr_schedule(spec), spec["mu"])
    return float(0.5 * (path[-1] - fednova.true_minimiser(e, p)).pow(2).sum())


def _fedprox_alpha(params: str, figure: str, match: dict) -> float:
    from fedrepro.report.figures import fednova

    curves = fednova.fedprox_alpha_curves({**figure_spec(params, figure), "alphas": [match["alpha"]]})
    return float(curves[match["curve"]][0])


def value(computed: dict, match: dict) -> float:
    kind = figure_spec(computed["params"], computed["figure"])["kind"]
    if kind == "quadratic":
        return _quadratic_gap(computed["params"], computed["figure"], match["steps"], match["method"])
    if kind == "fedprox_alpha":
        return _fedprox_alpha(computed["params"], computed["figure"], match)
    raise ValueError(
        f"computed figure {computed['figure']}: kind {kind} has no closed form here (allowed: quadratic, fedprox_alpha)"
    )


def fill(table: dict, cells: list[Cell]) -> None:
    """Each cell's number from the figure's computation (one value: a closed form has no seeds)."""
    for cell in cells:
        number = value(table["computed"], cell.match)
        cell.ours, cell.diverged = ([number], []) if math.isfinite(number) else ([], [DIVERGED])
