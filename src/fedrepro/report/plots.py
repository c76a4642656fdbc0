"""The report page's own plots, as base64 PNG: curves with their bands over seeds, the ablation over every
numeric grid axis, a tuning's criterion per candidate; and which curves coincide."""

from __future__ import annotations

import base64
import io

import numpy as np
import pandas as pd

from fedrepro.report.frames import SEP


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


CURVES = [
    ("test_acc", "test accuracy %", 100.0),
    ("test_loss", "test loss", 1.0),
    ("train_loss", "train loss (cohort mean)", 1.0),
]


def short_labels(labels: list[str]) -> tuple[dict[str, str], list[str]]:
    """Labels without the parts (`` · ``-separated) that every label shares; those parts, once."""
    split = {label: label.split(SEP) for label in labels}
    common = [part for part in split[labels[0]] if all(part in parts for parts in split.values())] if labels else []
    if len(labels) < 2:
        common = []
    short = {label: SEP.join(p for p in parts if p not in common) or label for label, parts in split.items()}
    return short, common


def band_text(seeds: int) -> str:
    """What the band around a mean curve is, for the number of seeds behind it."""
    if seeds <= 1:
        return "one seed per line, no band"
    return f"mean over {seeds} seeds; band: lowest to highest seed"


SAME_CURVE = 0.002  # test accuracy within 0.2 points (20 of 10,000 test images): float rounding, not method


def coinciding(curve: pd.DataFrame, column: str = "test_acc", atol: float = SAME_CURVE) -> list[tuple[str, str]]:
    """Pairs of labels (same experiment) whose every seed has the same curve, round by round, up to
    ``atol``: methods that coincide by construction (FedNova and FedAvg when every client runs the same
    number of steps), where only floating-point rounding differs."""
    if curve.empty or column not in curve:
        return []
    series = {}
    for (label, seed), group in curve.groupby(["label", "seed"], sort=False):
        series.setdefault(label, {})[seed] = group.sort_values("round")[column].to_numpy()
    labels, pairs, taken = list(series), [], set()
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            if b in taken or set(series[a]) != set(series[b]):
                continue
            if all(
                len(series[a][s]) == len(series[b][s])
                and np.allclose(series[a][s], series[b][s], rtol=0, atol=atol, equal_nan=True)
                for s in series[a]
            ):
                pairs.append((a, b))
                taken.add(b)
    return pairs


def coincide_note(a: str, b: str, variants: dict[str, dict]) -> str:
    """One sentence for the page: which two lines coincide, and why when the reason is known."""
    methods = {variants.get(a, {}).get("algorithm"), variants.get(b, {}).get("algorithm")}
    why = ""
    if methods == {"fedavg", "fednova"}:
        why = (
            " FedNova normalises each client's update by its number of local steps; when every client runs "
            "the same number of steps, that is FedAvg exactly."
        )
    return (
        f"{b} coincides with {a}: the same test accuracy (within {SAME_CURVE * 100:g} points) in every round "
        f"of every seed; its curve is drawn dashed over {a}'s.{why}"
    )


def collapse_points(curve: pd.DataFrame) -> pd.DataFrame:
    """One row per collapse episode (fedrepro.report.collapses) of each run in ``curve`` (its rows per run and round):
    run, method (when the frame has one), seed, round and accuracy (points) of the episode's lowest round."""
    from fedrepro import catalog
    from fedrepro.report import collapses

    rows = []
    if curve.empty or "test_acc" not in curve:
        return pd.DataFrame(columns=["run", "method", "seed", "round", "acc", "text"])
    for run, part in curve.groupby("run", sort=False):
        dataset = str(part["partition"].iloc[0]).split("-")[0] if "partition" in part else ""
        classes = catalog.DATASETS.get(dataset, {}).get("num_classes", 10)
        record = collapses.detect(part["round"].tolist(), part["test_acc"].tolist(), classes)
        for e in record["episodes"]:
            rows.append(
                {
                    "run": run,
                    "method": part["method"].iloc[0] if "method" in part else None,
                    "seed": part["seed"].iloc[0] if "seed" in part else None,
                    "round": e["low_round"],
                    "acc": e["low_acc"],
                    "text": collapses.describe({**record, "episodes": [e]}),
                }
            )
    return pd.DataFrame(rows, columns=["run", "method", "seed", "round", "acc", "text"])


