"""The papers' analysis figures, computed from our runs (docs/figures.md).

A params file lists its figures in a ``figures:`` section, name -> spec. A spec names its ``kind``
(one of ``KINDS``), the ``experiment`` whose runs it reads, a ``select`` (partial run setting, as in
params/paper_results.yaml), what figure of the paper it ``reproduces`` and how our setting
``differs``. ``draw`` writes ``<name>.png`` and ``<name>.json`` (its caption); the report embeds both.

One module per figure family (ima, fedlaw, fedaware, fednova); each kind is the function of its name there,
``(spec, runs, context) -> (matplotlib figure, what it shows)``, and its entry in the family's ``<family>.yaml``
declares what it shows, its options with their defaults, and whether it reads runs or evaluates models. A
figure that cannot be drawn from the runs (no snapshots, a diverged run, no finished run) becomes an image that
says why: the page then explains itself instead of showing a hole, and the workflow goes on.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema

from fedrepro import catalog
from fedrepro.errors import FedreproError
from fedrepro.run.rundir import RunDir


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


FIELDS = {"shows", "options", "choices", "reads_runs", "evaluates", "shapes"}  # what a kind's declaration may say


def declared(folder: Path = Path(__file__).parent) -> dict[str, dict]:
    """kind -> its declaration, from the ``<family>.yaml`` beside each family module: adding a kind is a function
    in the module and its entry in the fragment, nothing more. A kind declared twice, or a declaration with a
    field it cannot have, is refused naming the file."""
    kinds: dict[str, dict] = {}
    for name, fragment in catalog.fragments(folder).items():  # the one reader of fragments
        path = Path(folder) / f"{name}.yaml"
        for kind, declaration in fragment.items():
            if kind in kinds:
                raise FedreproError(f"{path}: figure kind {kind} is declared in {kinds[kind]['family']}.yaml too")
            if "shows" not in declaration or set(declaration) - FIELDS:
                raise FedreproError(
                    f"{path}: figure kind {kind} declares {sorted(declaration)}; it needs shows and "
                    f"may have {', '.join(sorted(FIELDS - {'shows'}))}"
                )
            kinds[kind] = {
                "family": path.stem,
                "options": {},
                "choices": {},
                "reads_runs": True,
                "evaluates": False,
                "shapes": {},
                **declaration,
            }
    return kinds


KINDS = declared()
# the workflow's questions: which figures need no runs, which evaluate models (their job asks for a GPU)
NO_RUNS = {kind for kind, declaration in KINDS.items() if not declaration["reads_runs"]}
EVALUATES = {kind for kind, declaration in KINDS.items() if declaration["evaluates"]}
COMMON_KEYS = {"kind", "experiment", "select", "reproduces", "differs", "title"}


def family(kind: str) -> str:
    return KINDS[kind]["family"]


def described(kind: str, **fill) -> str:
    """The declared first sentence of a kind's caption, its placeholders filled."""
    return KINDS[kind]["shows"].format(**fill)


def check(figures: dict, experiments: dict) -> dict[str, dict]:
    """Every figure spec with its defaults filled in; a clear error naming the figure and key otherwise."""
    from fedrepro.configure.schema import ConfigError

    problems, out = [], {}
    for name, spec in (figures or {}).items():
        where = f"figures.{name}"
        if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
            problems.append(
                f"{where}.kind = {spec.get('kind') if isinstance(spec, dict) else spec!r}: "
                f"allowed are {', '.join(sorted(KINDS))}"
            )
            continue
        kind = spec["kind"]
        options = KINDS[kind]["options"]
        unknown = set(spec) - COMMON_KEYS - set(options)
        if unknown:
            problems.append(
                f"{where}: unknown keys {sorted(unknown)} for kind {kind}; allowed: "
                f"{sorted(COMMON_KEYS | set(options))}"
            )
        if KINDS[kind]["reads_runs"] and spec.get("experiment") not in experiments:
            problems.append(
                f"{where}.experiment = {spec.get('experiment')!r}: allowed are the params file's "
                f"experiments {sorted(experiments)}"
            )
        for key, shape in KINDS[kind]["shapes"].items():  # the kind's fragment declares each option's shape
            value = spec.get(key, options.get(key))
            if not jsonschema.Draft202012Validator(shape).is_valid(value):
                problems.append(f"{where}.{key} = {value!r}: {shape['description']}")
        for key in ("resolution", "points", "cka_samples"):
            if key in spec and (not isinstance(spec[key], int) or spec[key] < 3):
                problems.append(f"{where}.{key} = {spec[key]!r}: an integer >= 3")
        for key, allowed in KINDS[kind]["choices"].items():
            if key in spec and spec[key] not in allowed:
                problems.append(f"{where}.{key} = {spec[key]!r}: allowed are {', '.join(allowed)}")
        out[name] = {**options, "select": {}, "reproduces": "", "differs": "", **spec}
    if problems:
        raise ConfigError("\n".join(problems))
    return out


