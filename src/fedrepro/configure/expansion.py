"""Params files expanded: every grid point of every experiment as a named run, with the tunings and the
runs that fork from others; and the manifest, the one description of a params file's runs that the
workflow, the report, tracking and evidence read.

Resolving one setting is settings.py's (reading params files paramsfile.py's); tuning.py and forks.py
build on it, and this module on all three.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from fedrepro.configure import forks, overlay, tuning as ftuning
from fedrepro.configure.paramsfile import SAFE_EXPERIMENT, check_name, data_root, selected_experiments
from fedrepro.configure.schema import ConfigError
from fedrepro.configure.settings import Run, deep_merge, grid_points, resolve, variant_label
from fedrepro.identity import run_id, stable_hash


def expand(params: dict, tunings: dict | None = None) -> list[Run]:
    """All runs of a params file (already schema-validated), in file order, without duplicates.

    A grid point that a tune block claims (fedrepro.configure.tuning) gives its tuning runs here, and its final run
    waits for the choice: it is recorded in ``tunings`` (tuning id -> manifest entry) when a dict is given."""
    with _code_read_once():
        return _expand(params, tunings)


@contextlib.contextmanager
def _code_read_once():
    """One expansion names its runs from one reading of the code: each method's code hash is computed once.
    Outside, identity follows the imports and stats the files at every call, so an edit is seen at once by a
    long-lived caller (the tests, a notebook); inside one expansion the code cannot change, and without the memo
    `fedrepro expand --configfile params/ima.yaml` takes 30-37 s instead of 8 s (2026-11-28, 2 shared cores).
    The memo is expansion's, not identity's: only here is "the code read once" true for a bounded time."""
    from fedrepro import identity
    from fedrepro.configure import registry

    if getattr(identity.code_hash, "read_once", False):  # an expansion inside an expansion
        yield
        return
    # registry._stamps: the fragments' mtimes, which every resolve checked anew (a third of a big grid's time)
    originals = identity.code_hash, identity.partition_code_hash, registry._stamps
    hashes: dict = {}

    def once(function):
        def read_once(*args):
            key = (function.__name__, *(tuple(a) if isinstance(a, list) else a for a in args))
            if key not in hashes:
                hashes[key] = function(*args)
            return hashes[key]

        read_once.read_once = True
        return read_once

    identity.code_hash, identity.partition_code_hash, registry._stamps = map(once, originals)
    try:
        yield
    finally:
        identity.code_hash, identity.partition_code_hash, registry._stamps = originals


def _expand(params: dict, tunings: dict | None) -> list[Run]:
    tunings = {} if tunings is None else tunings
    runs: list[Run] = []
    errors: dict[str, list[dict]] = {}  # one message, the grid points it holds for
    data_root(params)
    for name in params["experiments"]:
        check_name(name, "experiment name", SAFE_EXPERIMENT)
    for name, exp in selected_experiments(params).items():
        for axis, values in exp.get("grid", {}).items():
            texts = [json.dumps(v, sort_keys=True) for v in values]
            repeated = sorted({t for t in texts if texts.count(t) > 1})
            if repeated:
                errors.setdefault(
                    f"experiments.{name}.grid.{axis}: value(s) {', '.join(repeated)} listed more than "
                    f"once; each grid value must be distinct (a repeat would count one run twice)",
                    [],
                )
        switches, grid = exp.get("switches"), exp.get("grid", {})
        if isinstance(switches, list):  # the switch table compares a key's values: the grid must give it two
            fixed = [key for key in switches if len(grid.get(key, [])) < 2]
            if fixed:
                varied = ", ".join(key for key, values in grid.items() if len(values) > 1) or "none"
                errors.setdefault(
                    f"experiments.{name}.switches: {', '.join(fixed)} not varied by the experiment's "
                    f"grid; a switch is a grid key with two or more values (varied here: {varied})",
                    [],
                )
        seen: dict[str, dict] = {}  # run id -> the grid point that gave it
        try:
            blocks, claimed, tuning_ids = ftuning.blocks(name, exp), set(), set()
        except ConfigError as err:
            errors.setdefault(str(err), [])
            continue
        for point in grid_points(exp.get("grid", {})):
            try:
                raw = deep_merge(exp.get("base", {}), point)
                part = raw.get("partition", {})
                if part.get("kind") == "file" and isinstance(part.get("path"), str) and not os.path.isabs(part["path"]):
                    # a relative partition file lies under the data root, as the datasets do
                    raw["partition"] = {**part, "path": os.path.join(data_root(params), part["path"])}
                setting = resolve(raw, f"experiments.{name}")
                block = ftuning.claim(blocks, setting)
                staged = ftuning.stage(block, raw, point, name) if block else None
            except ConfigError as err:
                for line in str(err).splitlines():
                    errors.setdefault(line, []).append(point)
                continue
            rid = check_name(run_id(setting), "run name")
            if rid in seen:
                errors.setdefault(
                    f"experiments.{name}: grid points {json.dumps(seen[rid], sort_keys=True)} and "
                    f"{json.dumps(point, sort_keys=True)} are the same run; each must be distinct",
                    [],
                )
                continue
            seen[rid] = point
            if staged:
                tid, entry, tuning_runs, pending = staged
                claimed.add(block.where)
                entry = tunings.setdefault(tid, entry)
                entry["experiments"] = sorted({*entry["experiments"], name})
                entry["pending"].append(pending)
                runs.extend(r for r in tuning_runs if (r.id, name) not in tuning_ids)
                tuning_ids.update((r.id, name) for r in tuning_runs)
                continue
            variant = variant_label(point)
            if "algorithm" in variant:
                variant["algorithm"] = "+".join([setting["algorithm"], *setting["plugins"]])
            runs.append(Run(rid, name, setting, variant))
        for block in blocks:
            if block.where not in claimed and not any(block.where in line for line in errors):
                errors.setdefault(
                    f"{block.where}: when = {json.dumps(block.when, sort_keys=True)} matches no grid point "
                    f"of the experiment",
                    [],
                )
    if errors:
        raise ConfigError(
            "\n".join(
                f"{line}  [{len(points)} grid point(s), e.g. {json.dumps(points[0], sort_keys=True)}]"
                if points
                else line
                for line, points in errors.items()
            )
        )
    return runs


def unique_runs(runs: list[Run]) -> dict[str, Run]:
    return {run.id: run for run in runs}


def runs_by_experiment(runs: list[Run]) -> dict[str, list[str]]:
    """Experiment -> its run ids. A run two experiments list (the same setting) is trained once, and
    ``unique_runs`` keeps one of its experiments; it belongs to both (IMA Fig. 10's first row is the
    landscape figures' cross-device run), so what reads an experiment's runs asks here."""
    out: dict[str, dict[str, None]] = {}
    for run in runs:
        out.setdefault(run.experiment, {})[run.id] = None
    return {name: list(ids) for name, ids in out.items()}


def manifest(params: dict, runs: list[Run], name: str, tunings: dict | None = None) -> dict:
    """What the report and the tracking step need to know about a params file's runs. The tuning runs are
    listed by their tunings (fedrepro.configure.tuning), not as runs of the experiment they serve."""
    experiments: dict[str, dict] = {}
    for exp_name, exp in selected_experiments(params).items():
        experiments[exp_name] = {
            "title": exp.get("title", exp_name),
            "description": exp.get("description", ""),
            "grid": exp.get("grid", {}),
            "runs": [],
        }
        if exp.get("switches"):  # only when set: every other manifest keeps its content hash
            experiments[exp_name]["switches"] = exp["switches"]
    shared = forks.of_params(params, [r for r in unique_runs(runs).values() if not r.tuning])
    for run in runs:
        if run.tuning:
            continue
        entry = {
            "id": run.id,
            "variant": run.variant,
            "label": run.label,
            "seed": run.setting["seed"],
            "partition": run.partition,
            "setting": run.setting,
        }
        if run.id in shared:  # its first rounds are another run's (fedrepro.configure.forks)
            entry["fork"] = {"parent": shared[run.id].parent, "round": shared[run.id].round}
        experiments[run.experiment]["runs"].append(entry)
    out = {
        "name": name,
        "title": params.get("title", name),
        "quick": params.get("quick", False),
        "tracking": params.get("tracking", {}),
        "experiments": experiments,
    }
    if tunings:  # only then: the manifests of params files without tuning are unchanged
        out["tunings"] = tunings
    if overlay.names(params, "add_method"):  # the methods the report compares with each table's (report/versus.py)
        out["added_methods"] = overlay.names(params, "add_method")
    return out


def run_manifest(
    params: dict,
    configfiles: list[str | Path],
    command: str,
    name: str | None = None,
    expanded: tuple[list[Run], dict] | None = None,
) -> dict:
    """The manifest of a params file as every producer writes it (the workflow's manifest step, the
    report and tracking of a partial grid, evidence): the runs, the files it came from and the command.
    ``expanded``: the runs and tunings ``expand`` already gave for these params (the Snakefile's), not
    expanded again."""
    configfiles = [str(p) for p in configfiles]
    name = name or Path(configfiles[-1]).stem
    with _code_read_once():
        if expanded is None:
            tunings: dict = {}
            runs = expand(params, tunings)
        else:
            runs, tunings = expanded
        return {**manifest(params, runs, name, tunings), "configfiles": configfiles, "command": command}


def manifest_path(manifest: dict, folder: str = "results/manifests") -> str:
    """Content-addressed, like every other output upstream of the report: a changed grid is a new path."""
    return f"{folder}/{manifest['name']}-{stable_hash(manifest)}.json"


# Slices: what one downstream job reads of the manifest, so that it reruns when that changes and not when
# another experiment's runs do (a figure reads its experiment's runs, a tracking job its own run's record).
SLICED_OUT = ("experiments", "tunings")  # the rest (name, title, quick, tracking, configfiles, command) is kept


def experiment_slice(manifest: dict, experiments: list[str]) -> dict:
    """The manifest of ``experiments`` alone (a figure's; none for a figure that reads no runs)."""
    return {
        **{k: v for k, v in manifest.items() if k not in SLICED_OUT},
        "experiments": {name: manifest["experiments"][name] for name in experiments},
    }


def run_records(manifest: dict) -> dict[str, dict]:
    """Each run's record: the manifest with the experiments that list the run, each with its title and the run's
    entry alone (a tracking job's: its experiment's grid and other runs are no part of it)."""
    top = {k: v for k, v in manifest.items() if k not in SLICED_OUT}
    records: dict[str, dict] = {}
    for name, exp in manifest["experiments"].items():
        for entry in exp["runs"]:
            record = records.setdefault(entry["id"], {**top, "experiments": {}})
            record["experiments"][name] = {"title": exp["title"], "runs": [entry]}
    return records


def slice_path(manifest_slice: dict, folder: str = "results/manifests") -> str:
    """Content-addressed, as the manifest: an experiment's slice keeps its path while its content stays."""
    return f"{folder}/{manifest_slice['name']}/{stable_hash(manifest_slice)}.json"
