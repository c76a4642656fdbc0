"""FedNova figures: the quadratic objective-inconsistency demo (Fig. 2), FedProx's α = ημ trade-off (Fig. 4)
and loss curves (Fig. 5).

Fig. 4 is analytic: FedProx's local steps give a_i = [(1−α)^{τ_i−1}, ..., (1−α), 1] (eq. 8), so
‖a_i‖₁ = [1 − (1−α)^{τ_i}]/α, τ_eff = Σ p_i ‖a_i‖₁ and w_i = p_i ‖a_i‖₁ / τ_eff; its three curves are the
weight bias χ²_{p‖w} = Σ (p_i − w_i)²/w_i, the slowdown τ̄/τ_eff of the first term of (9), and the relative
variance A(α)/A(0) of its second, A = m τ_eff Σ w_i² ‖a_i‖₂²/‖a_i‖₁² (eq. 10).

The demo is exact: client i minimises F_i(x) = 1/2 ||x - e_i||^2 by tau_i full-gradient steps,
whose result has a closed form, and the server aggregates with the library's own parts
(WeightedMean, NormalisedAveraging, ServerSGD), the code the training runs use. With a proximal
term mu/2 ||x - x0||^2 (FedProx) the local fixed point is z_i = (e_i + mu x0)/(1 + mu) and

    x_i = z_i + (1 - lr (1 + mu))^tau_i (x0 - z_i).

VRLSGD (Liang et al. 2019) runs x <- x - lr (grad F_i(x) - c_i), i.e. the same closed form with
e_i + c_i in place of e_i, then c_i <- c_i + (x_avg - x_i)/(tau_i lr); with unequal tau_i the paper
only says tau is "replaced by different tau_i's", which is what this does (specs/fednova.md 1.7).
"""

from __future__ import annotations

import numpy as np
import torch

from fedrepro.report.figures import MissingInput, described, finished, legend_outside

# FedNova Fig. 4's claim, in the paper's words (section IV, "Novel insights into the convergence of FedProx")
FEDPROX_ALPHA_CLAIM = (
    "As we increase α, the weights wi come closer to pi and thus, the non-vanishing error χ2κ2 in (13) "
    "decreases (see blue curve in Fig. 4). However increasing α worsens the slowdown τ/τeff, which "
    "appears in the first error term in (9) (see the red curve in Fig. 4). In the extreme case when "
    "α = 1, although FEDPROX achieves objective consistency, it has a significantly slower convergence "
    "because τeff = 1"
)
FEDPROX_ALPHA_TOLERANCE = 1e-9  # the checks' tolerance, stated before any curve was computed: float rounding only
# the loss columns loss_curves can draw: metrics.csv name -> what it is (the y label and the caption)
LOSS_COLUMNS = {
    "global_train_loss": "Global training loss (the global model's mean cross-entropy on all clients' training "
    "data, eval mode, nats: the objective sum_i n_i/n F_i)",
    "train_loss": "Local training loss (the cohort's mean cross-entropy during its local steps, nats)",
}
METHODS = ("FedAvg", "FedProx", "VRLSGD", "FedNova")


def local_models(x0: torch.Tensor, e: torch.Tensor, tau: torch.Tensor, lr: float, mu: float = 0.0) -> torch.Tensor:
    """Every client's model after tau_i GD steps from x0 on 1/2||x - e_i||^2 + mu/2||x - x0||^2 (exact)."""
    z = (e + mu * x0) / (1 + mu)
    return z + (1 - lr * (1 + mu)) ** tau[:, None] * (x0 - z)


def lr_schedule(options: dict) -> list[float]:
    lrs, lr = [], options["lr"]
    for t in range(options["rounds"]):
        if t in options["decay_rounds"]:
            lr /= options["decay"]
        lrs.append(lr)
    return lrs


def simulate(method: str, e: torch.Tensor, p: torch.Tensor, taus, lrs: list[float], mu: float = 1.0) -> torch.Tensor:
    """The global model after every round (rows), from x = 0. ``taus(t)`` gives round t's local steps."""
    from fedrepro.algorithms.fednova import NormalisedAveraging
    from fedrepro.parts import Algorithm, RoundUpdates
    from fedrepro.server import ServerSGD, WeightedMean

    if method not in METHODS:
        raise ValueError(f"quadratic demo: method {method!r}; allowed are {', '.join(METHODS)}")
    m, dim = e.shape
    aggregator = NormalisedAveraging() if method == "FedNova" else WeightedMean()
    algorithm = Algorithm(method.lower(), aggregator, ServerSGD(1.0))
    x = torch.zeros(dim, dtype=e.dtype)
    control = torch.zeros_like(e)
    path = []
    for t, lr in enumerate(lrs):
        tau = taus(t)
        if method == "VRLSGD":
            locals_ = local_models(x, e + control, tau, lr)
            x_new = p @ locals_
            control = control + (x_new - locals_) / (tau[:, None] * lr)
        else:
            locals_ = local_models(x, e, tau, lr, mu if method == "FedProx" else 0.0)
            # plain GD: a_i = tau_i, so FedNova's normalisation reads the steps as they are
            updates = RoundUpdates(t, torch.arange(m), x - locals_, p, tau, torch.zeros(m), lr)
            x_new = algorithm.server_step(x, updates)
        x = x_new
        path.append(x)
    return torch.stack(path)


