"""FedLAW figures: client coherence and its critical point, the learned gamma and lambda, fixed gamma,
and section 4's adaptive global weight shrinking (GWS) against FedAvg (Figs. 2, 3, 9, 10 left, 11)."""
from __future__ import annotations

import numpy as np

from fedrepro.report.figures import MissingInput, described, finished, legend_outside
from fedrepro.report.figures.curves import frame, method, methods_legend, over_rounds, split


def middle_rounds(frame, column: str):
    """The values of ``column`` in the middle stage of a run: rounds 90-110 (App. D.5) when the run has
    them, else its middle tenth (a short run of a test)."""
    rounds = frame["round"]
    last = int(rounds.max())
    first, stop = (90, 110) if last >= 110 else (int(0.45 * last), max(int(0.45 * last), int(0.55 * last + 0.5)))
    return frame.loc[(rounds >= first) & (rounds <= stop), column].dropna()


def _gws_pairs(runs, axis: str):
    """Per (line, axis value): FedAvg's and adaptive GWS's seed-mean final accuracy and GWS's middle-stage
    gamma, global-gradient norm and r. ``axis``: local_epochs or alpha (the partition's)."""
    import pandas as pd

    rows = []
    for r in finished(runs):
        law = r.setting["algorithm"] == "fedlaw" and r.setting.get("fedlaw", {}).get("variant") == "adaptive_gws"
        if r.setting["algorithm"] != "fedavg" and not law:
            continue
        value = r.setting["local_epochs"] if axis == "local_epochs" else r.setting["partition"].get(axis)
        line = (f"alpha={r.setting['partition'].get('alpha')}" if axis == "local_epochs"
                else f"E={r.setting['local_epochs']}")
        row = {"line": line, "x": value, "method": "gws" if law else "fedavg", "seed": r.setting["seed"],
               "acc": r.metrics["test_acc"].dropna().tail(10).mean() * 100}
        if law:
            for column in ("gamma", "global_grad_norm", "gws_norm"):
                row[column] = middle_rounds(r.metrics, column).mean() if column in r.metrics else float("nan")
        rows.append(row)
    if not rows:
        raise MissingInput("no finished FedAvg or adaptive GWS run (fedlaw.variant: adaptive_gws)")
    return pd.DataFrame(rows)


def gws_sweep(spec, runs, context):
    """FedLAW Fig. 2 (axis local_epochs) and Fig. 9 (axis alpha): a line needs two points of the axis."""
    import matplotlib.pyplot as plt

    axis = spec["axis"]
    data = _gws_pairs(runs, axis)
    if "gamma" not in data:
        raise MissingInput("no finished adaptive GWS run (fedlaw.variant: adaptive_gws) to compare with FedAvg")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.5, 3.6))
    twin = right.twinx()
    drawn = 0
    for line, part in data[data["x"].notna()].groupby("line", sort=True):  # an iid partition has no alpha
        mean = part.groupby(["x", "method"])[["acc", "gamma", "global_grad_norm"]].mean().unstack("method")
        if "gws" not in mean["acc"] or "fedavg" not in mean["acc"]:
            continue
        gain = (mean["acc"]["gws"] - mean["acc"]["fedavg"]).dropna()
        if len(gain) < 2:
            continue
        color = f"C{drawn}"
        left.plot(gain.index, gain.to_numpy(), marker="o", color=color, label=line)
        right.plot(mean.index, mean["gamma"]["gws"], marker="o", color=color, label=f"{line}: gamma")
        twin.plot(mean.index, mean["global_grad_norm"]["gws"], marker="s", ls="--", color=color,
                  label=f"{line}: ||gamma eta_g g_g||")
        drawn += 1
    if not drawn:
        raise MissingInput(f"no setting has both FedAvg and adaptive GWS at two values of {axis}")
    for ax in (left, right):
        ax.set_xlabel("local epochs E" if axis == "local_epochs" else "Dirichlet alpha")
        if axis == "alpha":
            ax.set_xscale("log")
    left.axhline(0.0, color="gray", lw=0.8, ls=":")
    left.set_ylabel("accuracy gain over FedAvg (points)")
    right.set_ylabel("learned gamma (middle rounds)")
    twin.set_ylabel("||gamma eta_g g_g|| (L2, middle rounds)")
    left.legend(fontsize=8, title="seed mean", title_fontsize=8)
    handles = right.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    right.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper left", bbox_to_anchor=(1.18, 1.0),
                 frameon=False)
    fig.tight_layout()
    return fig, described("gws_sweep")


