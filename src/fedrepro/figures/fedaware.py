"""FedAWARE figures: e-LUD over rounds, cosine matrices of client updates, coherence against LUD."""
from __future__ import annotations

import numpy as np

from fedrepro.figures import MissingInput, finished, legend_outside
from fedrepro.figures.curves import frame, method, over_rounds, split

SHOWS = {
    "elud": "Empirical local update diversity e-LUD = sqrt(mean_i ||Delta_i||^2 / ||mean_i Delta_i||^2) "
            "(dimensionless; log scale where it spans a decade) of the cohort's updates over rounds, per method",
    "cosines": "Cosine similarity of every pair of client updates of one cohort (colour from -1 to 1) at the "
               "listed rounds, with the round's client coherence (mean off-diagonal cosine)",
    "coherence_lud": "Client coherence (mean pairwise cosine) against e-LUD, one point per round and run, "
                     "coloured by data split",
}


def elud(spec, runs, context):
    fig, _ = over_rounds(runs, "e_lud", "e-LUD (dimensionless)", logy=True)
    return fig, SHOWS["elud"]


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
        raise MissingInput(f"run {run.id} kept cosine matrices of rounds {have}, none of the asked {wanted}; "
                           f"list them in snapshots.cosine_rounds")
    from matplotlib.ticker import MaxNLocator

    from fedrepro import partition
    from fedrepro.identity import partition_setting

    groups = partition.groups(partition_setting(run.setting))
    boundary = len(groups["balanced"]) if groups and run.setting["participation"] == 1.0 else None
    fig, axes = plt.subplots(1, len(shown), figsize=(4.0 * len(shown) + 1.2, 3.6), squeeze=False,
                             constrained_layout=True)
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
    shows = SHOWS["cosines"] + f" ({method(run)}, {split(run)}, seed {run.setting['seed']})"
    if missing:
        shows += f"; rounds {missing} were not kept"
    if boundary is not None:
        shows += f"; the lines part the balanced clients 0-{boundary - 1} from the imbalanced ones"
    return fig, shows


def coherence_lud(spec, runs, context):
    import matplotlib.pyplot as plt
    import seaborn as sns

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
    return fig, SHOWS["coherence_lud"] + f" ({', '.join(sorted(set(data['method'])))})"
