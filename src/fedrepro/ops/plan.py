"""What a params file will cost before it runs: runs per experiment and estimated compute.

Compute is counted in local SGD steps (the dominant cost of these papers' runs):

    steps(run) = rounds x cohort x E x ceil((N / clients) / B)

with the mean client size N / clients and, for ``+random_epochs``, the mean of its epoch range.
Seconds per step are measured: ``fedrepro plan --measure --device cuda`` times a few SGD steps of
every (dataset, model, batch size) the params file uses on this machine's device, on random inputs of
the dataset's shape, and keeps them in ``results/bench/step_costs.json`` (the benchmark's
``bench.json`` serves too, for the settings it measures). A plan is for one device (``--device``, a GPU
by default) and uses only measurements of that device: per setting, a GPU plan falls back to the H200's
table (evidence/gpu), a CPU plan to a guess made from it; the plan names what priced each experiment.
Server-side work (the proxy-set epochs of FedLAW, FedDF, FedBE and Server-FT, FedAWARE's min-norm solve)
and evaluation are not counted. A run that starts from another run's state (fedrepro.spec.forks) counts only
the rounds it trains itself; the plan gives both counts.
"""
from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from fedrepro import catalog, registry
from fedrepro.spec import config, settings
from fedrepro.provenance import machine
from fedrepro.rundir import RunDir
from fedrepro.errors import FedreproError


class PlanError(FedreproError, ValueError):
    """A plan that cannot be made (a file that holds no step costs, a run longer than the walltime)."""


BENCH_FILE = Path("results/bench/bench.json")
STEP_COSTS_FILE = Path("results/bench/step_costs.json")
# Measured on one NVIDIA H200 (evidence/gpu/README.md): used where this checkout has no measurement of its own,
# so a cluster's runtime requests start from a real GPU's step costs rather than the rough guesses below.
H200_STEP_COSTS_FILE = Path("evidence/gpu/step_costs-h200.json")
H200_BENCH_FILE = Path("evidence/gpu/bench_fmnist_cnn-7b632ae.json")

# Rough seconds per local step at batch 64 on one recent data-centre GPU; only used without a
# measurement, and reported as a guess.
ROUGH_STEP_SECONDS = {
    "mlp": 4e-4, "lenet5": 6e-4, "cnn": 7e-4, "logreg": 2e-4, "cnn_fedaware": 7e-4, "simplecnn": 7e-4,
    "resnet20": 4e-3, "resnet56": 1e-2, "resnet18_gn32": 1.2e-2, "resnet18_gn2": 1.2e-2,
    "vgg11": 4e-3, "vgg11_gn2": 6e-3, "alexnet": 2e-3, "resnet8": 2e-3, "pythia70m": 3e-2,
    # FedLAW Table 5, guessed from the FLOPs relative to ResNet-56 (not measured)
    "resnet110": 2e-2, "wrn56_4": 6e-2, "densenet121": 8e-2,
    # IMA's feature-skew models, guessed the same way: the Digit CNN about the CIFAR CNN's FLOPs x 3, the
    # PACS AlexNet (224 x 224 inputs) about torchvision's AlexNet (not measured)
    "digit_cnn_gn2": 2e-3, "alexnet_gn32": 8e-3,
}
ROUGH_BATCH = 64

# Pythia-70M's published architecture (EleutherAI model card), to time it without the hub's weights.
PYTHIA_70M = {"hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8, "intermediate_size": 2048,
              "vocab_size": 50304, "rotary_pct": 0.25, "max_position_embeddings": 2048}


def local_steps(setting: dict, start: int = 0, stop: int | None = None) -> float:
    """The local steps of rounds start..stop-1, every round by default: a run that starts from another run's
    state at round t (fedrepro.spec.forks) trains rounds t..R-1, the fork step that trains a parent's first
    rounds again 0..t-1. Every round costs the same here."""
    spec = registry.DATASETS[setting["dataset"]]
    mean_size = spec["train_size"] / setting["num_clients"]
    epochs = setting["local_epochs"]
    if "random_epochs" in setting.get("plugins", []):
        epochs = (setting["random_epochs"]["low"] + setting["random_epochs"]["high"]) / 2
    batch = setting["batch_size"]
    if "random_batch" in setting.get("plugins", []):  # batch sizes from {low..n_i - 1}: about their middle
        batch = max(1.0, min(mean_size, (setting["random_batch"]["low"] + mean_size) / 2))
    rounds = (setting["rounds"] if stop is None else stop) - start
    return rounds * catalog.cohort_size(setting) * epochs * math.ceil(mean_size / batch)


