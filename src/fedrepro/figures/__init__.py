"""The papers' analysis figures, computed from our runs (docs/figures.md).

A params file lists its figures in a ``figures:`` section, name -> spec. A spec names its ``kind``
(one of ``KINDS``), the ``experiment`` whose runs it reads, a ``select`` (partial run setting, as in
params/paper_results.yaml), what figure of the paper it ``reproduces`` and how our setting
``differs``. ``draw`` writes ``<name>.png`` and ``<name>.json`` (its caption); the report embeds both.

One module per figure family (ima, fedlaw, fedaware, fednova); each kind is a function
``(spec, runs, context) -> (matplotlib figure, what it shows)``. A figure that cannot be drawn from
the runs (no snapshots, a diverged run, no finished run) becomes an image that says why: the page
then explains itself instead of showing a hole, and the workflow goes on.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from fedrepro.rundir import RunDir
from fedrepro.errors import FedreproError


class MissingInput(FedreproError):
    """The runs lack what the figure needs (snapshots, a finished run, a column)."""


@dataclass
class Context:
    """What every kind may need besides the runs: where data lives, the device, the page's label."""
    data_root: Path | None = None
    device: str = "auto"
    quick: bool = False
    title: str = ""


@dataclass
class Run:
    id: str
    label: str
    setting: dict
    summary: dict
    metrics: object  # pandas DataFrame of the run's per-round metrics
    folder: RunDir
    extra: dict = field(default_factory=dict)

    @property
    def diverged(self) -> bool:
        return self.summary.get("status") == "diverged"


# kind -> (family, module attribute); the functions are looked up lazily so that importing the
# package does not import torch for the metrics-only figures
KINDS = {
    "landscape": ("ima", "landscape"),
    "landscape_rows": ("ima", "landscape_rows"),
    "interpolation": ("ima", "interpolation"),
    "locality": ("ima", "locality"),
    "client_averages": ("ima", "client_averages"),
    "coherence": ("fedlaw", "coherence"),
    "fedlaw_weights": ("fedlaw", "weights"),
    "fixed_gamma": ("fedlaw", "fixed_gamma"),
    "gws_sweep": ("fedlaw", "gws_sweep"),
    "gws_norms": ("fedlaw", "gws_norms"),
    "gws_ratio": ("fedlaw", "gws_ratio"),
    "model_norm": ("fedlaw", "model_norm"),
    "client_weights": ("fedlaw", "client_weights"),
    "accuracy": ("fedlaw", "accuracy"),
    "sweep_accuracy": ("fedlaw", "sweep_accuracy"),
    "cohort_classes": ("fedlaw", "cohort_classes"),
    "sharpness": ("fedlaw", "sharpness"),
    "elud": ("fedaware", "elud"),
    "cosines": ("fedaware", "cosines"),
    "coherence_lud": ("fedaware", "coherence_lud"),
    "split_dynamics": ("fedaware", "split_dynamics"),
    "momentum_ablation": ("fedaware", "momentum_ablation"),
    "quadratic": ("fednova", "quadratic"),
    "fedprox_alpha": ("fednova", "fedprox_alpha"),
    "loss_curves": ("fednova", "loss_curves"),
}
# kinds that read no runs (pure mathematics)
NO_RUNS = {"quadratic", "fedprox_alpha"}
# kinds that evaluate models on the test set: their rule asks for a GPU
EVALUATES = {"landscape", "landscape_rows", "interpolation", "client_averages"}
COMMON_KEYS = {"kind", "experiment", "select", "reproduces", "differs", "title"}
OPTIONS = {  # the options each kind reads, with their defaults
    "landscape": {"rounds": [], "globals": [], "resolution": 21, "margin": 0.25, "plane": "global_and_two_clients"},
    "landscape_rows": {"rows": [], "rounds": [], "globals": [], "resolution": 21, "margin": 0.25,
                       "plane": "three_clients", "quantity": "loss"},
    "interpolation": {"between": [], "rounds": [], "points": 21, "extend": 0.25, "for_each": {}},
    "locality": {},
    "client_averages": {"rounds": [-1], "cka_samples": 2000},
    "coherence": {},
    "fedlaw_weights": {},
    "fixed_gamma": {"axis": "alpha"},
    "gws_sweep": {"axis": "local_epochs"},
    "gws_norms": {},
    "gws_ratio": {},
    "model_norm": {},
    "client_weights": {},
    "accuracy": {},
    "sweep_accuracy": {"axis": "participation"},
    "cohort_classes": {},
    "sharpness": {},
    "elud": {},
    "cosines": {"rounds": [3, 60, 150]},
    "coherence_lud": {},
    "split_dynamics": {},
    "momentum_ablation": {},
    "quadratic": {"clients": 30, "dim": 20, "rounds": 1200, "lr": 0.05, "decay_rounds": [600, 900],
                  "decay": 5.0, "tau": 30, "tau_range": [1, 96], "tau_std": 20.0, "mu": 1.0, "seed": 0},
    "loss_curves": {"panels": [], "column": "global_train_loss"},
    "fedprox_alpha": {"clients": 30, "tau": 20.0, "tau_std": 20 ** 0.5, "seed": 0,
                      "alphas": [round(10 ** (-3 + 3 * i / 60), 6) for i in range(61)]},
}

