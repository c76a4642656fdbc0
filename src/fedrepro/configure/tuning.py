"""The papers' tuning as a workflow stage: a value picked from a grid on a validation split, then the
experiment's runs with it.

An experiment of a params file may declare ``tune`` blocks (the schema: schemas/params.schema.yaml):

    tune:
      - when: {algorithm: fedprox}             # the grid points it tunes: keys of their resolved setting
        grid: {fedprox.mu: [0.1, 0.01, 0.001]}  # the candidates, a grid as the experiment's own
        seeds: [101]                            # the tuning runs' seeds
        criterion: mean_final_val_acc           # how the candidates are ranked (CRITERIA)
        validation: 0.1                         # each client's share kept apart and scored, never the test set
        without: [ima]                          # plug-ins the tuning runs leave out: tuned on the bare method

For every grid point a block matches, each candidate runs at each tuning seed with ``evaluation.validation``
set (an ordinary run, content-addressed like any other); the workflow's ``tune`` rule ranks the candidates
(``choose``), and the final run is the grid point with the winner merged in. The chosen value is part of the
final run's setting, so of its identity: a changed tuning grid reruns the tuning runs it adds, and the final
runs only where the choice moves. Grid points whose tuning problem is the same (the same candidates' runs, the
same criterion) share one tuning: fedprox and fedprox+ima with ``without: [ima]``, or two experiments.

Choosing: the candidate with the best criterion, the mean over the tuning seeds of each run's final value (the
summary's mean of the last 10 evaluated rounds). A candidate any of whose runs diverged (or whose value is not
finite) loses to every other. Ties, exact equality of the means, go to the candidate listed first in the tune
grid (the grid's product order): the params file's order, the same on every machine.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from fedrepro.configure import conditions, registry
from fedrepro.configure.paramsfile import check_name
from fedrepro.configure.schema import ConfigError, closest
from fedrepro.configure.settings import Run, deep_merge, grid_points, resolve, split_algorithm, variant_label
from fedrepro.errors import FedreproError
from fedrepro.identity import partition_id, run_id, stable_hash


class TuningError(FedreproError, RuntimeError):
    """The tuning runs cannot pick a value (every candidate diverged, a run was scored on the test set)."""


@dataclass(frozen=True)
class Criterion:
    key: str  # the summary's value per run
    higher_is_better: bool
    says: str


CRITERIA = {
    "mean_final_val_acc": Criterion("final_acc", True, "mean over the tuning seeds of the final validation accuracy"),
    "mean_final_val_loss": Criterion("final_loss", False, "mean over the tuning seeds of the final validation loss"),
}
DEFAULTS = {"criterion": "mean_final_val_acc", "validation": 0.1, "without": []}


@dataclass
class Block:
    """One tune block of one experiment, checked."""

    where: str  # experiments.<name>.tune[i]: how errors name it
    when: dict
    grid: dict
    seeds: list
    criterion: str
    validation: float
    without: list

    def matches(self, setting: dict) -> bool:
        for key, wanted in self.when.items():
            value = conditions.lookup(setting, key)
            allowed = wanted if isinstance(wanted, list) and key != "plugins" else [wanted]
            if key == "plugins":
                value, allowed = sorted(value or []), [sorted(a) for a in allowed]
            if value not in allowed:
                return False
        return True


def blocks(name: str, experiment: dict) -> list[Block]:
    """The experiment's tune blocks, checked beyond their schema: criterion, the keys of ``when``, the plug-ins
    of ``without``."""
    raw = experiment.get("tune") or []
    known = set(registry.setting_schema()["properties"])
    out = []
    for i, block in enumerate(raw):
        where = f"experiments.{name}.tune[{i}]"
        block = {**DEFAULTS, **block}
        if block["criterion"] not in CRITERIA:
            raise ConfigError(f"{where}: criterion '{block['criterion']}' is unknown; known: {', '.join(CRITERIA)}")
        for key in block["when"]:
            if key.split(".")[0] not in known:
                guess = closest(key.split(".")[0], sorted(known))
                raise ConfigError(
                    f"{where}: when: '{key}' is no setting{'; did you mean ' + guess + '?' if guess else ''}"
                )
        unknown = [p for p in block["without"] if p not in registry.PLUGINS]
        if unknown:
            raise ConfigError(
                f"{where}: without: {', '.join(unknown)} is no plug-in; known: {', '.join(sorted(registry.PLUGINS))}"
            )
        if "seed" in block["grid"]:
            raise ConfigError(f"{where}: grid: 'seed' is no value to tune; the tuning runs' seeds are 'seeds'")
        out.append(
            Block(
                where,
                block["when"],
                block["grid"],
                list(block["seeds"]),
                block["criterion"],
                float(block["validation"]),
                list(block["without"]),
            )
        )
    return out


def claim(candidates: list[Block], setting: dict) -> Block | None:
    """The one block that tunes this grid point's setting, or None; two blocks tuning one point are refused
    (joint tuning is one block with several grid axes)."""
    matching = [b for b in candidates if b.matches(setting)]
    if len(matching) > 1:
        raise ConfigError(
            f"{matching[0].where} and {matching[1].where} both match the grid point of "
            f"{'+'.join([setting['algorithm'], *setting['plugins']])}; tune several values together "
            f"with one block whose grid has several axes"
        )
    return matching[0] if matching else None


def _flat(point: dict) -> dict:
    return variant_label(point)


def label(point: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in _flat(point).items())


def stage(block: Block, raw: dict, point: dict, experiment: str) -> tuple[str, dict, list[Run], dict]:
    """(tuning id, its manifest entry, its runs, the pending final run) for one grid point a block tunes.

    Every candidate is checked as a tuning run and as the final run it would give, so that no choice can
    produce a run that fails its checks after the tuning ran."""
    bare = split_algorithm(json.loads(json.dumps(raw)))
    bare["plugins"] = [p for p in bare["plugins"] if p not in block.without]
    where = f"{block.where} (grid point {json.dumps(point, sort_keys=True)})"
    candidates, runs, ids = [], [], {}
    variant = _flat(point)
    for cand in grid_points(block.grid):
        resolve(deep_merge(raw, cand), where)  # the final run it would give
        cand_runs = []
        for seed in block.seeds:
            setting = resolve(
                deep_merge(bare, {**cand, "seed": seed, "evaluation": {"validation": block.validation}}), where
            )
            rid = check_name(run_id(setting), "run name")
            if rid in ids:
                raise ConfigError(
                    f"{block.where}: grid: candidates {label(ids[rid])} and {label(cand)} give the same "
                    f"run: the setting they change is not read by "
                    f"{'+'.join([setting['algorithm'], *setting['plugins']])}"
                )
            ids[rid] = cand
            cand_runs.append(rid)
            runs.append(Run(rid, experiment, setting, {**variant, **_flat(cand)}, tuning=""))
        candidates.append({"point": cand, "label": label(cand), "runs": cand_runs})
    selection = {"criterion": block.criterion, "candidates": candidates}
    first = runs[0].setting
    name = "-".join(
        [
            "tune",
            "+".join([first["algorithm"], *first["plugins"]]),
            partition_id(first).rsplit("-", 2)[0],
            first["model"],
            "_".join(block.grid),
        ]
    )
    tid = check_name(f"{name}-{stable_hash(selection)}", "tuning name")
    for run in runs:
        run.tuning = tid
    entry = {
        "label": label_of(block, first),
        "grid": block.grid,
        "seeds": block.seeds,
        "criterion": block.criterion,
        "validation": block.validation,
        "without": block.without,
        "when": block.when,
        "experiments": [],
        "selection": selection,
        "pending": [],
    }
    pending = {"experiment": experiment, "raw": raw, "variant": variant}
    return tid, entry, runs, pending


def label_of(block: Block, setting: dict) -> str:
    method = "+".join([setting["algorithm"], *setting["plugins"]])
    return f"{method}: {', '.join(block.grid)} on {partition_id(setting).rsplit('-', 2)[0]} ({setting['model']})"


# --------------------------------------------------------------------------- choosing


def choose(selection: dict, summaries: dict[str, dict | None]) -> dict:
    """The choice record of one tuning: per candidate its runs' values and the criterion, and the winner.

    ``summaries`` maps each tuning run id to its summary.json (None: not there). Rules: module docstring."""
    criterion = CRITERIA[selection["criterion"]]
    scored = []
    for cand in selection["candidates"]:
        values, statuses = [], []
        for rid in cand["runs"]:
            summary = summaries.get(rid)
            if summary is None:
                raise TuningError(f"tuning run {rid} has no summary; it has to finish before the choice")
            if summary.get("scored_on") != "validation":
                raise TuningError(
                    f"tuning run {rid} was scored on the {summary.get('scored_on', 'test')} set, not "
                    f"the validation split; a tuning never looks at the test set"
                )
            statuses.append(summary["status"])
            values.append(float(summary[criterion.key]))
        ok = all(s == "finished" for s in statuses) and all(math.isfinite(v) for v in values)
        value = sum(values) / len(values) if ok else None
        # JSON has no NaN: a diverged run's value is null
        scored.append(
            {**cand, "values": [v if math.isfinite(v) else None for v in values], "statuses": statuses, "value": value}
        )
    best = None
    for i, cand in enumerate(scored):
        if cand["value"] is None:
            continue  # diverged: loses
        if best is None or (
            cand["value"] > scored[best]["value"]
            if criterion.higher_is_better
            else cand["value"] < scored[best]["value"]
        ):
            best = i  # strictly better only: a tie keeps the candidate listed first
    if best is None:
        raise TuningError(
            "every candidate diverged: "
            + "; ".join(f"{c['label']} ({', '.join(c['statuses'])})" for c in scored)
            + "; widen the tune grid"
        )
    return {
        "criterion": selection["criterion"],
        "criterion_says": criterion.says,
        "higher_is_better": criterion.higher_is_better,
        "candidates": scored,
        "chosen": scored[best]["point"],
        "chosen_label": scored[best]["label"],
        "chosen_index": best,
    }


def select(manifest: dict, tuning: str, runs_dir: str | Path) -> dict:
    """The choice of one tuning of a manifest, from its runs' summaries."""
    from fedrepro.run.rundir import RunDir

    if tuning not in manifest.get("tunings", {}):
        raise TuningError(f"tuning {tuning} is not in the manifest; it has: {', '.join(manifest.get('tunings', {}))}")
    selection = manifest["tunings"][tuning]["selection"]
    summaries = {}
    for cand in selection["candidates"]:
        for rid in cand["runs"]:
            folder = RunDir(Path(runs_dir) / rid)
            summaries[rid] = folder.read_summary() if folder.finished() else None
    return {"tuning": tuning, **choose(selection, summaries)}