def step_key(setting: dict) -> str:
    return f"{setting['dataset']}/{setting['model']}:{setting['batch_size']}"


DEVICES = ("cuda", "cpu")

# A CPU's seconds per step over the GPU table's, for a CPU plan's entries nobody measured on a CPU. On one core
# the ratio runs from about 1 (FedLAW's MLP, launch-bound on the GPU) to about 160 (ResNet-18): any one number
# is a guess, and the plan says so for every experiment it prices.
ROUGH_CPU_OVER_GPU = 50.0


def run_device(setting: dict) -> str:
    """The device a run's cost is planned for: ``device: cpu`` runs on the CPU, ``auto`` and ``cuda`` are
    planned for the GPU a cluster gives them (the train rule asks for one the same way)."""
    return "cpu" if setting.get("device") == "cpu" else "cuda"


def check_device(device: str) -> str:
    if device not in DEVICES:
        raise PlanError(f"--device {device!r}: choose one of {', '.join(DEVICES)}")
    return device


def same_device(measured: str, planned: str) -> bool:
    """A measurement on ``cuda:1`` prices ``cuda`` runs; one whose device is not recorded prices any (an old
    step-costs file, given on purpose with --bench)."""
    return measured == "unknown device" or measured.split(":")[0] == planned


def measured_tables(path: Path) -> dict[str, dict]:
    """Device -> (flat key -> seconds) of a step_costs.json (one device) or a bench.json (one table per device)."""
    if not path.exists():
        return {}
    table = json.loads(path.read_text())
    measured = table.get("step_seconds") or {}
    if measured and all(isinstance(v, dict) and "seconds" not in v for v in measured.values()):
        return {device: costs for device, costs in measured.items() if costs}
    return {table.get("device", "unknown device"): measured} if measured else {}


@dataclass(frozen=True)
class CostTable:
    """Seconds per local step from one source. ``label`` names it beside each experiment it prices,
    ``description`` says once per plan where its numbers come from."""
    label: str
    description: str
    costs: dict
    factor: float = 1.0  # a CPU guess made from a GPU's costs
    guess: bool = False

    def seconds(self, setting: dict) -> float | None:
        seconds = step_seconds(self.costs, setting)
        return None if seconds is None else seconds * self.factor


@dataclass(frozen=True)
class StepCosts:
    """The tables that price one device's runs, the most trusted first: a setting none of them prices is
    reported unpriced, never priced at 0."""
    device: str
    tables: tuple[CostTable, ...]

    def price(self, setting: dict) -> tuple[float, CostTable] | None:
        for table in self.tables:
            seconds = table.seconds(setting)
            if seconds is not None:
                return seconds, table
        return None

    def seconds(self, setting: dict) -> float | None:
        priced = self.price(setting)
        return None if priced is None else priced[0]


def device_tables(path: Path, device: str) -> list[CostTable]:
    """The measurements on ``device`` that ``path`` holds; those of another device are left out, so that a
    CPU benchmark never prices a GPU plan."""
    return [CostTable(f"measured on {measured_on} ({path.name})", f"measured on {measured_on} ({path})", costs)
            for measured_on, costs in measured_tables(path).items() if same_device(measured_on, device)]


def given_measurements(path: Path, device: str) -> list[CostTable]:
    """The --bench file's measurements on ``device``: a file without them was named by mistake."""
    found = measured_tables(path)
    if not found:
        raise PlanError(f"--bench {path}: no step costs there (fedrepro plan --measure writes them)")
    tables = device_tables(path, device)
    if not tables:
        measured_on = sorted({name.split(":")[0] for name in found})
        raise PlanError(f"--bench {path} holds step costs measured on {', '.join(measured_on)}, none on {device}: "
                        f"plan with --device {measured_on[0]}, or measure on {device}")
    return tables


def own_measurements(device: str, bench: str | Path | None) -> list[CostTable]:
    """This checkout's measurements on ``device``: the --bench file, else step_costs.json and bench.json."""
    if bench:
        return given_measurements(Path(bench), device)
    return [table for path in (STEP_COSTS_FILE, BENCH_FILE) for table in device_tables(path, device)]


