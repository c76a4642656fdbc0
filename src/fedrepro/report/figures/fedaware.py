"""FedAWARE figures: e-LUD over rounds, cosine matrices of client updates, coherence against LUD."""

from __future__ import annotations

import numpy as np

from fedrepro.report.figures import MissingInput, described, finished, legend_outside
from fedrepro.report.figures.curves import frame, method, over_rounds, split

# split_dynamics: the panels of FedAWARE Fig. 1, (metrics.csv column, y label, scale)
DYNAMICS = (
    ("test_acc", "test accuracy (%)", 100.0),
    ("e_lud", "e-LUD", 1.0),
    ("global_norm", "||sum_i p_i Delta_i|| (L2)", 1.0),
    ("train_loss", "local training loss (nats)", 1.0),
)


def elud(spec, runs, context):
    fig, _ = over_rounds(runs, "e_lud", "e-LUD (dimensionless)", logy=True)
    return fig, described("elud")


def cosines(spec, runs, context):
    """The matrices of the first finished run that matches (one run: one cohort sequence)."""
    import matplotlib.pyplot as plt

    run = finished(runs)[0]
    path = run.folder.cosines
    if not path.exists():
        raise MissingInput(f"run {run.id} has no {path.name}")
    stored = np.load(path)
    have = sorted(int(k.split("_")[1]) for k in stored.files)
    wanted = [r if r > 0 else run.setting["rounds"] + 1 + r for r in spec["rounds"]]
    shown = [r for r in wanted if r in have]
    if not shown:
        raise MissingInput(
            f"run {run.id} kept cosine matrices of rounds {have}, none of the asked {wanted}; "
            f"list them in snapshots.cosine_rounds"
        )
    from matplotlib.ticker import MaxNLocator

    from fedrepro import partitions
    from fedrepro.identity import partition_setting

    groups = partitions.groups(partition_setting(run.setting))
    boundary = len(groups["balanced"]) if groups and run.setting["participation"] == 1.0 else None
    fig, axes = plt.subplots(
        1, len(shown), figsize=(4.0 * len(shown) + 1.2, 3.6), squeeze=False, constrained_layout=True
    )
    for ax, r in zip(axes[0], shown):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        matrix = stored[f"round_{r}"]
        image = ax.imshow(matrix, vmin=-1, vmax=1, cmap="RdBu_r")
        off = matrix[~np.eye(len(matrix), dtype=bool)]
        ax.set_title(f"round {r}: coherence {off.mean():.2f}", fontsize=10)
        if boundary is not None:  # the hybrid partition's groups: every client sampled, in id order
            for line in (ax.axhline, ax.axvline):
                line(boundary - 0.5, color="black", lw=0.8)
        ax.set_xlabel("client of the cohort")
        ax.set_ylabel("client of the cohort")
    fig.colorbar(image, ax=axes[0].tolist(), label="cosine similarity", shrink=0.9)
    missing = sorted(set(wanted) - set(shown))
    shows = described("cosines") + f" ({method(run)}, {split(run)}, seed {run.setting['seed']})"
    if missing:
        shows += f"; rounds {missing} were not kept"
    if boundary is not None:
        shows += f"; the lines part the balanced clients 0-{boundary - 1} from the imbalanced ones"
    return fig, shows


def coherence_lud(spec, runs, context):
    import matplotlib.pyplot as plt

    data = frame(runs, "e_lud").dropna(subset=["coherence", "e_lud"])
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    splits = list(dict.fromkeys(data["split"]))
    for i, name in enumerate(splits):
        part = data[data["split"] == name]
        ax.scatter(part["e_lud"], part["coherence"], s=10, alpha=0.6, color=f"C{i}", label=name)
    ax.set_xscale("log")
    ax.axhline(0, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("e-LUD (dimensionless, log scale)")
    ax.set_ylabel("client coherence (mean pairwise cosine)")
    legend_outside(ax, "data split")
    fig.tight_layout()
    return fig, described("coherence_lud") + f" ({', '.join(sorted(set(data['method'])))})"


def split_dynamics(spec, runs, context):
    """FedAWARE Fig. 1: one method under several data splits, four per-round quantities side by side."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    data = frame(runs, "e_lud")
    fig, axes = plt.subplots(1, len(DYNAMICS), figsize=(4.0 * len(DYNAMICS) + 1.6, 3.4), layout="constrained")
    for ax, (column, label, scale) in zip(axes, DYNAMICS):
        part = data.dropna(subset=[column]).assign(**{column: lambda f, c=column, k=scale: f[c] * k})
        style = "method" if data["method"].nunique() > 1 else None  # one method is the paper's case
        sns.lineplot(
            data=part, x="round", y=column, hue="split", style=style, errorbar=("ci", 95), ax=ax, legend=ax is axes[-1]
        )
        ax.set_xlabel("communication round")
        ax.set_ylabel(label)
    legend_outside(axes[-1], "data split (and method)")
    return fig, described("split_dynamics") + f" ({', '.join(sorted(set(data['method'])))})"


def momentum_ablation(spec, runs, context):
    """FedAWARE Fig. 4: FedAWARE and FedAWARE-NA against alpha; FedAvg-Full as a reference line."""
    import math

    import matplotlib.pyplot as plt
    import pandas as pd

    from fedrepro.report import paper

    records = []
    for run in finished(runs):
        acc = paper.run_metric({"kind": "mean_last_fraction", "fraction": 0.1, "scale": 100}, run.summary, run.metrics)
        eludd = float(run.metrics["e_lud"].mean())
        if run.setting["algorithm"] == "fedaware":
            static = run.setting["fedaware"].get("weights") == "static"
            name, alpha = ("FedAWARE-NA" if static else "FedAWARE"), run.setting["fedaware"]["alpha"]
        elif run.setting["algorithm"] == "fedavg" and not run.setting["plugins"]:
            name, alpha = f"FedAvg (participation {run.setting['participation']:g})", math.nan
        else:
            continue
        records.append({"method": name, "alpha": alpha, "accuracy": acc, "e-LUDD": eludd})
    data = pd.DataFrame.from_records(records)
    swept = data.dropna(subset=["alpha"]) if len(data) else data
    if swept.empty:
        raise MissingInput("no finished FedAWARE run (the alpha sweep) among the runs")
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.5), layout="constrained")
    for ax, column, label in (
        (axes[0], "accuracy", "accuracy (%, last 10% of rounds)"),
        (axes[1], "e-LUDD", "e-LUDD (mean e-LUD, dimensionless)"),
    ):
        for i, (name, part) in enumerate(swept.groupby("method", sort=True)):
            stats = part.groupby("alpha")[column].agg(["mean", "min", "max"])
            ax.plot(stats.index, stats["mean"], marker="o", color=f"C{i}", label=name)
            ax.fill_between(stats.index, stats["min"], stats["max"], color=f"C{i}", alpha=0.2, lw=0)
        for name, part in data[data["alpha"].isna()].groupby("method"):
            ax.axhline(part[column].mean(), color="gray", ls="--", lw=1, label=name)
        ax.set_xlabel("FedAWARE's momentum alpha")
        ax.set_ylabel(label)
    legend_outside(axes[1], "mean; band min-max over seeds")
    return fig, described("momentum_ablation")
