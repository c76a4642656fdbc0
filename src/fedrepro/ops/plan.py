"""What a params file will cost before it runs: runs per experiment and estimated compute; and what a
cluster job of each run asks for.

Compute is counted in local SGD steps (the dominant cost of these papers' runs):

    steps(run) = rounds x cohort x E x ceil((N / clients) / B)

with the mean client size N / clients and, for ``+random_epochs``, the mean of its epoch range; seconds per
step are pricing.py's. Server-side work (the proxy-set epochs of FedLAW, FedDF, FedBE and Server-FT,
FedAWARE's min-norm solve) and evaluation are not counted. A run that starts from another run's state
(fedrepro.configure.forks) counts only the rounds it trains itself; the plan gives both counts.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from fedrepro import schedule
from fedrepro.configure import expansion, settings
from fedrepro.ops import packed_pricing
from fedrepro.ops.pricing import (
    BENCH_FILE,
    H200_BENCH_FILE,
    PlanError,
    StepCosts,
    local_steps,
    run_device,
    step_costs,
    step_costs_by_device,
    step_key,
    step_seconds,
)
from fedrepro.run.rundir import RunDir


def final_runs(tunings: dict, runs_dir: str | Path) -> tuple[list[settings.Run], set[str]]:
    """The final runs of the tunings (fedrepro.configure.tuning), and the ids of those whose tuning has not chosen yet:
    with the chosen value where the choice is there (results/tuning/ beside the runs folder), else with the tune
    grid's first candidate, which stands in for the cost and for which runs are shared (not done: the run
    is not known before the choice)."""
    from fedrepro.configure import tuning

    runs, waiting = [], set()
    for tid, entry in tunings.items():
        path = Path(runs_dir).parent / "tuning" / f"{tid}.json"
        chosen = (
            json.loads(path.read_text()) if path.is_file() else {"chosen": entry["selection"]["candidates"][0]["point"]}
        )
        for run, _ in tuning.final_runs({tid: entry}, {tid: chosen}):
            runs.append(run)
            if not path.is_file():
                waiting.add(run.id)
    return runs, waiting


SUMMED = (
    "runs",
    "tuning",
    "shared",
    "done",
    "rounds",
    "rounds_unshared",
    "rounds_tuning",
    "rounds_tuning_unshared",
    "steps",
    "steps_unshared",
    "seconds",
    "seconds_unshared",
)


def plan(
    params: dict,
    bench: str | Path | None = None,
    runs_dir: str | Path = "results/runs",
    device: str = "cuda",
    packed: packed_pricing.PackedCosts | None = None,
) -> dict:
    """Runs, rounds, local steps and seconds left to train on ``device`` per experiment, and the step-cost
    tables that priced each (``priced_by``, described in ``sources``); ``*_unshared`` as if every run
    trained from round 0 (``share_prefixes: false``), the others with shared prefixes trained once;
    ``rounds_tuning*``: the part of the rounds that the tuning stage's runs train (counted in rounds too). The
    final runs of a tuning (fedrepro.configure.tuning) are counted with the chosen value, or the tune grid's first
    candidate before the choice, and share prefixes among themselves as the workflow has them do. A run whose
    setting has measured packed steps on ``device`` (``packed``, default packed_pricing.packed_costs(device)) is
    priced on the packed path, in packs of packed_pricing.pack_size runs (``packing``: how many and why); the
    others on the sequential path (``packed_missing`` names the measurement that would price them packed)."""
    from fedrepro.configure import forks

    tunings: dict = {}
    runs = expansion.expand(params, tunings)
    finals, waiting = final_runs(tunings, runs_dir)
    runs += finals
    shared = forks.of_params(params, list(expansion.unique_runs(runs).values()))
    costs = step_costs(device, bench)
    packed = packed_pricing.packed_costs(device) if packed is None else packed
    packed_label = f"packed steps ({Path(packed.file).name})"
    packing, packed_runs, sequential_keys = {}, defaultdict(int), []
    seen: set[str] = set()
    rows = defaultdict(lambda: {**dict.fromkeys(SUMMED, 0), "unknown": set(), "priced_by": set()})
    for run in runs:
        row = rows[run.experiment]
        row["runs"] += 1
        row["tuning"] += bool(run.tuning)  # the tuning stage's runs, counted in runs too
        if run.id in seen:  # the same run listed by two experiments is trained once
            row["shared"] += 1
            continue
        seen.add(run.id)
        if run.id not in waiting and RunDir(Path(runs_dir) / run.id).finished():
            row["done"] += 1
            continue
        start = shared[run.id].round if run.id in shared else 0  # a child trains from its fork
        steps, unshared = local_steps(run.setting, start), local_steps(run.setting)
        row["rounds"] += run.setting["rounds"] - start
        row["rounds_unshared"] += run.setting["rounds"]
        if run.tuning:
            row["rounds_tuning"] += run.setting["rounds"] - start
            row["rounds_tuning_unshared"] += run.setting["rounds"]
        row["steps"] += steps
        row["steps_unshared"] += unshared
        curve = packed.curve(run.setting)
        if curve is not None:
            clients = schedule.cohort_size(run.setting)
            name = f"{step_key(run.setting)}, {clients} clients a round"
            if curve is packed.graph_curves.get(step_key(run.setting)):  # a step_graph compile run, its own curve
                name += ", step_graph compile"
            packing[name] = asdict(packed_pricing.pack_size(curve, clients))
            packed_runs[name] += 1
            row["priced_by"].add(packed_label)
            row["seconds"] += packed_pricing.run_seconds(run.setting, curve, start)
            row["seconds_unshared"] += packed_pricing.run_seconds(run.setting, curve)
            continue
        sequential_keys.append(step_key(run.setting))
        priced = costs.price(run.setting)
        if priced is None:
            row["unknown"].add(run.setting["model"])
        else:
            sec, table = priced
            row["priced_by"].add(table.label)
            row["seconds"] += steps * sec
            row["seconds_unshared"] += unshared * sec
    in_order = [packed_label] + [table.label for table in costs.tables]
    experiments = {
        name: {**row, "unknown": sorted(row["unknown"]), "priced_by": sorted(row["priced_by"], key=in_order.index)}
        for name, row in rows.items()
    }
    total = {k: sum(r[k] for r in experiments.values()) for k in SUMMED}
    used = [t for t in costs.tables if any(t.label in row["priced_by"] for row in experiments.values())]
    sources = {packed_label: f"measured in {packed.source}"} if packing else {}
    sources.update({t.label: t.description for t in used})
    command = f"fedrepro plan --configfile <params file> --measure-packed --device {device}"
    return {
        "device": device,
        "source": "; ".join(sources.values()) or "nothing to price",
        "sources": sources,
        "packing": packing,
        "packed_runs": dict(packed_runs),
        "packed_missing": packed.missing_line(sequential_keys, command),
        "guessed": [t.label for t in used if t.guess],
        "experiments": experiments,
        "total": total,
        "unique_runs": len(seen),
        "forked_runs": sum(1 for run_id in shared if run_id in seen),
        "share_prefixes": forks.sharing(params),
    }


def sharing_line(total: dict, forked_runs: int) -> str:
    """``rounds: 247,250 (436,400 without shared prefixes, 43% saved)`` and the compute both ways; with a
    tuning stage, the rounds outside it both ways too (its runs score a validation split: they rarely share a
    prefix with anything, and would hide what sharing saves on the runs the tables report)."""
    saved = lambda rounds, unshared: 1 - rounds / unshared if unshared else 0.0  # noqa: E731
    hours, unshared = total["seconds"] / 3600, total["seconds_unshared"] / 3600
    line = (
        f"rounds: {total['rounds']:,} ({total['rounds_unshared']:,} without shared prefixes, "
        f"{saved(total['rounds'], total['rounds_unshared']):.0%} saved; {forked_runs:,} runs start from "
        f"another run's state); compute: {hours:,.1f} h ({unshared:,.1f} h without shared prefixes)"
    )
    if total.get("rounds_tuning_unshared"):
        own = total["rounds"] - total["rounds_tuning"]
        own_unshared = total["rounds_unshared"] - total["rounds_tuning_unshared"]
        line += (
            f"\nrounds outside the tuning stage: {own:,} ({own_unshared:,} without shared prefixes, "
            f"{saved(own, own_unshared):.0%} saved); in it: {total['rounds_tuning']:,} "
            f"({total['rounds_tuning_unshared']:,} without shared prefixes)"
        )
    return line


def priced_note(row: dict) -> str:
    """Which step-cost tables priced an experiment's runs, and the models none of them could."""
    notes = [f"priced by: {', '.join(row['priced_by'])}"] if row.get("priced_by") else []
    if row.get("unknown"):
        notes.append(f"no step cost for: {', '.join(row['unknown'])}")
    return f"  ({'; '.join(notes)})" if notes else ""