def gpu_tables() -> list[CostTable]:
    """The step costs a GPU plan falls back to: the H200's measurement (evidence/gpu), then the rough table."""
    tables = []
    h200 = measured_tables(H200_STEP_COSTS_FILE)
    if h200:
        tables.append(CostTable("GPU table", f"measured on an NVIDIA H200 ({H200_STEP_COSTS_FILE})",
                                next(iter(h200.values()))))
    rough = {m: {"seconds": s, "batch_size": ROUGH_BATCH} for m, s in ROUGH_STEP_SECONDS.items()}
    tables.append(CostTable("guess (rough table)", "rough guess of a data-centre GPU's seconds per step "
                            "(fedrepro.ops.plan.ROUGH_STEP_SECONDS); fedrepro plan --measure measures them",
                            rough, guess=True))
    return tables


def as_cpu_guess(table: CostTable) -> CostTable:
    name = table.label.removeprefix("guess (").removesuffix(")")
    return CostTable(f"guess ({name} x {ROUGH_CPU_OVER_GPU:g})",
                     f"not measured on a CPU: {table.description.split(';')[0]}, x "
                     f"{ROUGH_CPU_OVER_GPU:g} (fedrepro.ops.plan.ROUGH_CPU_OVER_GPU); fedrepro plan --measure --device "
                     "cpu measures them", table.costs, ROUGH_CPU_OVER_GPU, guess=True)


def step_costs(device: str = "cuda", bench: str | Path | None = None) -> StepCosts:
    """What prices a plan for ``device``, per (dataset, model, batch size): that device's measurement,
    then for a GPU the H200's table, and what neither has a rough guess. A CPU plan's entries without
    a CPU measurement are the GPU's costs x ROUGH_CPU_OVER_GPU, marked as guesses."""
    fallback = gpu_tables()
    if check_device(device) == "cpu":
        fallback = [as_cpu_guess(table) for table in fallback]
    return StepCosts(device, tuple(own_measurements(device, bench) + fallback))


def step_costs_by_device(bench: str | Path | None = None, devices=DEVICES) -> dict[str, StepCosts]:
    """Each device's step costs: the train rule prices each run for the device it runs on (run_device)."""
    return {device: step_costs(device, bench) for device in devices}


def step_seconds(costs: dict, setting: dict) -> float | None:
    if step_key(setting) in costs:
        return float(costs[step_key(setting)])
    prefix = f"{setting['dataset']}/{setting['model']}:"
    other_batches = {int(k[len(prefix):]): v for k, v in costs.items() if k.startswith(prefix)}
    if other_batches:  # the nearest measured batch size, scaled
        batch = min(other_batches, key=lambda b: abs(b - setting["batch_size"]))
        entry = {"seconds": other_batches[batch], "batch_size": batch}
    else:
        entry = costs.get(f"{setting['model']}/{setting['dataset']}", costs.get(setting["model"]))
    if entry is None:
        return None
    if isinstance(entry, dict):
        # Small models are launch-bound, so cost grows slower than the batch; linear is an upper bound.
        return entry["seconds"] * max(1.0, setting["batch_size"] / entry.get("batch_size", setting["batch_size"]))
    return float(entry)


def _timed_model(setting: dict, device: torch.device):
    """(model, inputs, labels) of one local step of this setting, on random data of the right shape."""
    import torch  # only measuring needs torch: the Snakefile reads step costs without importing it

    from fedrepro import models
    spec = registry.DATASETS[setting["dataset"]]
    batch = setting["batch_size"]
    labels = torch.randint(0, spec["num_classes"], (batch,), device=device)
    if spec.get("text"):
        from transformers import GPTNeoXConfig, GPTNeoXForSequenceClassification

        from fedrepro.data.agnews import TokenBatch
        net = GPTNeoXForSequenceClassification(GPTNeoXConfig(**PYTHIA_70M, num_labels=spec["num_classes"],
                                                             pad_token_id=0, use_cache=False)).to(device)
        length = int(setting.get("pretrained", {}).get("max_length", spec["shape"][0]))
        ids = torch.randint(1, PYTHIA_70M["vocab_size"], (batch, length), device=device)
        inputs = TokenBatch(ids, torch.ones_like(ids))
        return (lambda x: net(input_ids=x.input_ids, attention_mask=x.attention_mask).logits), net, inputs, labels
    model = models.build(setting["model"], setting["dataset"]).to(device)
    return model, model, torch.rand((batch, *spec["shape"]), device=device), labels