CHOICES = {  # options with a closed set of values
    "loss_curves": {"column": ("global_train_loss", "train_loss")},
    "landscape": {"plane": ("global_and_two_clients", "three_clients")},
    "landscape_rows": {"plane": ("global_and_two_clients", "three_clients"), "quantity": ("loss", "error")},
}


def family(kind: str) -> str:
    return KINDS[kind][0]


def check(figures: dict, experiments: dict) -> dict[str, dict]:
    """Every figure spec with its defaults filled in; a clear error naming the figure and key otherwise."""
    from fedrepro.spec.schema import ConfigError

    problems, out = [], {}
    for name, spec in (figures or {}).items():
        where = f"figures.{name}"
        if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
            problems.append(f"{where}.kind = {spec.get('kind') if isinstance(spec, dict) else spec!r}: "
                            f"allowed are {', '.join(sorted(KINDS))}")
            continue
        kind = spec["kind"]
        unknown = set(spec) - COMMON_KEYS - set(OPTIONS[kind])
        if unknown:
            problems.append(f"{where}: unknown keys {sorted(unknown)} for kind {kind}; allowed: "
                            f"{sorted(COMMON_KEYS | set(OPTIONS[kind]))}")
        if kind not in NO_RUNS and spec.get("experiment") not in experiments:
            problems.append(f"{where}.experiment = {spec.get('experiment')!r}: allowed are the params file's "
                            f"experiments {sorted(experiments)}")
        if kind == "interpolation" and (not isinstance(spec.get("for_each", {}), dict)
                                        or len(spec.get("for_each", {})) > 1):
            problems.append(f"{where}.for_each = {spec['for_each']!r}: one key and its list of values")
        if kind == "gws_sweep" and spec.get("axis", "local_epochs") not in ("local_epochs", "alpha"):
            problems.append(f"{where}.axis = {spec['axis']!r}: allowed are local_epochs, alpha")
        if kind == "landscape_rows":
            rows = spec.get("rows")
            if (not isinstance(rows, list) or not rows
                    or not all(isinstance(r, dict) and set(r) == {"label", "select"} and isinstance(r["select"], dict)
                               for r in rows)):
                problems.append(f"{where}.rows = {rows!r}: a non-empty list of {{label, select}}, one row per setup "
                                f"(select: a partial run setting)")
        for key in ("resolution", "points", "cka_samples"):
            if key in spec and (not isinstance(spec[key], int) or spec[key] < 3):
                problems.append(f"{where}.{key} = {spec[key]!r}: an integer >= 3")
        for key, allowed in CHOICES.get(kind, {}).items():
            if key in spec and spec[key] not in allowed:
                problems.append(f"{where}.{key} = {spec[key]!r}: allowed are {', '.join(allowed)}")
        out[name] = {**OPTIONS[kind], "select": {}, "reproduces": "", "differs": "", **spec}
    if problems:
        raise ConfigError("\n".join(problems))
    return out