# --------------------------------------------------------------------------- the final runs


def final_runs(tunings: dict, choices: dict[str, dict]) -> list[tuple[Run, str]]:
    """(final run, tuning id) for every pending grid point whose tuning has a choice."""
    out = []
    for tid, entry in tunings.items():
        if tid not in choices:
            continue
        chosen = choices[tid]["chosen"]
        for pending in entry["pending"]:
            where = f"experiments.{pending['experiment']} tuned by {tid}"
            setting = resolve(deep_merge(pending["raw"], chosen), where)
            out.append((Run(run_id(setting), pending["experiment"], setting, pending["variant"]), tid))
    return out


def waiting_settings(manifest: dict, experiments: list[str]) -> list[dict]:
    """The settings of these experiments' final runs whose tuning has not chosen yet, with the tune grid's first
    candidate standing in for the choice: what they will be, but for the tuned values."""
    out = []
    for entry in manifest.get("tunings", {}).values():
        if entry.get("choice"):
            continue
        first = entry["selection"]["candidates"][0]["point"]
        out += [
            resolve(deep_merge(p["raw"], first), p["experiment"])
            for p in entry["pending"]
            if p["experiment"] in experiments
        ]
    return out


def tuned_manifest(manifest: dict, choices: dict[str, dict]) -> dict:
    """The manifest with each tuned experiment's final runs, as the report, tracking and collect steps read
    it, and each tuning's choice (the tuning curve)."""
    out = json.loads(json.dumps(manifest))
    for run, tid in final_runs(manifest.get("tunings", {}), choices):
        out["experiments"][run.experiment]["runs"].append(
            {
                "id": run.id,
                "variant": run.variant,
                "label": run.label,
                "seed": run.setting["seed"],
                "partition": run.partition,
                "setting": run.setting,
                "tuned": {"tuning": tid, "chosen": choices[tid]["chosen"], "label": choices[tid]["chosen_label"]},
            }
        )
    for tid, entry in out.get("tunings", {}).items():
        entry["choice"] = choices.get(tid)
        if tid in choices:
            continue
        # not chosen yet (a report of a partial grid): listed as missing, with the first candidate standing in
        for i, (run, _) in enumerate(
            final_runs({tid: entry}, {tid: {"chosen": entry["selection"]["candidates"][0]["point"]}})
        ):
            out["experiments"][run.experiment]["runs"].append(
                {
                    "id": f"{tid}.waiting{i}",
                    "variant": run.variant,
                    "label": run.label,
                    "seed": run.setting["seed"],
                    "partition": run.partition,
                    "setting": run.setting,
                    "waiting": tid,
                }
            )
    return out