def measure_step(setting: dict, device: str = "cpu", steps: int = 10, warmup: int = 3) -> float:
    """Seconds per local SGD step (forward, backward, update) of this setting's model and batch."""
    import torch
    device = torch.device(device)
    forward, module, inputs, labels = _timed_model(setting, device)
    opt = torch.optim.SGD(module.parameters(), lr=1e-3, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(forward(inputs), labels).backward()
        opt.step()

    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / steps


def measure(params: dict, device: str = "cpu", out: str | Path = STEP_COSTS_FILE, steps: int = 10,
            log=print) -> dict:
    """Time one step of every (dataset, model, batch size) of the params file; merge into ``out``."""
    out = Path(out)
    table = json.loads(out.read_text()) if out.exists() else {}
    if out.exists() and "device" not in table:
        raise PlanError(f"{out} is not a step_costs file (a benchmark's bench.json?); measure into another file")
    if table.get("device") not in (None, device):
        table = {}  # costs of another device do not mix
    costs = table.get("step_seconds", {})
    settings = {step_key(r.setting): r.setting for r in config.expand(params)}
    for key, setting in sorted(settings.items()):
        costs[key] = measure_step(setting, device, steps)
        log(f"{key} on {device}: {costs[key] * 1e3:.2f} ms per step")
    table = {"device": device, "machine": machine(), "step_seconds": costs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=2, sort_keys=True))
    return table


def final_runs(tunings: dict, runs_dir: str | Path) -> tuple[list[settings.Run], set[str]]:
    """The final runs of the tunings (fedrepro.spec.tuning), and the ids of those whose tuning has not chosen yet:
    with the chosen value where the choice is there (results/tuning/ beside the runs folder), else with the tune
    grid's first candidate, which stands in for the cost and for which runs are shared (not done: the run
    is not known before the choice)."""
    from fedrepro.spec import tuning

    runs, waiting = [], set()
    for tid, entry in tunings.items():
        path = Path(runs_dir).parent / "tuning" / f"{tid}.json"
        chosen = json.loads(path.read_text()) if path.is_file() else {"chosen": entry["selection"]["candidates"][0]["point"]}
        for run, _ in tuning.final_runs({tid: entry}, {tid: chosen}):
            runs.append(run)
            if not path.is_file():
                waiting.add(run.id)
    return runs, waiting


SUMMED = ("runs", "tuning", "shared", "done", "rounds", "rounds_unshared", "rounds_tuning", "rounds_tuning_unshared",
          "steps", "steps_unshared", "seconds", "seconds_unshared")


def plan(params: dict, bench: str | Path | None = None, runs_dir: str | Path = "results/runs",
         device: str = "cuda") -> dict:
    """Runs, rounds, local steps and seconds left to train on ``device`` per experiment, and the step-cost
    tables that priced each (``priced_by``, described in ``sources``); ``*_unshared`` as if every run
    trained from round 0 (``share_prefixes: false``), the others with shared prefixes trained once;
    ``rounds_tuning*``: the part of the rounds that the tuning stage's runs train (counted in rounds too). The
    final runs of a tuning (fedrepro.spec.tuning) are counted with the chosen value, or the tune grid's first
    candidate before the choice, and share prefixes among themselves as the workflow has them do."""
    from fedrepro.spec import forks

    tunings: dict = {}
    runs = config.expand(params, tunings)
    finals, waiting = final_runs(tunings, runs_dir)
    runs += finals
    shared = forks.of_params(params, list(config.unique_runs(runs).values()))
    costs = step_costs(device, bench)
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
        priced = costs.price(run.setting)
        if priced is None:
            row["unknown"].add(run.setting["model"])
        else:
            sec, table = priced
            row["priced_by"].add(table.label)
            row["seconds"] += steps * sec
            row["seconds_unshared"] += unshared * sec
    in_order = [table.label for table in costs.tables]
    experiments = {name: {**row, "unknown": sorted(row["unknown"]),
                          "priced_by": sorted(row["priced_by"], key=in_order.index)} for name, row in rows.items()}
    total = {k: sum(r[k] for r in experiments.values()) for k in SUMMED}
    used = [t for t in costs.tables if any(t.label in row["priced_by"] for row in experiments.values())]
    return {"device": device, "source": "; ".join(t.description for t in used) or "nothing to price",
            "sources": {t.label: t.description for t in used}, "guessed": [t.label for t in used if t.guess],
            "experiments": experiments, "total": total, "unique_runs": len(seen),
            "forked_runs": sum(1 for run_id in shared if run_id in seen), "share_prefixes": forks.sharing(params)}