def gws_norms(spec, runs, context):
    """FedLAW Fig. 3: the two terms of Eq. 4 over rounds, and gamma with their ratio r."""
    import matplotlib.pyplot as plt

    data = frame(runs, "gws_norm")
    if "global_grad_norm" not in data:
        raise MissingInput("metrics.csv has no global_grad_norm")
    mean = data.groupby("round")[["gws_norm", "global_grad_norm", "gamma"]].mean()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4))
    left.plot(mean.index, mean["global_grad_norm"], label="global gradient ||gamma eta_g g_g||")
    left.plot(mean.index, mean["gws_norm"], label="GWS pseudo-gradient ||(1 - gamma) w_g||")
    left.set_ylabel("norm (L2 of the flat parameters)")
    left.legend(fontsize=8)
    right.plot(mean.index, mean["gamma"], color="C2", label="gamma")
    right.set_ylabel("learned gamma")
    twin = right.twinx()
    ratio = mean["global_grad_norm"] / mean["gws_norm"]
    twin.plot(mean.index, ratio, color="C3", ls="--", label="r")
    twin.set_ylabel("r = ||gamma eta_g g_g|| / ||(1 - gamma) w_g||")
    handles = right.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    twin.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="best")  # above the twin's line
    for ax in (left, right):
        ax.set_xlabel("communication round")
    fig.tight_layout()
    middle = ratio[(ratio.index >= 90) & (ratio.index <= 110)] if ratio.index.max() >= 110 else ratio
    return fig, described("gws_norms") + f"; r over the middle rounds: {middle.mean():.3g} (the paper: about 19)"


