"""Evidence that stays: the compact records of finished runs, kept in the repository.

``keep`` copies, for the runs a params file (or params file + subset overlay) declares, what a report
page is built from and nothing heavier: per run ``summary.json`` and ``metrics.csv`` (a few KB each),
per partition ``partition.json``, ``counts.csv`` and the heatmap, plus the manifest (every run's
resolved setting) and the params files themselves. No model, no checkpoint. ``report`` rebuilds the
page from such a folder alone, so every number a page states can be regenerated from git without
``results/``.

    evidence/<name>/
      manifest.json          the report's manifest, with how and when the records were kept
      params/                the params files, as they were when kept
      runs/<run id>/         summary.json, metrics.csv
      partitions/<id>/       partition.json, counts.csv, heatmap.png

A kept summary.json is the trainer's plus one key the keep adds, ``collapse``: the run's collapse record
(``fedrepro.report.collapses``), computed from its metrics.csv when it is kept, so the trainer (whose code is part of
every run id) never computes it. ``record_collapses`` writes it into folders kept before the record existed;
a test checks that every kept record equals what the rule computes today.
"""

from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path

from fedrepro.errors import FedreproError
from fedrepro.run import rundir

RUN_FILES = rundir.RECORD_FILES
PARTITION_FILES = ("partition.json", "counts.csv", "heatmap.png")
MANIFEST = "manifest.json"


class EvidenceError(FedreproError, ValueError):
    """A keep or report request that cannot be honoured (nothing finished, not an evidence folder)."""


def keep(
    configfiles: list[str | Path] | None,
    name: str,
    runs_dir: str | Path = "results/runs",
    partitions_dir: str | Path = "results/partitions",
    root: str | Path = "evidence",
    manifest: str | Path | None = None,
    protocol: str | None = None,
    carry: list[str | Path] | None = None,
) -> dict:
    """Copy the compact records of the finished runs of ``configfiles`` into ``root/name``.

    With ``manifest`` (a manifest the workflow wrote when the runs ran, ``results/manifests/``) instead of
    ``configfiles``, the runs are the ones it names: runs made by an earlier commit of the code keep their
    ids (a run's id hashes the code it ran), which today's expansion of the params files would not give.

    The folder is replaced as a whole, so it never mixes records of two keeps; a keep that would change
    nothing but when and how it was asked for leaves the folder untouched (``unchanged`` in the result), so
    keeping every folder again after a few runs finish rewrites only the folders they belong to. Runs that
    have not finished are not copied; the manifest still names them, so the page lists them as missing.

    ``protocol`` ('paper', 'official', or another word such as 'ablation') says whether the runs follow
    the paper's protocol; only 'paper' evidence enters the verification matrix. Unset, it is 'official'
    when an ``*_official_protocol`` subset is among the params files, else 'paper'.

    ``carry`` names earlier evidence folders: a declared run that has not finished in ``runs_dir`` takes the
    records of a run kept there whose setting, resolved by today's code, is the declared one, on a partition
    of the same content. It keeps its own id and summary (which name the commit it ran with); the manifest
    says which runs were carried and from where."""
    from fedrepro import records
    from fedrepro.configure import expansion, paramsfile
    from fedrepro.report import verification

    runs_dir, partitions_dir = Path(runs_dir), Path(partitions_dir)
    if manifest is not None:
        manifest_path = Path(manifest)
        kept_manifest = records.read_json(manifest_path)
        # results/manifests/<name>.json: the params files it names are relative to that project's root
        project = manifest_path.resolve().parents[2]
        configfiles = [project / p for p in kept_manifest.get("configfiles", [])]
        declared = {r["id"]: r["partition"] for exp in kept_manifest["experiments"].values() for r in exp["runs"]}
        command = f"fedrepro evidence keep --manifest {manifest_path} --name {name}"
        _mark_switches(kept_manifest)
    else:
        configfiles = [Path(p) for p in configfiles]
        params = paramsfile.load_params_files([str(p) for p in configfiles])
        runs = expansion.expand(params)
        declared = {r.id: r.partition for r in runs}
        command = "fedrepro evidence keep --configfile " + " ".join(map(str, configfiles)) + f" --name {name}"
        kept_manifest = expansion.run_manifest(params, configfiles, command, name)
    finished = [r for r in declared if rundir.RunDir(runs_dir / r).finished()]
    carried = _carried(kept_manifest, [r for r in declared if r not in finished], partitions_dir, carry or [])
    if not finished and not carried:
        raise EvidenceError(f"none of the {len(declared)} runs declared has finished in {runs_dir}: nothing to keep")
    folder = Path(root) / name
    staging = folder.with_name(f".{name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "params").mkdir(parents=True)
    for i, path in enumerate(configfiles):  # numbered: the merge order is part of what they mean
        if path.is_file():
            shutil.copy(path, staging / "params" / f"{i}_{path.name}")
    for run_id in finished:
        _copy(runs_dir / run_id, staging / "runs" / run_id, RUN_FILES)
        _record_collapse(staging / "runs" / run_id)
    partitions = sorted({declared[r] for r in finished})
    for pid in partitions:
        _copy(partitions_dir / pid, staging / "partitions" / pid, PARTITION_FILES)
    for c in carried.values():
        _copy(c["folder"] / "runs" / c["id"], staging / "runs" / c["id"], RUN_FILES)
        _record_collapse(staging / "runs" / c["id"])
        _copy(c["folder"] / "partitions" / c["partition"], staging / "partitions" / c["partition"], PARTITION_FILES)
    if carry:
        command += " --carry " + " ".join(map(str, carry))
    out = {
        **kept_manifest,
        "evidence": {
            "name": name,
            "kept": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "runs_kept": len(finished) + len(carried),
            "runs_declared": len(declared),
            "kept_by": command,
            "protocol": protocol or verification.protocol(kept_manifest),
            **(
                {
                    "carried": {
                        new: {"from": str(c["folder"]), "id": c["id"], "commit": c["commit"]}
                        for new, c in carried.items()
                    }
                }
                if carried
                else {}
            ),
        },
    }
    (staging / MANIFEST).write_text(json.dumps(out, indent=1, sort_keys=True))
    unchanged = _same_records(staging, folder)
    if unchanged:  # only the time and wording of the keep would change: leave the folder (and its git history) be
        shutil.rmtree(staging)
    else:
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    return {
        "folder": str(folder),
        "runs": len(finished) + len(carried),
        "carried": len(carried),
        "partitions": len(set(partitions) | {c["partition"] for c in carried.values()}),
        "bytes": sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()),
        "unchanged": unchanged,
    }