def sharing_line(total: dict, forked_runs: int) -> str:
    """``rounds: 247,250 (436,400 without shared prefixes, 43% saved)`` and the compute both ways; with a
    tuning stage, the rounds outside it both ways too (its runs score a validation split: they rarely share a
    prefix with anything, and would hide what sharing saves on the runs the tables report)."""
    saved = lambda rounds, unshared: 1 - rounds / unshared if unshared else 0.0  # noqa: E731
    hours, unshared = total["seconds"] / 3600, total["seconds_unshared"] / 3600
    line = (f"rounds: {total['rounds']:,} ({total['rounds_unshared']:,} without shared prefixes, "
            f"{saved(total['rounds'], total['rounds_unshared']):.0%} saved; {forked_runs:,} runs start from "
            f"another run's state); compute: {hours:,.1f} h ({unshared:,.1f} h without shared prefixes)")
    if total.get("rounds_tuning_unshared"):
        own = total["rounds"] - total["rounds_tuning"]
        own_unshared = total["rounds_unshared"] - total["rounds_tuning_unshared"]
        line += (f"\nrounds outside the tuning stage: {own:,} ({own_unshared:,} without shared prefixes, "
                 f"{saved(own, own_unshared):.0%} saved); in it: {total['rounds_tuning']:,} "
                 f"({total['rounds_tuning_unshared']:,} without shared prefixes)")
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
    lines = [f"{'experiment':40s} {'runs':>6s} {'tuning':>6s} {'shared':>6s} {'done':>5s} {'rounds':>9s} "
             f"{'unshared':>9s} {'local steps':>13s} {'hours':>10s}"]
    for name, row in list(result["experiments"].items()) + [("TOTAL", result["total"])]:
        hours = row["seconds"] / 3600
        note = priced_note(row)
        lines.append(f"{name:40s} {row['runs']:6d} {row.get('tuning', 0):6d} {row['shared']:6d} {row['done']:5d} "
                     f"{row['rounds']:9d} {row['rounds_unshared']:9d} {row['steps']:13.3g} {hours:10.1f}{note}")
    lines.append("tuning: of the runs, those of the tuning stage (a validation split; the final runs they tune are "
                 "counted with the chosen value, or the tune grid's first before the choice)")
    lines.append(f"{result['unique_runs']} distinct runs, compute on {result.get('device', 'cuda')}. Not counted: "
                 "evaluation, server-side optimisation (proxy-set epochs of FedLAW/FedDF/FedBE/Server-FT, FedAWARE "
                 "min-norm).")
    lines += sources_lines(result)
    if result.get("share_prefixes", True):
        lines.append(sharing_line(result["total"], result.get("forked_runs", 0)))
    else:
        lines.append(f"rounds: {result['total']['rounds']:,} (share_prefixes: false: every run from round 0)")
    cluster = result.get("cluster")
    if cluster:
        minutes = cluster["run_minutes"].values()
        lines.append(f"Slurm: runs ask for {min(minutes)}-{max(minutes)} min each (x{RUNTIME_MARGIN:g} margin); "
                     f"with {cluster['runs_per_gpu']} runs per GPU and a walltime of {cluster['walltime_min']} min, "
                     f"use --group-components trainbatch={cluster['group_components']} "
                     f"({cluster['submissions']} submissions).")
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


def run_minutes(setting: dict, costs: StepCosts | dict, margin: float = RUNTIME_MARGIN,
                floor: int = RUNTIME_FLOOR_MIN, *, start: int = 0, stop: int | None = None) -> int:
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
        raise PlanError(f"one run asks for {longest} min, more than the site's walltime of {walltime_min} min: "
                         "split it (fewer rounds) or measure its step cost (fedrepro plan --measure)")
    return runs_per_gpu * (walltime_min // longest)


def cluster_requests(params: dict, walltime_min: int, runs_per_gpu: int = RUNS_PER_GPU,
                     bench: str | Path | None = None) -> dict:
    """Per-run runtime requests of a params file and the group size that fits a site's walltime; each run
    priced for the device it runs on, as the train rule prices it."""
    from fedrepro.spec import forks

    runs = config.unique_runs(config.expand(params))
    costs = step_costs_by_device(bench, {run_device(run.setting) for run in runs.values()})
    shared = forks.of_params(params, list(runs.values()))
    minutes = {run_id: run_minutes(run.setting, costs[run_device(run.setting)],
                                   start=shared[run_id].round if run_id in shared else 0)
               for run_id, run in runs.items()}
    size = group_size(list(minutes.values()), walltime_min, runs_per_gpu)
    return {"run_minutes": minutes, "group_components": size, "runs_per_gpu": runs_per_gpu,
            "walltime_min": walltime_min, "submissions": math.ceil(len(minutes) / size)}