def choices_on_disk(manifest: dict, folder: str | Path = "results/tuning") -> dict[str, dict]:
    """The choices the tune rule wrote for this manifest's tunings."""
    found = {}
    for tid in manifest.get("tunings", {}):
        path = Path(folder) / f"{tid}.json"
        if path.is_file():
            found[tid] = json.loads(path.read_text())
    return found


def tuned_manifest_path(manifest_path: str) -> str:
    return (
        manifest_path[: -len(".json")] + ".tuned.json" if manifest_path.endswith(".json") else manifest_path + ".tuned"
    )


class RunTable(dict):
    """The workflow's runs by id: those the params file names, and the final runs of its tunings once the
    tuned manifest (a checkpoint's output) is there, so that the training rule finds their settings."""

    def __init__(self, runs: dict, tuned_manifest_file: str):
        super().__init__(runs)
        self.tuned_manifest_file = Path(tuned_manifest_file)
        self._read = None

    def final_ids(self) -> list[str]:
        return list(self._final())

    def _final(self) -> dict:
        try:
            stamp = self.tuned_manifest_file.stat().st_mtime_ns
        except FileNotFoundError:
            return {}
        if self._read is None or self._read[0] != stamp:
            manifest = json.loads(self.tuned_manifest_file.read_text())
            final = {
                r["id"]: Run(r["id"], name, r["setting"], r["variant"])
                for name, exp in manifest["experiments"].items()
                for r in exp["runs"]
                if "tuned" in r
            }
            self._read = (stamp, final)
        return self._read[1]

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or key in self._final()

    def __missing__(self, key):
        final = self._final()
        if key in final:
            return final[key]
        raise KeyError(key)
