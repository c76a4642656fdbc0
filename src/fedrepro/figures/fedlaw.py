"""FedLAW figures: client coherence and its critical point, the learned gamma and lambda, fixed gamma."""
from __future__ import annotations

import numpy as np

from fedrepro.figures import MissingInput, finished, legend_outside
from fedrepro.figures.curves import frame, method, methods_legend, over_rounds, split

SHOWS = {
    "coherence": "Client (cohort) coherence, the mean pairwise cosine of the client updates, over rounds per "
                 "method; the dotted line is zero and the marks are each method's critical point, the first "
                 "round where the seed-mean coherence (5-round moving average) falls to zero or below",
    "fedlaw_weights": "FedLAW's learned global weight shrinking factor gamma (left) and the spread of the "
                      "learned client weights lambda, max and min over the cohort (right), over rounds",
    "fixed_gamma": "Final test accuracy (%, mean of the last 10 rounds) against a fixed global shrinking "
                   "factor gamma, one line per heterogeneity/local-epoch setting; the star marks the best gamma",
}


def critical_point(rounds, coherence, window: int = 5) -> float:
    """First round at which the moving average of the coherence is <= 0 (nan if it never is)."""
    smooth = np.convolve(coherence, np.ones(window) / window, mode="valid")
    below = np.flatnonzero(smooth <= 0)
    return float(rounds[below[0] + window - 1]) if len(below) else float("nan")


def coherence(spec, runs, context):
    fig, data = over_rounds(runs, "coherence", "client coherence (mean pairwise cosine)", hline=0.0)
    marks = []
    for ax, name in zip(fig.axes, dict.fromkeys(data["split"])):
        part = data[data["split"] == name]
        for i, (m, group) in enumerate(part.groupby("method", sort=False)):
            mean = group.groupby("round")["coherence"].mean()
            r = critical_point(mean.index.to_numpy(), mean.to_numpy())
            if np.isfinite(r):
                ax.axvline(r, color=f"C{i}", lw=0.8, ls="--")
                marks.append(f"{m} at {name}: round {r:g}")
    shows = SHOWS["coherence"] + ("; critical points: " + "; ".join(marks) if marks else "; no method's coherence "
                                  "reached zero in these rounds")
    grouped = _group_coherence(fig, data, runs)
    if grouped:
        shows += ("; thin lines: the coherence within each client group of the hybrid partition, seed mean (" +
                  ", ".join(f"{style} {name}" for name, style in grouped) + ")")
    return fig, shows


GROUP_STYLES = {"balanced": "dashed", "imbalanced": "dotted"}


def _group_coherence(fig, data, runs) -> list[tuple[str, str]]:
    """FedLAW Fig. 5 (left): within-group coherence of the runs whose partition defines client groups."""
    drawn = []
    for name, style in GROUP_STYLES.items():
        try:
            part = frame(runs, f"coherence_{name}")
        except MissingInput:
            continue
        for ax, split_name in zip(fig.axes, dict.fromkeys(data["split"])):
            methods = list(dict.fromkeys(data[data["split"] == split_name]["method"]))
            for m, group in part[part["split"] == split_name].groupby("method", sort=False):
                mean = group.groupby("round")[f"coherence_{name}"].mean()
                ax.plot(mean.index, mean.to_numpy(), ls=style, lw=0.9, color=f"C{methods.index(m)}")
        drawn.append((name, style))
    if drawn:
        from matplotlib.lines import Line2D
        keys = [Line2D([], [], color="gray", lw=1.2, label="all clients")]
        keys += [Line2D([], [], color="gray", lw=0.9, ls=style, label=f"{name} clients") for name, style in drawn]
        methods_legend(fig.axes[-1], keys)
    return drawn


def weights(spec, runs, context):
    import matplotlib.pyplot as plt

    data = frame(runs, "gamma")
    if "weights_max" not in data:
        raise MissingInput("metrics.csv has no weights_max/weights_min (the learned lambda)")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.5, 3.4))
    for i, (name, part) in enumerate(data.groupby("split", sort=False)):
        mean = part.groupby("round")[["gamma", "weights_max", "weights_min"]].mean()
        left.plot(mean.index, mean["gamma"], color=f"C{i}", label=name)
        right.plot(mean.index, mean["weights_max"], color=f"C{i}", label=f"{name}: max")
        right.plot(mean.index, mean["weights_min"], color=f"C{i}", ls="--", label=f"{name}: min")
    left.axhline(1.0, color="gray", lw=0.8, ls=":")
    left.set_ylabel("gamma (dimensionless)")
    left.set_title("learned global weight shrinking factor", fontsize=10)
    right.set_ylabel("client weight lambda_i")
    right.set_title("spread of the learned client weights", fontsize=10)
    for ax in (left, right):
        ax.set_xlabel("communication round")
    left.legend(fontsize=8, title="split (mean over seeds)", title_fontsize=8)
    right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig, SHOWS["fedlaw_weights"] + f" ({', '.join(sorted(set(data['method'])))})"


def fixed_gamma(spec, runs, context):
    """Needs runs with learn_gamma off at several fixed gamma values (fedlaw.gamma in the grid)."""
    import matplotlib.pyplot as plt
    import pandas as pd

    rows = []
    for r in finished(runs):
        law = r.setting.get("fedlaw", {})
        if law.get("variant") != "fixed_gamma":
            continue
        acc = r.metrics["test_acc"].dropna().tail(10).mean() * 100
        axis = spec["axis"]
        value = r.setting["partition"].get(axis, r.setting.get(axis))
        rows.append({"gamma": law["gamma"], "acc": acc, "line": f"{axis}={value}, E={r.setting['local_epochs']}"})
    if not rows:
        raise MissingInput("no finished run with a fixed fedlaw.gamma")
    data = pd.DataFrame(rows).groupby(["line", "gamma"], as_index=False)["acc"].mean()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for i, (line, group) in enumerate(data.groupby("line")):
        ax.plot(group["gamma"], group["acc"], marker="o", color=f"C{i}", label=line)
        best = group.loc[group["acc"].idxmax()]
        ax.plot(best["gamma"], best["acc"], marker="*", ms=14, color=f"C{i}")
    ax.set_xlabel("fixed gamma")
    ax.set_ylabel("final test accuracy % (last 10 rounds)")
    legend_outside(ax)
    fig.tight_layout()
    return fig, SHOWS["fixed_gamma"]