def curves_figure(curve: pd.DataFrame, same_as: dict[str, str] | None = None) -> str | None:
    """One row per partition (so a panel compares methods on the same data), one column per metric.

    A line that coincides with another (``same_as``: label -> the label it equals) is drawn dashed on
    top, so that neither hides the other. Legends sit outside the axes; line names drop what all
    lines of the figure share (said in the title instead)."""
    if curve.empty:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    same_as = same_as or {}
    curve = curve.assign(split=curve["partition"].str.split("-").str[1])
    curve = curve.assign(
        method=[label.replace(f"{SEP}{split}", "") for label, split in zip(curve["label"], curve["split"])]
    )
    short, common = short_labels(list(dict.fromkeys(curve["method"])))
    dashed = {
        (split, short[m])
        for label, m, split in zip(curve["label"], curve["method"], curve["split"])
        if label in same_as
    }
    curve = curve.assign(method=curve["method"].map(short))
    splits = list(dict.fromkeys(curve["split"]))
    seeds = int(curve.groupby("label")["seed"].nunique().max())
    methods = list(dict.fromkeys(curve["method"]))
    palette = dict(zip(methods, sns.color_palette("tab10", len(methods))))
    fig, axes = plt.subplots(len(splits), len(CURVES), figsize=(14, 3.2 * len(splits)), squeeze=False)
    collapsed: set[str] = set()
    for row, split in zip(axes, splits):
        part = curve[curve["split"] == split]
        for ax, (column, title, scale) in zip(row, CURVES):
            ax.set_title(f"{split}: {title}", fontsize=10)
            source = part.dropna(subset=[column])
            if source.empty:  # e.g. only diverged runs: nothing finite to draw
                ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes)
                continue
            source = source.assign(**{column: source[column] * scale})
            drawn = [m for m in methods if m in set(source["method"])]
            sns.lineplot(
                data=source,
                x="round",
                y=column,
                hue="method",
                hue_order=drawn,
                palette=palette,
                legend=False,
                ax=ax,
                errorbar=("pi", 100) if seeds > 1 else None,
            )
            for line, method in zip(ax.get_lines(), drawn):
                if (split, method) in dashed:
                    line.set_linestyle((0, (4, 3)))
                    line.set_linewidth(2.2)
                    line.set_zorder(5)
            if column == "test_acc":  # each collapse at its lowest round, in its method's colour
                for (method, _), lows in collapse_points(part).groupby(["method", "run"]):
                    collapsed.add(method)
                    ax.scatter(
                        lows["round"],
                        lows["acc"],
                        marker="v",
                        s=36,
                        color=palette[method],
                        edgecolors="black",
                        linewidths=0.6,
                        zorder=6,
                    )
            ax.set_ylabel("")
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    handles = [matplotlib.lines.Line2D([], [], color=palette[m], label=m) for m in methods]
    if collapsed:
        handles.append(
            matplotlib.lines.Line2D(
                [],
                [],
                color="grey",
                marker="v",
                linestyle="",
                markeredgecolor="black",
                label="collapse: a run's accuracy more than 20 points\nbelow its best "
                "so far, or at chance (its lowest round)",
            )
        )
    if dashed:
        handles.append(
            matplotlib.lines.Line2D([], [], color="grey", linestyle="--", label="dashed: same curve as another line")
        )
    fig.tight_layout()
    title = band_text(seeds) + (f"; all lines: {SEP.join(common)}" if common else "")
    fig.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.0, 0.98),
        fontsize=9,
        frameon=False,
        title=title.replace("; ", "\n"),
        title_fontsize=9,
        alignment="left",
    )
    return _png(fig)


