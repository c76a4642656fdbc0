"""Per-round quantities of metrics.csv drawn per method: the shared body of the metrics figures."""

from __future__ import annotations

from fedrepro.report.figures import MissingInput, finished


def method(run) -> str:
    name = run.setting["algorithm"] + "".join("+" + p for p in run.setting["plugins"])
    if run.setting["algorithm"] != "fedlaw":
        return name
    law = run.setting.get("fedlaw", {})  # FedLAW's learners differ by variant, and by an early stop
    tags = [law["variant"]] if law.get("variant", "fedlaw") != "fedlaw" else []
    tags += [f"learned until round {law['learn_rounds']}"] if law.get("learn_rounds") else []
    return f"{name} ({', '.join(tags)})" if tags else name


def split(run) -> str:
    part = run.setting["partition"]
    if part["kind"] == "dirichlet":
        return f"Dir({part['alpha']:g})"
    if part["kind"] == "hybrid":
        return f"hybrid Dir({part['alpha_balanced']:g}) | Dir({part['alpha']:g})"
    if part["kind"] == "shards":
        return f"#C={part['classes_per_client']}"
    return part["kind"]


def frame(runs, column: str, diverged_ok: bool = False):
    """One frame of (round, column, method, split, seed) over the finished runs that log ``column``."""
    import pandas as pd

    done = finished(runs)
    parts = [
        r.metrics.assign(method=method(r), split=split(r), seed=r.setting["seed"])
        for r in done
        if column in r.metrics and r.metrics[column].notna().any()
    ]
    if not parts:
        raise MissingInput(f"no finished run logs '{column}' in metrics.csv")
    return pd.concat(parts, ignore_index=True)


def over_rounds(runs, column: str, ylabel: str, hline: float | None = None, logy: bool = False):
    """``column`` over rounds, hue = method, one panel per data split; 95% band over seeds."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    data = frame(runs, column)
    splits = list(dict.fromkeys(data["split"]))
    fig, axes = plt.subplots(
        1, len(splits), figsize=(4.4 * len(splits) + 1.8, 3.6), squeeze=False, sharey=True, layout="constrained"
    )
    # a log axis only where the values span a decade: over a narrow range it prints 1.1 x 10^0 ticks
    logy = logy and data[column].min() > 0 and data[column].max() / data[column].min() > 10
    for ax, name in zip(axes[0], splits):
        sns.lineplot(
            data=data[data["split"] == name],
            x="round",
            y=column,
            hue="method",
            errorbar=("ci", 95),
            ax=ax,
            legend=ax is axes[0][-1],
        )
        if hline is not None:
            ax.axhline(hline, color="gray", lw=0.8, ls=":")
        if logy:
            ax.set_yscale("log")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("communication round")
        ax.set_ylabel(ylabel)
    methods_legend(axes[0][-1])
    return fig, data


def methods_legend(ax, extra=()) -> None:
    """The methods of an ``over_rounds`` figure, right of its last panel, followed by ``extra`` handles
    (line-style keys); the bands are the seeds' 95% interval."""
    handles, labels = ax.get_legend_handles_labels()
    handles = [*handles, *extra]
    ax.legend(
        handles,
        [*labels, *(h.get_label() for h in extra)],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
        title="95% band over seeds",
        title_fontsize=8,
    )