def sources_lines(result: dict) -> list[str]:
    """The step-cost tables the plan used, one a line, by the name the experiments' rows give them."""
    sources = result.get("sources") or {"step cost": result["source"]}
    return ["step costs (priced by):"] + [f"  {label}: {description}" for label, description in sources.items()]


def format_plan(result: dict) -> str:
    # rounds and hours to train; "unshared": each run from round 0 (share_prefixes: false)
    lines = [
        f"{'experiment':40s} {'runs':>6s} {'tuning':>6s} {'shared':>6s} {'done':>5s} {'rounds':>9s} "
        f"{'unshared':>9s} {'local steps':>13s} {'hours':>10s}"
    ]
    for name, row in list(result["experiments"].items()) + [("TOTAL", result["total"])]:
        hours = row["seconds"] / 3600
        note = priced_note(row)
        lines.append(
            f"{name:40s} {row['runs']:6d} {row.get('tuning', 0):6d} {row['shared']:6d} {row['done']:5d} "
            f"{row['rounds']:9d} {row['rounds_unshared']:9d} {row['steps']:13.3g} {hours:10.1f}{note}"
        )
    lines.append(
        "tuning: of the runs, those of the tuning stage (a validation split; the final runs they tune are "
        "counted with the chosen value, or the tune grid's first before the choice)"
    )
    lines.append(
        f"{result['unique_runs']} distinct runs, compute on {result.get('device', 'cuda')}. Not counted: "
        "evaluation, server-side optimisation (proxy-set epochs of FedLAW/FedDF/FedBE/Server-FT, FedAWARE "
        "min-norm)."
    )
    lines += sources_lines(result)
    if result.get("packing"):
        lines.append(
            "packed path (runs x clients as one computation; runs with client terms, augmentation or client "
            "momentum train their own round in a pack, priced here as stacked; docs/benchmark.md):"
        )
        lines += packed_pricing.packing_lines(result["packing"], result["packed_runs"], result["device"])
    if result.get("packed_missing"):
        lines.append(result["packed_missing"])
    if result.get("share_prefixes", True):
        lines.append(sharing_line(result["total"], result.get("forked_runs", 0)))
    else:
        lines.append(f"rounds: {result['total']['rounds']:,} (share_prefixes: false: every run from round 0)")
    cluster = result.get("cluster")
    if cluster:
        minutes = cluster["run_minutes"].values()
        lines.append(
            f"Slurm: runs ask for {min(minutes)}-{max(minutes)} min each (x{RUNTIME_MARGIN:g} margin); "
            f"with {cluster['runs_per_gpu']} runs per GPU and a walltime of {cluster['walltime_min']} min, "
            f"use --group-components trainbatch={cluster['group_components']} "
            f"({cluster['submissions']} submissions)."
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- cluster requests

# A run's runtime request is its estimated compute times this margin (evaluation, server-side work,
# data loading and sharing the GPU with other runs are not in the step count), and never less than
# the floor (start-up, a queue's clock granularity).
RUNTIME_MARGIN = 3.0
RUNTIME_FLOOR_MIN = 10
RUNS_PER_GPU = 4  # the profiles' gpu_slot default; bench's throughput measurement suggests a site's own


GPU_CHECK_FILE = Path("results/bench/gpu_check.json")


def measured_runs_per_gpu(paths=(GPU_CHECK_FILE, BENCH_FILE, H200_BENCH_FILE)) -> tuple[int, str]:
    """Runs per GPU from a GPU throughput measurement (the fewest the measured settings chose), else
    the profiles' default; and where the number came from."""
    for path in map(Path, paths):
        if not path.exists():
            continue
        report = json.loads(path.read_text())
        report = report.get("bench", report)
        chosen = [t["runs_per_device"] for t in report.get("throughput", []) if t["device"].startswith("cuda")]
        if chosen:
            return min(chosen), f"measured ({path})"
    return RUNS_PER_GPU, "default (no GPU throughput measurement)"


def run_minutes(
    setting: dict,
    costs: StepCosts | dict,
    margin: float = RUNTIME_MARGIN,
    floor: int = RUNTIME_FLOOR_MIN,
    *,
    start: int = 0,
    stop: int | None = None,
) -> int:
    """Minutes a cluster job of this run asks for (attempt 1): estimated local steps of the rounds it
    trains (start..stop-1, see local_steps) x seconds per step (``costs``: the run's device's, see
    step_costs; a plain dict is one table) x margin. A model without any step cost asks for 120 minutes,
    the old fixed request."""
    seconds = costs.seconds(setting) if isinstance(costs, StepCosts) else step_seconds(costs, setting)
    if seconds is None:
        return 120
    return max(floor, math.ceil(local_steps(setting, start, stop) * seconds * margin / 60))


def group_size(minutes: list[int], walltime_min: int, runs_per_gpu: int = RUNS_PER_GPU) -> int:
    """How many runs one Slurm submission may hold so that it asks for at most ``walltime_min``.
    Snakemake asks a group for ceil(n / runs_per_gpu) x (longest run) minutes: layers of
    ``runs_per_gpu`` runs side by side, one layer after the other."""
    if walltime_min < 1 or runs_per_gpu < 1:
        raise PlanError(f"group_size: walltime {walltime_min} min and {runs_per_gpu} runs per GPU must be >= 1")
    longest = max(minutes)
    if longest > walltime_min:
        raise PlanError(
            f"one run asks for {longest} min, more than the site's walltime of {walltime_min} min: "
            "split it (fewer rounds) or measure its step cost (fedrepro plan --measure)"
        )
    return runs_per_gpu * (walltime_min // longest)


def cluster_requests(
    params: dict, walltime_min: int, runs_per_gpu: int = RUNS_PER_GPU, bench: str | Path | None = None
) -> dict:
    """Per-run runtime requests of a params file and the group size that fits a site's walltime; each run
    priced for the device it runs on, as the train rule prices it."""
    from fedrepro.configure import forks

    runs = expansion.unique_runs(expansion.expand(params))
    costs = step_costs_by_device(bench, {run_device(run.setting) for run in runs.values()})
    shared = forks.of_params(params, list(runs.values()))
    minutes = {
        run_id: run_minutes(
            run.setting, costs[run_device(run.setting)], start=shared[run_id].round if run_id in shared else 0
        )
        for run_id, run in runs.items()
    }
    size = group_size(list(minutes.values()), walltime_min, runs_per_gpu)
    return {
        "run_minutes": minutes,
        "group_components": size,
        "runs_per_gpu": runs_per_gpu,
        "walltime_min": walltime_min,
        "submissions": math.ceil(len(minutes) / size),
    }
