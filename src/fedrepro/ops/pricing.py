"""Seconds per local SGD step, per device: measured, read from a benchmark, or guessed.

``fedrepro plan --measure --device cuda`` times a few SGD steps of every (dataset, model, batch size) a
params file uses on this machine's device, on random inputs of the dataset's shape, and keeps them in
``results/bench/step_costs.json`` (the benchmark's ``bench.json`` serves too, for the settings it measures).
A plan is for one device (``--device``, a GPU by default) and uses only measurements of that device: per
setting, a GPU plan falls back to the H200's table (evidence/gpu), a CPU plan to the CPU table kept in
evidence/bench, then to a guess made from the GPU's; the plan names what priced each experiment.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedrepro import catalog, schedule
from fedrepro.configure import expansion
from fedrepro.run.provenance import machine

if TYPE_CHECKING:
    import torch
from fedrepro.errors import FedreproError


class PlanError(FedreproError, ValueError):
    """A plan that cannot be made (a file that holds no step costs, a run longer than the walltime)."""


BENCH_FILE = Path("results/bench/bench.json")
STEP_COSTS_FILE = Path("results/bench/step_costs.json")
# Measured on one NVIDIA H200 (evidence/gpu/README.md): used where this checkout has no measurement of its own,
# so a cluster's runtime requests start from a real GPU's step costs rather than the rough guesses below.
H200_STEP_COSTS_FILE = Path("evidence/gpu/step_costs-h200.json")
H200_BENCH_FILE = Path("evidence/gpu/bench_fmnist_cnn-7b632ae.json")
# Measured on this project's 2-core CPU VM, one torch thread (evidence/bench/README.md): a CPU plan's step costs
# where this checkout has no CPU measurement of its own, before any guess.
CPU_STEP_COSTS_FILE = Path("evidence/bench/step_costs-cpu.json")

# Rough seconds per local step at batch 64 on one recent data-centre GPU (each model's fragment, models/<family>.yaml);
# only used without a measurement, and reported as a guess.
ROUGH_STEP_SECONDS = {
    name: spec["rough_step_seconds"] for name, spec in catalog.MODELS.items() if "rough_step_seconds" in spec
}
ROUGH_BATCH = 64

# Pythia-70M's published architecture (EleutherAI model card), to time it without the hub's weights.
PYTHIA_70M = {
    "hidden_size": 512,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "intermediate_size": 2048,
    "vocab_size": 50304,
    "rotary_pct": 0.25,
    "max_position_embeddings": 2048,
}


def local_steps(setting: dict, start: int = 0, stop: int | None = None) -> float:
    """The local steps of rounds start..stop-1, every round by default: a run that starts from another run's
    state at round t (fedrepro.configure.forks) trains rounds t..R-1, the fork step that trains a parent's first
    rounds again 0..t-1. Every round costs the same here."""
    spec = catalog.DATASETS[setting["dataset"]]
    mean_size = spec["train_size"] / setting["num_clients"]
    epochs = setting["local_epochs"]
    if "random_epochs" in setting.get("plugins", []):
        epochs = (setting["random_epochs"]["low"] + setting["random_epochs"]["high"]) / 2
    batch = setting["batch_size"]
    if "random_batch" in setting.get("plugins", []):  # batch sizes from {low..n_i - 1}: about their middle
        batch = max(1.0, min(mean_size, (setting["random_batch"]["low"] + mean_size) / 2))
    rounds = (setting["rounds"] if stop is None else stop) - start
    return rounds * schedule.cohort_size(setting) * epochs * math.ceil(mean_size / batch)


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
    return [
        CostTable(f"measured on {measured_on} ({path.name})", f"measured on {measured_on} ({path})", costs)
        for measured_on, costs in measured_tables(path).items()
        if same_device(measured_on, device)
    ]


def given_measurements(path: Path, device: str) -> list[CostTable]:
    """The --bench file's measurements on ``device``: a file without them was named by mistake."""
    found = measured_tables(path)
    if not found:
        raise PlanError(f"--bench {path}: no step costs there (fedrepro plan --measure writes them)")
    tables = device_tables(path, device)
    if not tables:
        measured_on = sorted({name.split(":")[0] for name in found})
        raise PlanError(
            f"--bench {path} holds step costs measured on {', '.join(measured_on)}, none on {device}: "
            f"plan with --device {measured_on[0]}, or measure on {device}"
        )
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
        tables.append(
            CostTable("GPU table", f"measured on an NVIDIA H200 ({H200_STEP_COSTS_FILE})", next(iter(h200.values())))
        )
    rough = {m: {"seconds": s, "batch_size": ROUGH_BATCH} for m, s in ROUGH_STEP_SECONDS.items()}
    tables.append(
        CostTable(
            "guess (rough table)",
            "rough guess of a data-centre GPU's seconds per step "
            "(each model's rough_step_seconds, models/<family>.yaml); fedrepro plan --measure measures them",
            rough,
            guess=True,
        )
    )
    return tables