def ablation_figure(runs: pd.DataFrame) -> str | None:
    """Final accuracy against every numeric grid axis with three or more values (α, window P,
    start round, participation, local epochs, ...), one line per value of the other axes."""
    done = runs[runs["status"] == "finished"] if len(runs) else runs
    if done.empty:
        return None
    variants = pd.DataFrame(list(done["variant"]), index=done.index)
    axes = [
        c
        for c in variants
        if c != "algorithm" and pd.api.types.is_numeric_dtype(variants[c]) and variants[c].nunique() >= 3
    ]
    if not axes:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, axs = plt.subplots(1, len(axes), figsize=(5.5 * len(axes), 3.8), squeeze=False)
    for ax, axis in zip(axs[0], axes):
        others = [c for c in variants if c != axis]
        lines = (
            [
                " · ".join(str(v) if k == "algorithm" else f"{k}={v}" for k, v in row.items())
                for row in variants[others].to_dict("records")
            ]
            if others
            else "all"
        )
        if not isinstance(lines, str):
            short, common = short_labels(list(dict.fromkeys(lines)))
            lines = [short[line] for line in lines]
        else:
            common = []
        frame = done.assign(value=variants[axis], acc=done["final_acc"] * 100, line=lines)
        seeds = int(frame.groupby(["line", "value"])["seed"].nunique().max())
        sns.lineplot(
            data=frame, x="value", y="acc", hue="line", marker="o", ax=ax, errorbar=("pi", 100) if seeds > 1 else None
        )
        ax.set_xlabel(axis)
        ax.set_ylabel("final accuracy % (last 10 rounds)")
        ax.set_title(f"ablation over {axis}", fontsize=10)
        if frame["value"].min() > 0 and frame["value"].max() / frame["value"].min() >= 20:
            ax.set_xscale("log")
        title = band_text(seeds) + (f"\nall lines: {SEP.join(common)}" if common else "")
        ax.legend(fontsize=7, title=title, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return _png(fig)


def tuning_figure(entry: dict, choice: dict) -> str | None:
    """The criterion per candidate: against the value where one numeric axis is tuned (a log axis where the
    values span more than a decade), else per candidate label; diverged candidates are marked at the bottom."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cands = choice["candidates"]
    axes = list(entry["grid"])
    numeric = (
        len(axes) == 1
        and axes[0] != "setting"
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in entry["grid"][axes[0]])
    )
    xs = [float(v) for v in entry["grid"][axes[0]]] if numeric else list(range(len(cands)))
    fig, ax = plt.subplots(figsize=(4.2, 2.8))
    ok = [(x, c["value"]) for x, c in zip(xs, cands) if c["value"] is not None]
    if ok:
        ax.plot(*zip(*sorted(ok)), "o-", color="tab:blue")
        low = min(v for _, v in ok)
        bad = [x for x, c in zip(xs, cands) if c["value"] is None]
        ax.plot(bad, [low] * len(bad), "x", color="tab:red", label="diverged") if bad else None
        best = cands[choice["chosen_index"]]
        ax.plot([xs[choice["chosen_index"]]], [best["value"]], "*", ms=14, color="tab:orange", label="chosen")
        ax.legend(fontsize=7)
    if numeric:
        positive = [x for x in xs if x > 0]
        if positive and len(positive) == len(xs) and max(positive) / min(positive) > 20:
            ax.set_xscale("log")
        ax.set_xlabel(axes[0])
    else:
        ax.set_xticks(xs, [c["label"] for c in cands], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(choice["criterion"].replace("_", " "), fontsize=8)
    ax.set_title(entry["label"], fontsize=8)
    return _png(fig)