def _record_collapse(run: Path) -> dict | None:
    """Write the run's collapse record (fedrepro.report.collapses, from its metrics.csv) into its kept summary.json,
    as the key ``collapse``; the file is rewritten only when the record changes. Returns the record."""
    from fedrepro import records
    from fedrepro.report import collapses

    summary_path, metrics_path = run / rundir.SUMMARY, run / rundir.METRICS
    if not summary_path.is_file() or not metrics_path.is_file():
        return None
    import pandas as pd

    summary = records.read_json(summary_path)
    record = collapses.of_run(summary, pd.read_csv(metrics_path))
    if summary.get("collapse") != record:
        summary["collapse"] = record
        summary_path.write_text(json.dumps(summary, indent=2, default=float))  # as the trainer writes it
    return record


def record_collapses(folder: str | Path) -> list[dict]:
    """Write each kept run's collapse record into its summary.json (``_record_collapse``); one row per run:
    run id and record."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        raise EvidenceError(f"{folder} is not an evidence folder (no {MANIFEST})")
    return [
        {"run": run.name, "record": _record_collapse(run)}
        for run in sorted((folder / "runs").glob("*"))
        if run.is_dir()
    ]


def _same_records(new: Path, old: Path) -> bool:
    """Whether folder ``new`` holds the records ``old`` holds: the same files, byte for byte, and the same
    manifest but for when and by which command each was kept."""
    if not (old / MANIFEST).is_file():
        return False
    files = lambda root: {p.relative_to(root) for p in root.rglob("*") if p.is_file()}
    if files(new) != files(old):
        return False
    if any((new / f).read_bytes() != (old / f).read_bytes() for f in files(new) if f.name != MANIFEST):
        return False
    return _without_wording(json.loads((new / MANIFEST).read_text())) == _without_wording(
        json.loads((old / MANIFEST).read_text())
    )


def _without_wording(manifest: dict) -> dict:
    """The manifest less how the keep was asked for: when, and by which command (its own and the manifest's)."""
    out = {k: v for k, v in manifest.items() if k != "command"}
    out["evidence"] = {k: v for k, v in out.get("evidence", {}).items() if k not in ("kept", "kept_by")}
    return out


def _carried(manifest: dict, missing: list[str], partitions_dir: Path, folders: list[str | Path]) -> dict:
    """For each missing run, an equal run kept in one of ``folders``: {missing id: {folder, id, partition, commit}}.
    The manifest's entry of a carried run is rewritten to the kept id and partition, so a page finds it."""
    from fedrepro import records

    entries = {r["id"]: r for exp in manifest["experiments"].values() for r in exp["runs"] if r["id"] in missing}
    found: dict = {}
    for folder in map(Path, folders):
        if not (folder / MANIFEST).is_file():
            raise EvidenceError(f"--carry {folder}: not an evidence folder (no {MANIFEST})")
        for kept, new_id, same_clients in _equal_runs(folder, entries, partitions_dir):
            if same_clients and new_id not in found:  # no record of a partition is no evidence of its clients
                summary = records.read_json(folder / "runs" / kept["id"] / rundir.SUMMARY)
                found[new_id] = {
                    "folder": folder,
                    "id": kept["id"],
                    "partition": kept["partition"],
                    "commit": summary.get("git_commit"),
                }
    for entry in entries.values():
        if entry["id"] in found:
            c = found[entry["id"]]
            entry["id"], entry["partition"] = c["id"], c["partition"]
    return found


def _equal_runs(folder: Path, declared: dict, partitions_dir: Path):
    """(kept run entry, declared id, same clients) for each run kept in ``folder`` that may equal a ``declared``
    run ({id: entry with setting and partition}): the kept setting, resolved by today's code (which fills keys
    added since with their defaults), is the declared setting, and the two partitions hold the same clients
    (True: their content hashes agree) or the declared one has not been made in ``partitions_dir`` yet (None).
    A run's id also hashes its code, so the ids of two commits never meet: settings do."""
    from fedrepro.configure import settings

    for run in _kept_runs(folder):
        setting = settings.resolve(run["setting"])
        for new_id, entry in declared.items():
            if entry["setting"] != setting:
                continue
            clients = _content(partitions_dir / entry["partition"])
            if clients is None:
                yield run, new_id, None
            elif clients == _content(folder / "partitions" / run["partition"]):
                yield run, new_id, True


def _kept_runs(folder: Path) -> list[dict]:
    """The manifest entries of the runs ``folder`` holds records of (a manifest also names unfinished runs)."""
    from fedrepro import records

    if not (folder / MANIFEST).is_file():
        raise EvidenceError(f"{folder} is not an evidence folder (no {MANIFEST})")
    manifest = records.read_json(folder / MANIFEST)
    return [
        r
        for exp in manifest["experiments"].values()
        for r in exp["runs"]
        if (folder / "runs" / r["id"] / rundir.SUMMARY).is_file()
    ]


# when a round ran, not what it computed: a rerun differs here and only here
TIMING_COLUMNS = ("seconds", "wall_time")


def compare(
    folder: str | Path,
    configfiles: list[str | Path],
    runs_dir: str | Path = "results/runs",
    partitions_dir: str | Path = "results/partitions",
) -> list[dict]:
    """Does a rerun confirm the kept records? For each run kept in ``folder``, the run ``configfiles`` declare
    today with an equal setting on a partition of the same clients (``_equal_runs``), and, where that run has
    finished in ``runs_dir``, the largest difference between the two ``metrics.csv`` over every round and
    column but the timings. One row per kept run: kept id, rerun id (None when today's params files declare
    no equal run), state ('compared', 'not rerun', 'not declared', or no partition record), rounds, the
    column with the largest difference and that difference (0.0: bit for bit), both final accuracies, and the
    CPU kernels torch picked for each (None where a summary predates that record)."""
    from fedrepro import records
    from fedrepro.configure import expansion, paramsfile

    folder, runs_dir, partitions_dir = Path(folder), Path(runs_dir), Path(partitions_dir)
    runs = expansion.expand(paramsfile.load_params_files([str(p) for p in configfiles]))
    declared = {r.id: {"setting": r.setting, "partition": r.partition} for r in runs}
    matches: dict = {}
    for kept, new_id, same_clients in _equal_runs(folder, declared, partitions_dir):
        matches.setdefault(kept["id"], (new_id, same_clients))
    rows = []
    for kept in _kept_runs(folder):
        new_id, same_clients = matches.get(kept["id"], (None, None))
        summary = records.read_json(folder / "runs" / kept["id"] / rundir.SUMMARY)
        row = {
            "kept": kept["id"],
            "rerun": new_id,
            "state": "not declared" if new_id is None else "not rerun",
            "rounds": 0,
            "same_rounds": None,
            "column": None,
            "max_abs_diff": None,
            "kept_final_acc": summary.get("final_acc"),
            "rerun_final_acc": None,
            "kept_cpu_kernels": summary.get("cpu_kernels"),
            "rerun_cpu_kernels": None,
        }
        rerun_done = new_id is not None and rundir.RunDir(runs_dir / new_id).finished()
        if rerun_done and not same_clients:
            row["state"] = f"no partition record in {partitions_dir}"  # its clients cannot be shown the same
        elif rerun_done:
            rerun = records.read_json(runs_dir / new_id / rundir.SUMMARY)
            row.update(
                state="compared",
                **_largest_difference(
                    folder / "runs" / kept["id"] / rundir.METRICS, runs_dir / new_id / rundir.METRICS
                ),
                rerun_final_acc=rerun.get("final_acc"),
                rerun_cpu_kernels=rerun.get("cpu_kernels"),
            )
        rows.append(row)
    return rows


def _largest_difference(kept: Path, rerun: Path) -> dict:
    """Two metrics.csv files, over the rounds and columns (timings aside) both hold: the rounds compared, whether
    both logged the same rounds, and the column with the largest |difference| and that difference."""
    import numpy as np
    import pandas as pd

    before, after = pd.read_csv(kept).set_index("round"), pd.read_csv(rerun).set_index("round")
    columns = [
        c
        for c in before.columns.intersection(after.columns)
        if c not in TIMING_COLUMNS
        and pd.api.types.is_numeric_dtype(before[c])
        and pd.api.types.is_numeric_dtype(after[c])
    ]
    rounds = before.index.intersection(after.index)
    a, b = before.loc[rounds, columns].to_numpy(float), after.loc[rounds, columns].to_numpy(float)
    both_nan = np.isnan(a) & np.isnan(b)  # a column a round did not log, in both: the same
    diff = np.where(both_nan, 0.0, np.nan_to_num(np.abs(a - b), nan=np.inf))  # NaN against a number: inf
    worst = diff.max(axis=0) if diff.size else np.zeros(len(columns))
    at = int(np.argmax(worst)) if len(columns) else None
    return {
        "rounds": len(rounds),
        "same_rounds": before.index.equals(after.index),
        "column": columns[at] if at is not None else None,
        "max_abs_diff": float(worst[at]) if at is not None else 0.0,
    }


def _content(partition: Path) -> str | None:
    """The partition's content hash as its ``partition.json`` records it; None when there is no record."""
    from fedrepro.records import read_json

    path = partition / "partition.json"
    return read_json(path).get("content_hash") if path.is_file() else None


def _mark_switches(manifest: dict) -> None:
    """An experiment of switches (``switches``: true or the switch keys, a flag of how the report presents it, no
    part of any run) in this checkout's params files is one in a manifest written before the flag existed too."""
    from fedrepro.configure import paramsfile, schema

    files = [paramsfile.ROOT / p for p in manifest.get("configfiles", [])]
    if not files or not all(p.is_file() for p in files):
        return
    try:
        current = paramsfile.selected_experiments(paramsfile.load_params_files(files))
    except schema.ConfigError:
        return
    for exp_name, exp in manifest["experiments"].items():
        if current.get(exp_name, {}).get("switches"):
            exp["switches"] = current[exp_name]["switches"]


def _copy(src: Path, dst: Path, names: tuple[str, ...]) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)


def report(folder: str | Path, out: str | Path, figures_dir: str | Path | None = None) -> Path:
    """The report page of an evidence folder, built from that folder alone."""
    from fedrepro.report import page

    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        raise EvidenceError(
            f"{folder} is not an evidence folder (no {MANIFEST}); "
            f"make one with: fedrepro evidence keep --configfile ... --name ..."
        )
    return page.build(folder / MANIFEST, folder / "runs", folder / "partitions", out, figures_dir)