def true_minimiser(e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return p @ e


def fedavg_limit(e, p, tau, lr: float | None = None) -> torch.Tensor:
    """FedAvg's fixed point: eq. (32) at a fixed lr (weights p_i [1 - (1 - lr)^tau_i]), eq. (33) as lr -> 0."""
    w = p * tau if lr is None else p * (1 - (1 - lr) ** tau)
    return w @ e / w.sum()


def fednova_limit(e, p, tau, lr: float) -> torch.Tensor:
    """FedNova's fixed point at a fixed lr (weights p_i [1 - (1 - lr)^tau_i] / tau_i); x* as lr -> 0."""
    w = p * (1 - (1 - lr) ** tau) / tau
    return w @ e / w.sum()


def problem(options: dict):
    gen = torch.Generator().manual_seed(options["seed"])
    m, dim = options["clients"], options["dim"]
    e = 0.1 * torch.randn(m, dim, generator=gen, dtype=torch.float64)  # e_i ~ N(0, 0.01 I)
    p = torch.full((m,), 1.0 / m, dtype=torch.float64)
    return e, p


def random_taus(options: dict):
    """tau_i(t) ~ N(tau, tau_std^2), rounded and clipped to tau_range, drawn once per (seed, t)."""
    low, high = options["tau_range"]
    m = options["clients"]

    def taus(t: int) -> torch.Tensor:
        rng = np.random.default_rng([options["seed"], t])
        return torch.as_tensor(
            np.clip(np.rint(rng.normal(options["tau"], options["tau_std"], m)), low, high), dtype=torch.float64
        )

    return taus


def quadratic(spec: dict, runs, context):
    import matplotlib.pyplot as plt

    e, p = problem(spec)
    lrs = lr_schedule(spec)
    x_star = true_minimiser(e, p)
    settings = {
        f"same local steps, tau_i = {spec['tau']}": lambda t: torch.full(
            (spec["clients"],), float(spec["tau"]), dtype=torch.float64
        ),
        f"random tau_i(t) in [{spec['tau_range'][0]}, {spec['tau_range'][1]}]": random_taus(spec),
    }
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    rounds = np.arange(1, len(lrs) + 1)
    for ax, (title, taus) in zip(axes, settings.items()):
        for method in METHODS:
            path = simulate(method, e, p, taus, lrs, spec["mu"])
            gap = 0.5 * (path - x_star).pow(2).sum(1).numpy()  # F(x) - F(x*) for identity Hessians
            gap = np.where(np.isfinite(gap), gap, np.nan)
            label = method + (f" (mu = {spec['mu']:g})" if method == "FedProx" else "")
            if not np.isfinite(gap).any():
                label += " (diverged)"
            ax.plot(rounds, np.maximum(gap, 1e-16), label=label, linestyle="--" if method == "FedAvg" else "-")
        for r in spec["decay_rounds"]:
            ax.axvline(r, color="gray", lw=0.6, ls=":")
        ax.set_yscale("log")
        ax.set_ylim(1e-16, 1e1)
        ax.set_xlabel("communication round")
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("F(x) - F(x*)  (log scale)")
    legend_outside(axes[1])
    axes[1].legend(
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
        title="dotted: lr / 5",
        title_fontsize=8,
    )
    fig.tight_layout()
    return fig, described("quadratic") + f" (m = {spec['clients']}, d = {spec['dim']}, {spec['rounds']} rounds)"


def fedprox_terms(alpha: float, tau, p) -> dict:
    """FedProx's aggregation terms at alpha = eta mu for local steps ``tau`` and data weights ``p`` (eqs. 8-10):
    tau_eff, w, the weight bias chi^2_{p||w}, the slowdown tau_bar / tau_eff and A (eq. 10)."""
    tau, p = np.asarray(tau, dtype=float), np.asarray(p, dtype=float)
    if alpha == 0:  # FedAvg: a_i = [1, ..., 1]
        l1, l2sq = tau.copy(), tau.copy()
    else:
        keep = 1.0 - alpha
        l1 = (1 - keep**tau) / alpha
        l2sq = tau.copy() if keep == 1 else (1 - keep ** (2 * tau)) / (1 - keep**2)
    tau_eff = float(p @ l1)
    w = p * l1 / tau_eff
    return {
        "tau_eff": tau_eff,
        "w": w,
        "weight_bias": float(((p - w) ** 2 / w).sum()),
        "slowdown": float(p @ tau) / tau_eff,
        "A": len(tau) * tau_eff * float((w**2 * l2sq / l1**2).sum()),
    }


def fedprox_alpha_curves(options: dict) -> dict:
    """Fig. 4's three curves over ``alphas``: m clients, p_i = 1/m, tau_i ~ N(tau, tau_std^2) rounded, at least 1."""
    rng = np.random.default_rng(options["seed"])
    m = options["clients"]
    tau = np.maximum(1, np.rint(rng.normal(options["tau"], options["tau_std"], m)))
    p = np.full(m, 1.0 / m)
    alphas = np.asarray(options["alphas"], dtype=float)
    base = fedprox_terms(0.0, tau, p)["A"]
    terms = [fedprox_terms(a, tau, p) for a in alphas]
    return {
        "alpha": alphas,
        "tau": tau,
        "weight_bias": np.array([t["weight_bias"] for t in terms]),
        "slowdown": np.array([t["slowdown"] for t in terms]),
        "relative_variance": np.array([t["A"] for t in terms]) / base,
        "tau_eff": np.array([t["tau_eff"] for t in terms]),
    }


def fedprox_alpha_checks(curves: dict, tolerance: float = FEDPROX_ALPHA_TOLERANCE) -> list[dict]:
    """Fig. 4's claim as checks on the curves, each {text, holds}: the weight bias falls as alpha grows, the
    slowdown rises, and at alpha = 1 the weights are p (chi^2 = 0) and tau_eff = 1 (the slowdown is tau_bar)."""
    alpha, bias, slow = curves["alpha"], curves["weight_bias"], curves["slowdown"]
    at_one = np.isclose(alpha, 1.0)
    out = [
        {
            "text": "the weight bias chi^2 decreases as alpha grows (blue curve)",
            "holds": bool(np.all(np.diff(bias) <= tolerance)),
        },
        {
            "text": "the slowdown tau_bar / tau_eff increases as alpha grows (red curve)",
            "holds": bool(np.all(np.diff(slow) >= -tolerance)),
        },
    ]
    if at_one.any():
        i = int(np.argmax(at_one))
        out.append(
            {
                "text": "at alpha = 1, chi^2 = 0 (objective consistency) and tau_eff = 1",
                "holds": bool(bias[i] <= tolerance and abs(curves["tau_eff"][i] - 1) <= tolerance),
            }
        )
    return out


def fedprox_alpha(spec: dict, runs, context):
    import matplotlib.pyplot as plt

    curves = fedprox_alpha_curves(spec)
    checks = fedprox_alpha_checks(curves)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.plot(curves["alpha"], curves["weight_bias"], color="tab:blue", label="weight bias chi^2(p || w)")
    ax.plot(curves["alpha"], curves["slowdown"], color="tab:red", label="slowdown tau_bar / tau_eff")
    ax.plot(curves["alpha"], curves["relative_variance"], color="tab:green", label="relative variance A / A(0)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(bottom=1e-4)  # chi^2 reaches 0 at alpha = 1: below this the curve leaves the axes
    ax.set_xlabel("alpha = eta mu")
    ax.set_title(
        f"FedProx: m = {spec['clients']}, p_i = 1/m, tau_i ~ N({spec['tau']:g}, {spec['tau_std'] ** 2:.3g})",
        fontsize=10,
    )
    legend_outside(ax)
    fig.tight_layout()
    verdict = "; ".join(f"{c['text']}: {'holds' if c['holds'] else 'FAILS'}" for c in checks)
    return fig, (
        described("fedprox_alpha") + f'. The paper: "{FEDPROX_ALPHA_CLAIM}". Checked on these curves '
        f"(tolerance {FEDPROX_ALPHA_TOLERANCE:g}): {verdict}"
    )


def loss_curves(spec: dict, runs, context):
    """A loss column (``column``) over rounds per method; one panel per ``panels`` entry (a partial setting).
    Rounds where the column was not logged (global_train_loss: every k rounds) are left out."""
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    from fedrepro.report import paper

    column = spec["column"]  # one of LOSS_COLUMNS (figures.CHOICES refuses others before work)
    what = LOSS_COLUMNS[column]
    done = finished(runs)
    if not any(column in r.metrics and r.metrics[column].notna().any() for r in done):
        raise MissingInput(f"the runs logged no {column} (evaluation.global_train_loss_every: 0?)")
    panels = spec["panels"] or [{}]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 1.5, 3.4), squeeze=False, sharey=True)
    for ax, panel in zip(axes[0], panels):
        chosen = [r for r in done if paper.matches(r.setting, panel) and column in r.metrics]
        ax.set_title(", ".join(f"{k}={v}" for k, v in panel.items()) or "all runs", fontsize=9)
        if not chosen:
            ax.text(0.5, 0.5, "no finished run", ha="center", va="center", transform=ax.transAxes)
            continue
        frame = pd.concat(
            [
                r.metrics[["round", column]]
                .dropna()
                .assign(method=r.setting["algorithm"] + "".join("+" + q for q in r.setting["plugins"]))
                for r in chosen
            ],
            ignore_index=True,
        )
        sns.lineplot(data=frame, x="round", y=column, hue="method", errorbar=("ci", 95), ax=ax)
        ax.set_xlabel("communication round")
        ax.set_ylabel(what.split(" (")[0].lower() + " (nats)")
        legend_outside(ax, "95% band over seeds")
    fig.tight_layout()
    return fig, described("loss_curves", what=what)