def select_runs(manifest: dict, runs_dir: Path, spec: dict) -> list[Run]:
    """The experiment's finished or diverged runs whose setting matches ``spec['select']``."""
    from fedrepro.report import paper

    exp = manifest["experiments"].get(spec["experiment"])
    if exp is None:
        raise MissingInput(f"experiment {spec['experiment']} is not in this params file's manifest")
    labels = {r["id"]: r["label"] for r in exp["runs"]}
    runs = [
        Run(r["id"], labels[r["id"]], r["setting"], r["summary"], r["metrics"], RunDir(Path(runs_dir) / r["id"]))
        for r in paper.load_runs(runs_dir, set(labels))
        if paper.matches(r["setting"], spec["select"])
    ]
    if not runs:
        raise MissingInput(f"no finished run of experiment {spec['experiment']} matches {spec['select'] or 'all'}")
    return runs


def finished(runs: list[Run]) -> list[Run]:
    """The finished runs; when there are none, say which diverged (a figure of nothing says so)."""
    done = [r for r in runs if r.summary.get("status") == "finished"]
    if not done:
        diverged = [r.label for r in runs if r.diverged]
        raise MissingInput(
            ("diverged (loss became NaN/inf): " + ", ".join(diverged)) if diverged else "no finished run"
        )
    return done


def notice(text: str, title: str):
    """An image that says why the figure is not drawn."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 2.2))
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    ax.text(
        0.5,
        0.5,
        "not drawn: " + text,
        ha="center",
        va="center",
        wrap=True,
        fontsize=10,
        color="darkred",
        transform=ax.transAxes,
    )
    return fig


def legend_outside(ax, title: str | None = None) -> None:
    """Legends with many lines go right of the axes, where they cover no curve."""
    handles, labels = ax.get_legend_handles_labels()
    if not labels:
        return
    if len(labels) > 4:
        ax.legend(
            handles,
            labels,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=8,
            title=title,
            title_fontsize=8,
            frameon=False,
        )
    else:
        ax.legend(fontsize=8, title=title, title_fontsize=8)


def draw(name: str, spec: dict, manifest: dict | None, runs_dir: str | Path, out: str | Path, context: Context) -> dict:
    """Write ``out`` (PNG) and its caption beside it (``.json``); return the caption record."""
    import importlib

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind = spec["kind"]
    module = importlib.import_module(f"fedrepro.report.figures.{family(kind)}")
    title = spec.get("title") or f"{spec.get('reproduces') or kind}"
    try:
        runs = select_runs(manifest, Path(runs_dir), spec) if KINDS[kind]["reads_runs"] else []
        fig, what = getattr(module, kind)(spec, runs, context)
        drawn, reason = True, ""
    except MissingInput as err:
        fig, what = notice(str(err), title), KINDS[kind]["shows"]
        drawn, reason = False, str(err)
        print(f"figure {name}: not drawn: {err}")
    if context.quick:
        # a constrained layout makes room for the label itself; any other gets it above the top edge
        # (the axes titles reach it), and the tight bounding box of savefig takes it in
        from matplotlib.layout_engine import ConstrainedLayoutEngine

        constrained = isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
        above = {} if constrained else {"y": 1.0, "va": "bottom"}
        fig.suptitle("QUICK profile (reduced setting, not comparable to the paper)", fontsize=9, color="gray", **above)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)
    record = {
        "name": name,
        "kind": kind,
        "family": family(kind),
        "title": title,
        "shows": what,
        "reproduces": spec.get("reproduces", ""),
        "differs": spec.get("differs", ""),
        "drawn": drawn,
        "reason": reason,
        "quick": context.quick,
        "image": out.name,
    }
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