def select_runs(manifest: dict, runs_dir: Path, spec: dict) -> list[Run]:
    """The experiment's finished or diverged runs whose setting matches ``spec['select']``."""
    from fedrepro import paper

    exp = manifest["experiments"].get(spec["experiment"])
    if exp is None:
        raise MissingInput(f"experiment {spec['experiment']} is not in this params file's manifest")
    labels = {r["id"]: r["label"] for r in exp["runs"]}
    runs = [Run(r["id"], labels[r["id"]], r["setting"], r["summary"], r["metrics"], RunDir(Path(runs_dir) / r["id"]))
            for r in paper.load_runs(runs_dir, set(labels)) if paper.matches(r["setting"], spec["select"])]
    if not runs:
        raise MissingInput(f"no finished run of experiment {spec['experiment']} matches {spec['select'] or 'all'}")
    return runs


def finished(runs: list[Run]) -> list[Run]:
    """The finished runs; when there are none, say which diverged (a figure of nothing says so)."""
    done = [r for r in runs if r.summary.get("status") == "finished"]
    if not done:
        diverged = [r.label for r in runs if r.diverged]
        raise MissingInput(("diverged (loss became NaN/inf): " + ", ".join(diverged)) if diverged
                           else "no finished run")
    return done


def notice(text: str, title: str):
    """An image that says why the figure is not drawn."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 2.2))
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    ax.text(0.5, 0.5, "not drawn: " + text, ha="center", va="center", wrap=True, fontsize=10, color="darkred",
            transform=ax.transAxes)
    return fig


def legend_outside(ax, title: str | None = None) -> None:
    """Legends with many lines go right of the axes, where they cover no curve."""
    handles, labels = ax.get_legend_handles_labels()
    if not labels:
        return
    if len(labels) > 4:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title=title,
                  title_fontsize=8, frameon=False)
    else:
        ax.legend(fontsize=8, title=title, title_fontsize=8)


def draw(name: str, spec: dict, manifest: dict | None, runs_dir: str | Path, out: str | Path,
         context: Context) -> dict:
    """Write ``out`` (PNG) and its caption beside it (``.json``); return the caption record."""
    import importlib

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind = spec["kind"]
    module = importlib.import_module(f"fedrepro.figures.{family(kind)}")
    title = spec.get("title") or f"{spec.get('reproduces') or kind}"
    try:
        runs = [] if kind in NO_RUNS else select_runs(manifest, Path(runs_dir), spec)
        fig, shows = getattr(module, KINDS[kind][1])(spec, runs, context)
        drawn, reason = True, ""
    except MissingInput as err:
        fig, shows = notice(str(err), title), getattr(module, "SHOWS", {}).get(kind, kind)
        drawn, reason = False, str(err)
        print(f"figure {name}: not drawn: {err}")
    if context.quick:
        # a constrained layout makes room for the label itself; any other gets it above the top edge
        # (the axes titles reach it), and the tight bounding box of savefig takes it in
        from matplotlib.layout_engine import ConstrainedLayoutEngine
        constrained = isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
        above = {} if constrained else {"y": 1.0, "va": "bottom"}
        fig.suptitle("QUICK profile (reduced setting, not comparable to the paper)", fontsize=9, color="gray",
                     **above)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)
    record = {"name": name, "kind": kind, "family": family(kind), "title": title, "shows": shows,
              "reproduces": spec.get("reproduces", ""), "differs": spec.get("differs", ""),
              "drawn": drawn, "reason": reason, "quick": context.quick, "image": out.name}
    record["caption"] = caption(record)
    out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    return record


def caption(record: dict) -> str:
    parts = [record["shows"].rstrip(".") + "."]
    if record["reproduces"]:
        parts.append(f"Reproduces {record['reproduces']}.")
    if record["differs"]:
        parts.append(f"Differs from the paper: {record['differs'].rstrip('.')}.")
    if record["quick"]:
        parts.append("Quick profile: reduced clients, rounds and local work; not comparable to the paper.")
    if not record["drawn"]:
        parts.append(f"Not drawn: {record['reason']}.")
    return " ".join(parts)


def load_captions(folder: str | Path) -> list[dict]:
    """The figures a figures folder holds, for the report page, in family order."""
    order = ["ima", "fedlaw", "fedaware", "fednova"]
    records = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]
    return sorted(records, key=lambda r: (order.index(r["family"]) if r["family"] in order else 9, r["name"]))


def finite(values) -> bool:
    return any(math.isfinite(v) for v in values)