def gws_ratio(spec, runs, context):
    """FedLAW Fig. 11: r pooled over the runs of Figs. 2 and 9."""
    import matplotlib.pyplot as plt

    values = []
    for r in finished(runs):
        if r.setting.get("fedlaw", {}).get("variant") != "adaptive_gws" or "gws_norm" not in r.metrics:
            continue
        ratio = r.metrics["global_grad_norm"] / r.metrics["gws_norm"]
        values.append(float(middle_rounds(r.metrics.assign(r=ratio), "r").mean()))
    values = [v for v in values if np.isfinite(v)]
    if not values:
        raise MissingInput("no finished adaptive GWS run (fedlaw.variant: adaptive_gws) logs gws_norm")
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.hist(values, bins=max(3, min(20, len(values) // 2)), color="C0", alpha=0.8)
    ax.axvline(np.mean(values), color="C3", ls="--", label=f"mean {np.mean(values):.3g} (paper: about 20.5)")
    ax.set_xlabel("r (middle rounds)")
    ax.set_ylabel("runs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, described("gws_ratio") + f" ({len(values)} runs, mean {np.mean(values):.3g}, std {np.std(values):.3g})"


def model_norm(spec, runs, context):
    """FedLAW Fig. 10 (left): the parameter norm of FedAvg and adaptive GWS over rounds."""
    fig, _ = over_rounds(runs, "model_norm", "||w_g|| (L2 of the flat parameters)")
    return fig, described("model_norm")


def critical_point(rounds, coherence, window: int = 5) -> float:
    """First round at which the moving average of the coherence is <= 0 (nan if it never is); the one
    definition the claim checks read too (fedrepro.report.paper.critical_round)."""
    from fedrepro.report.paper import critical_round

    found = critical_round(rounds, coherence, window)
    return found if np.isfinite(found) else float("nan")


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
    shows = described("coherence") + ("; critical points: " + "; ".join(marks) if marks else "; no method's coherence "
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


def fedlaw_weights(spec, runs, context):
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
    return fig, described("fedlaw_weights") + f" ({', '.join(sorted(set(data['method'])))})"


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
    return fig, described("fixed_gamma")



def client_weights(spec, runs, context):
    """FedLAW Fig. 5 (right): lambda per client over rounds, from the lambda_client_<id> columns."""
    import matplotlib.pyplot as plt

    run = next((r for r in finished(runs) if any(c.startswith("lambda_client_") for c in r.metrics)), None)
    if run is None:
        raise MissingInput("no finished run logs lambda_client_<id> (set fedlaw.log_client_weights: true)")
    columns = sorted((c for c in run.metrics if c.startswith("lambda_client_")), key=lambda c: int(c.rsplit("_", 1)[1]))
    grid = run.metrics[columns].to_numpy().T  # (clients, rounds)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis",
                      extent=(0.5, len(run.metrics) + 0.5, len(columns) - 0.5, -0.5))
    fig.colorbar(image, ax=ax, label="lambda_i")
    ax.set_yticks(range(len(columns)), [c.rsplit("_", 1)[1] for c in columns], fontsize=7)
    ax.set_ylabel("client")
    ax.set_xlabel("communication round")
    shows = described("client_weights") + f" ({method(run)}, {split(run)}, seed {run.setting['seed']})"
    part = run.setting["partition"]
    if part["kind"] == "hybrid":  # the balanced clients are the first half
        ax.axhline(len(columns) / 2 - 0.5, color="white", lw=1.0, ls="--")
        shows += "; the dashed line parts the balanced clients (above) from the imbalanced ones"
    fig.tight_layout()
    return fig, shows


def accuracy(spec, runs, context):
    """FedLAW Fig. 5 (middle) and Fig. 7 (right): accuracy curves of the figure's methods."""
    from dataclasses import replace

    done = [replace(r, metrics=r.metrics.assign(test_acc_pct=r.metrics["test_acc"] * 100)) for r in finished(runs)]
    fig, _ = over_rounds(done, "test_acc_pct", "test accuracy %")
    return fig, described("accuracy")



def _dotted(setting: dict, key: str):
    value = setting
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def sweep_accuracy(spec, runs, context):
    """FedLAW Fig. 8: final accuracy against one setting (a dotted key), per method."""
    import matplotlib.pyplot as plt
    import pandas as pd

    rows = [{"method": method(r), "x": _dotted(r.setting, spec["axis"]), "seed": r.setting["seed"],
             "acc": r.metrics["test_acc"].dropna().tail(10).mean() * 100} for r in finished(runs)]
    data = pd.DataFrame(rows).dropna(subset=["x"])
    if data["x"].nunique() < 2:
        raise MissingInput(f"the finished runs have fewer than two values of {spec['axis']}")
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for i, (name, part) in enumerate(data.groupby("method", sort=False)):
        stats = part.groupby("x")["acc"].agg(["mean", "min", "max"])
        ax.plot(stats.index, stats["mean"], marker="o", color=f"C{i}", label=name)
        ax.fill_between(stats.index, stats["min"], stats["max"], color=f"C{i}", alpha=0.15, lw=0)
    if data["x"].min() > 0 and data["x"].max() / data["x"].min() >= 20:
        ax.set_xscale("log")
    ax.set_xlabel(spec["axis"])
    ax.set_ylabel("final test accuracy % (last 10 rounds)")
    legend_outside(ax)
    fig.tight_layout()
    return fig, described("sweep_accuracy") + f" ({spec['axis']})"



def cohort_classes(spec, runs, context):
    """FedLAW Fig. 7 (left): the lambda-weighted class histogram of the cohort."""
    import matplotlib.pyplot as plt

    data = frame(runs, "cohort_class_tv")
    columns = sorted((c for c in data if c.startswith("cohort_class_") and c != "cohort_class_tv"),
                     key=lambda c: int(c.rsplit("_", 1)[1]))
    methods = list(dict.fromkeys(data["method"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.6))
    width = 0.8 / len(methods)
    for i, name in enumerate(methods):
        part = data[data["method"] == name]
        left.bar([c + i * width for c in range(len(columns))], part[columns].mean().to_numpy(), width,
                 color=f"C{i}", label=name)
        tv = part.groupby("round")["cohort_class_tv"].mean()
        right.plot(tv.index, tv.to_numpy(), color=f"C{i}", label=name)
    global_share = _global_classes(runs, len(columns))
    if global_share is not None:
        left.scatter([c + (len(methods) - 1) * width / 2 for c in range(len(columns))], global_share, marker="_",
                     s=200, color="black", label="all clients", zorder=3)
    left.set_xticks([c + (len(methods) - 1) * width / 2 for c in range(len(columns))], range(len(columns)))
    left.set_xlabel("class")
    left.set_ylabel("share of the weighted cohort")
    right.set_xlabel("communication round")
    right.set_ylabel("TV distance to all clients' distribution")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig, described("cohort_classes")


def _global_classes(runs, classes: int):
    """The data-size weighted class distribution of all clients, from a run's client class counts."""
    for r in runs:
        counts = r.summary.get("client_class_counts")
        if counts:
            total = np.asarray(counts, dtype=float).sum(0)
            return total[:classes] / total.sum()
    return None



def sharpness(spec, runs, context):
    """FedLAW Fig. 10: ||w_g||, the top Hessian eigenvalue and the top-1/top-k ratio over rounds."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    panels = [("model_norm", "||w_g|| (L2)"), ("hessian_top1", "top Hessian eigenvalue"),
              ("hessian_ratio", "top-1 / top-5 eigenvalue")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6), layout="constrained")
    for ax, (column, label) in zip(axes, panels):
        data = frame(runs, column)  # MissingInput names the column (hessian.every off: no eigenvalues)
        data = data[data[column].notna()]
        sns.lineplot(data=data, x="round", y=column, hue="method", errorbar=("ci", 95), ax=ax, marker="o" if
                     column != "model_norm" else None, legend=ax is axes[-1])
        ax.set_xlabel("communication round")
        ax.set_ylabel(label)
    methods_legend(axes[-1])
    return fig, described("sharpness")
