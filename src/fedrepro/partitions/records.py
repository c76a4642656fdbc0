"""A partition folder: its client index lists, class counts, record and heatmap, written and read here.

The record says how heterogeneous the clients are, and the heatmap shows it.

The statistic is the mean, over clients, of the total-variation distance between a client's label distribution
and the global one (all clients' samples pooled):

    TV_i = 1/2 * sum_k | n_ik / n_i - N_k / N |,    heterogeneity = mean_i TV_i  (clients with no sample left out)

0 when every client holds the global mix (IID), near 1 when each client holds classes few others hold. A
Dirichlet split with alpha = 0.1 lies far above one with alpha = 100, so a partitioner that ignored alpha would
show here and in the heatmap's caption.

Outside every partition id and run id (``identity.OUTSIDE_RUNS``): the split is its kind module's (whose code is
part of a partition's id); this module only stores and describes what it made, so it can say more without
renaming a partition or a run.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np

from fedrepro.identity import partition_identity
from fedrepro.partitions.base import PartitionError, class_counts, content_hash
from fedrepro.records import read_json

MEASURE = "mean total-variation distance of the clients' label distributions from the global one"


def label_tv(counts: np.ndarray) -> np.ndarray:
    """Per client (a row of ``counts``: samples per class), the total-variation distance of its label
    distribution from the pooled one; NaN for a client with no sample."""
    counts = np.asarray(counts, dtype=float)
    pooled = counts.sum(0) / counts.sum()
    sizes = counts.sum(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = counts / sizes
    tv = 0.5 * np.abs(shares - pooled).sum(1)
    tv[sizes[:, 0] == 0] = np.nan
    return tv


def heterogeneity(counts: np.ndarray) -> dict:
    """The partition record's ``heterogeneity``: the mean (and spread) of ``label_tv`` over clients with data."""
    tv = label_tv(counts)
    tv = tv[~np.isnan(tv)]
    return {
        "measure": MEASURE,
        "mean_tv": round(float(tv.mean()), 4),
        "min_tv": round(float(tv.min()), 4),
        "max_tv": round(float(tv.max()), 4),
        "clients": int(len(tv)),
    }


def caption(stat: dict) -> str:
    return f"label heterogeneity: mean TV from the global label mix {stat['mean_tv']:.3f} (0: IID; 1: disjoint)"


def save(out_dir: str | Path, setting: dict, labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> dict:
    """Write the partition folder: indices, class counts (csv), its record (setting, content hash, sizes,
    heterogeneity) and the heatmap captioned with the heterogeneity."""
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "clients.npz", **{f"client_{i}": p for i, p in enumerate(parts)})
    counts = class_counts(labels, parts, num_classes)
    frame = pd.DataFrame(counts, columns=[f"class_{k}" for k in range(num_classes)])
    frame.index.name = "client"
    frame.to_csv(out / "counts.csv")
    info = {
        "setting": setting,
        "content_hash": content_hash(parts),
        "num_samples": int(sum(map(len, parts))),
        "sizes": {
            "min": int(counts.sum(1).min()),
            "max": int(counts.sum(1).max()),
            "mean": float(counts.sum(1).mean()),
        },
        "heterogeneity": heterogeneity(counts),
    }
    heatmap(counts, out / "heatmap.png", setting, info["heterogeneity"])
    (out / "partition.json").write_text(json.dumps(info, indent=2))
    return info


def heatmap(counts: np.ndarray, path: Path, setting: dict, stat: dict) -> None:
    """Samples per client and class, titled with the setting and captioned with the heterogeneity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    width = min(14, max(4.0, 2 + 0.12 * counts.shape[0]))
    fig, ax = plt.subplots(figsize=(width, 3.2))
    sns.heatmap(counts.T, cmap="viridis", ax=ax, cbar_kws={"label": "samples"})
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    title = f"{setting['dataset']}, {setting['num_clients']} clients: " + ", ".join(
        f"{k}={v}" for k, v in setting.items() if k not in ("dataset", "num_clients")
    )
    # about 13 characters of 8-point text per inch of the axes: the title wraps instead of running off
    chars = int(13 * (width - 1.2))
    ax.set_title(textwrap.fill(title, chars) + "\n" + textwrap.fill(caption(stat), chars), fontsize=8, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def of_folder(folder: str | Path) -> dict | None:
    """A partition folder's heterogeneity: its record's, else computed from its ``counts.csv`` (records written
    before the statistic existed, kept evidence among them); None with neither."""
    folder = Path(folder)
    record = folder / "partition.json"
    if record.is_file():
        stat = json.loads(record.read_text()).get("heterogeneity")
        if stat:
            return stat
    counts = folder / "counts.csv"
    if not counts.is_file():
        return None
    import pandas as pd

    frame = pd.read_csv(counts, index_col="client")
    return heterogeneity(frame.to_numpy())


def load(out_dir: str | Path, setting: dict | None = None) -> list[np.ndarray]:
    """The clients' index arrays; with ``setting``, checked to be that partition: partition.json must
    describe ``setting`` and record the content hash of the arrays read (a file copied over another
    partition's, or altered, is refused)."""
    out = Path(out_dir)
    path = out / "clients.npz"
    try:
        with np.load(path) as data:
            parts = [data[f"client_{i}"] for i in range(len(data.files))]
    except Exception as err:  # noqa: BLE001 - BadZipFile, zlib.error, OSError, KeyError, ValueError
        raise PartitionError(
            f"{path}: cannot be read ({type(err).__name__}: {err}); delete {out} and rerun to make it again"
        ) from None
    if setting is not None:
        info = read_json(out / "partition.json")
        if partition_identity(info.get("setting") or {}) != partition_identity(setting):
            raise PartitionError(
                f"{out / 'partition.json'} describes {json.dumps(info.get('setting'), sort_keys=True)}, "
                f"not this run's partition {json.dumps(setting, sort_keys=True)}"
            )
        if info.get("content_hash") != content_hash(parts):
            raise PartitionError(
                f"{path} holds other indices (content hash {content_hash(parts)}) than "
                f"{out / 'partition.json'} records ({info.get('content_hash')}); delete {out} and "
                f"rerun to make it again"
            )
    return parts