def as_cpu_guess(table: CostTable) -> CostTable:
    name = table.label.removeprefix("guess (").removesuffix(")")
    return CostTable(
        f"guess ({name} x {ROUGH_CPU_OVER_GPU:g})",
        f"not measured on a CPU: {table.description.split(';')[0]}, x "
        f"{ROUGH_CPU_OVER_GPU:g} (fedrepro.ops.pricing.ROUGH_CPU_OVER_GPU); fedrepro plan --measure --device "
        "cpu measures them",
        table.costs,
        ROUGH_CPU_OVER_GPU,
        guess=True,
    )


def step_costs(device: str = "cuda", bench: str | Path | None = None) -> StepCosts:
    """What prices a plan for ``device``, per (dataset, model, batch size): that device's measurement,
    then for a GPU the H200's table, and what neither has a rough guess. A CPU plan's entries without
    a CPU measurement (its own, then the kept one, CPU_STEP_COSTS_FILE) are the GPU's costs x ROUGH_CPU_OVER_GPU,
    marked as guesses."""
    fallback = gpu_tables()
    if check_device(device) == "cpu":
        fallback = device_tables(CPU_STEP_COSTS_FILE, "cpu") + [as_cpu_guess(table) for table in fallback]
    return StepCosts(device, tuple(own_measurements(device, bench) + fallback))


def step_costs_by_device(bench: str | Path | None = None, devices=DEVICES) -> dict[str, StepCosts]:
    """Each device's step costs: the train rule prices each run for the device it runs on (run_device)."""
    return {device: step_costs(device, bench) for device in devices}


def step_seconds(costs: dict, setting: dict) -> float | None:
    if step_key(setting) in costs:
        return float(costs[step_key(setting)])
    prefix = f"{setting['dataset']}/{setting['model']}:"
    other_batches = {int(k[len(prefix) :]): v for k, v in costs.items() if k.startswith(prefix)}
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

    spec = catalog.DATASETS[setting["dataset"]]
    batch = setting["batch_size"]
    labels = torch.randint(0, spec["num_classes"], (batch,), device=device)
    if spec.get("text"):
        from transformers import GPTNeoXConfig, GPTNeoXForSequenceClassification

        from fedrepro.data.agnews import TokenBatch

        net = GPTNeoXForSequenceClassification(
            GPTNeoXConfig(**PYTHIA_70M, num_labels=spec["num_classes"], pad_token_id=0, use_cache=False)
        ).to(device)
        length = int(setting.get("pretrained", {}).get("max_length", spec["shape"][0]))
        ids = torch.randint(1, PYTHIA_70M["vocab_size"], (batch, length), device=device)
        inputs = TokenBatch(ids, torch.ones_like(ids))
        return (lambda x: net(input_ids=x.input_ids, attention_mask=x.attention_mask).logits), net, inputs, labels
    model = models.build(setting["model"], setting["dataset"]).to(device)
    return model, model, torch.rand((batch, *spec["shape"]), device=device), labels


def measure_step(setting: dict, device: str = "cpu", steps: int = 10, warmup: int = 3) -> float:
    """Seconds per local SGD step (forward, backward, update) of this setting's model and batch. On a CPU, the
    process's CPU seconds: a plan prices CPU-hours, and on a shared machine the wall clock also counts the time
    other processes hold the core (on the project's 2-core VM at load 16, 5 times the CPU time)."""
    import torch

    device = torch.device(device)
    clock = time.process_time if device.type == "cpu" else time.perf_counter
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
    start = clock()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (clock() - start) / steps


def measure(params: dict, device: str = "cpu", out: str | Path = STEP_COSTS_FILE, steps: int = 10, log=print) -> dict:
    """Time one step of every (dataset, model, batch size) of the params file; merge into ``out``."""
    out = Path(out)
    table = json.loads(out.read_text()) if out.exists() else {}
    if out.exists() and "device" not in table:
        raise PlanError(f"{out} is not a step_costs file (a benchmark's bench.json?); measure into another file")
    if table.get("device") not in (None, device):
        table = {}  # costs of another device do not mix
    costs = table.get("step_seconds", {})
    settings = {step_key(r.setting): r.setting for r in expansion.expand(params)}
    for key, setting in sorted(settings.items()):
        costs[key] = measure_step(setting, device, steps)
        log(f"{key} on {device}: {costs[key] * 1e3:.2f} ms per step")
    table = {"device": device, "machine": machine(), "step_seconds": costs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=2, sort_keys=True))
    return table
