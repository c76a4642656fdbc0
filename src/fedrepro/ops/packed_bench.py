"""Seconds per packed step, measured: the batched and packed path's cost at a few pack sizes, per device.

A packed step is the computation ``run/packed.py`` runs for a pack: ``BatchedSGD`` (``run/batched.py``) advancing
S = runs x clients stacked models by one local SGD step each, every row on its own batch, in groups of the pack's
``max_together`` rows. Here it runs on generated inputs of the dataset's shape (uint8 on the device, as the
engine keeps them), so it times the step and nothing else (no evaluation, no server step). Per pack size: a
warm-up call, then ``steps`` timed steps; on CUDA the wall clock between synchronisations and the peak memory
(``torch.cuda.max_memory_allocated``), on a CPU the process's CPU seconds (a CPU plan prices CPU-hours) and no
memory. A pack size that runs out of device memory ends the curve there, recorded; a pack size whose step
would take longer than ``point_budget`` seconds, judged from the last one, is left out and said so.

The same step is then measured with ``step_graph: compile`` (``run/static_step.py``: every step computes all
rows, masked where a row has no batch, under ``torch.compile(mode="reduce-overhead")``, CUDA graphs on a GPU), the
settings in the same order within ``graph_budget`` seconds, its compiling and graph recording timed apart as the
warm-up (``warmup_seconds``). On a CPU it is not measured, and the record says why.

The record (``packed_pricing`` reads it) is one device's, like the sequential step costs:
``{"device", "machine", "measured_at", "total_memory_bytes", "memory", "packed_steps": {key: {"clients",
"points": [{"runs", "stacked", "seconds_per_step", "peak_bytes", "peak_bytes_per_model"}], ...}},
"skipped": {key: why}, "step_graph": {"mode": "compile", "packed_steps": {...}, "skipped": {...}} or {"mode",
"not_measured": why}}``.
"""

from __future__ import annotations

import inspect
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from fedrepro import catalog, models, schedule
from fedrepro.data.base import TensorDataset
from fedrepro.errors import FedreproError
from fedrepro.flat import learnt_buffers
from fedrepro.ops.pricing import step_key
from fedrepro.run.batchable import dropout_layers
from fedrepro.run.batched import BatchedSGD, ClientPlan
from fedrepro.run.client import LocalSGD
from fedrepro.run.packed import PackedRuns
from fedrepro.run.provenance import machine
from fedrepro.run.static_step import StaticStepSGD

RUNS = {"cuda": (1, 4, 16, 64), "cpu": (1, 2, 4)}  # pack sizes measured; a CPU's few, to stay within seconds
STEPS = {"cuda": 10, "cpu": 2}
# the rows a pack stacks into one computation (PackedRuns' own default, so the measurement is the pack's)
PACK_MAX_TOGETHER = inspect.signature(PackedRuns.__init__).parameters["max_together"].default
SAMPLES = 2048  # generated samples the batches index into
GRAPH = "compile"  # the step_graph measured beside the batched step
GRAPH_WARMUP_STEPS = 3  # reduce-overhead's CUDA graphs: a warm-up run, the recording, then a replay


class NotMeasurable(FedreproError):
    """A setting the packed path does not stack (its reason is recorded)."""


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _inputs(setting: dict, device: torch.device, clients: int):
    spec = catalog.DATASETS[setting["dataset"]]
    if spec.get("text"):
        raise NotMeasurable("a text model: its runs train one client at a time")
    gen = torch.Generator().manual_seed(0)
    n = max(SAMPLES, setting["batch_size"])
    images = torch.randint(0, 256, (n, *spec["shape"]), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, spec["num_classes"], (n,), generator=gen)
    data = TensorDataset(images.to(device), labels.to(device), 0.5, 0.25)
    torch.manual_seed(0)
    module = models.build(setting["model"], setting["dataset"]).to(device)
    return data, module


def _plans(stacked: int, steps: int, batch: int, n: int, device, gen: torch.Generator) -> list[ClientPlan]:
    return [
        ClientPlan(
            [torch.randint(0, n, (batch,), generator=gen).to(device) for _ in range(steps)], frozenset({steps - 1})
        )
        for _ in range(stacked)
    ]


def measure_curve(
    setting: dict,
    device: str,
    runs=None,
    steps: int | None = None,
    point_budget: float = 20.0,
    log=print,
    step_graph: str = "none",
    deadline: float | None = None,
) -> dict:
    """Seconds per packed step of this setting's model and batch size at each pack size in ``runs`` (runs of the
    setting's clients a round), on ``device``, with the step ``step_graph`` (none: ``BatchedSGD``); the record's
    entry for its key. No pack size starts past ``deadline`` (a ``time.perf_counter`` value)."""
    dev = torch.device(device)
    runs = tuple(runs or RUNS[dev.type])
    steps = steps or STEPS[dev.type]
    clients = schedule.cohort_size(setting)
    data, module = _inputs(setting, dev, clients)
    entry: dict = {"clients": clients, "points": [], "timed_steps": steps}
    if dropout_layers(module):
        # a pack never stacks runs whose model draws dropout masks (run/packed.py stack_key): each trains its own
        # batched round, so one run's clients are the whole step
        entry["alone"] = "dropout: each run trains its own batched round in the pack (run/packed.py)"
        runs = runs[:1]
    if step_graph == "none":
        engine, warmup_steps = BatchedSGD(module, LocalSGD(), PACK_MAX_TOGETHER), 1
    else:
        engine, warmup_steps = StaticStepSGD(module, LocalSGD(), PACK_MAX_TOGETHER, step_graph), GRAPH_WARMUP_STEPS
    label = "packed" if step_graph == "none" else f"packed step_graph={step_graph}"
    x = _flat(module.parameters())
    named = dict(module.named_buffers())
    names = learnt_buffers(module)
    buffers = _flat(named[n] for n in names) if names else None
    gen = torch.Generator().manual_seed(1)
    clock = time.perf_counter if dev.type == "cuda" else time.process_time
    last = None
    for r in runs:
        stacked = r * clients
        if last is not None and last[1] * stacked / last[0] * (steps + 1) > point_budget:
            guess = last[1] * stacked / last[0]
            entry["not_measured"] = f"{r} runs and more: about {guess:.1f} s a step, judged from {last[0]} stacked"
            break
        if deadline is not None and time.perf_counter() > deadline:
            entry["not_measured"] = f"{r} runs and more: the budget was spent"
            break
        ids = torch.arange(stacked, device=dev)
        try:
            warm = time.perf_counter()
            warmup = _plans(stacked, warmup_steps, setting["batch_size"], len(data), dev, gen)
            engine.train(0, data, ids, warmup, x, 0.01, buffers)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            warm = time.perf_counter() - warm
            timed = _plans(stacked, steps, setting["batch_size"], len(data), dev, gen)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
                torch.cuda.reset_peak_memory_stats(dev)
            tic = clock()
            engine.train(1, data, ids, timed, x, 0.01, buffers)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        except torch.cuda.OutOfMemoryError:
            entry["out_of_memory_at"] = stacked
            log(f"{label} {step_key(setting)} on {device}: {r} runs x {clients} clients ran out of memory")
            torch.cuda.empty_cache()
            break
        seconds = (clock() - tic) / steps
        peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
        per_model = None if peak is None else peak / stacked  # the data set's copy on the device included
        entry["points"].append(
            {
                "runs": r,
                "stacked": stacked,
                "seconds_per_step": seconds,
                "peak_bytes": peak,
                "peak_bytes_per_model": per_model,
                "warmup_seconds": warm,
            }
        )
        last = (stacked, seconds)
        log(
            f"{label} {step_key(setting)} on {device}: {r} runs x {clients} clients, {seconds * 1e3:.2f} ms a step"
            + ("" if peak is None else f", peak {peak / 2**20:.0f} MiB")
        )
    return entry


def measure(
    settings: list[dict],
    device: str,
    out: str | Path,
    runs=None,
    steps: int | None = None,
    budget: float = 90.0,
    log=print,
    graph_budget: float = 150.0,
) -> dict:
    """The packed step curve of each (dataset, model, batch size) of ``settings``, in their order, until
    ``budget`` seconds are spent (the rest are listed as skipped), then the same with ``step_graph: compile``
    within ``graph_budget`` seconds (CUDA only); written to ``out`` as one device's record."""
    dev = torch.device(device)
    by_key: dict[str, dict] = {}
    for setting in settings:
        by_key.setdefault(step_key(setting), setting)
    record = {
        "device": device,
        "machine": machine(),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "max_together": PACK_MAX_TOGETHER,
        "total_memory_bytes": torch.cuda.get_device_properties(dev).total_memory if dev.type == "cuda" else None,
        "memory": "torch.cuda.max_memory_allocated over the timed steps"
        if dev.type == "cuda"
        else f"not measured on {dev.type} (torch reports no peak memory there)",
    }
    record["packed_steps"], record["skipped"] = _curves(by_key, device, runs, steps, budget, log, "none")
    graphs: dict = {"mode": GRAPH}
    if dev.type == "cuda":
        graphs["packed_steps"], graphs["skipped"] = _curves(by_key, device, runs, steps, graph_budget, log, GRAPH)
    else:
        graphs["not_measured"] = (
            f"on {dev.type}: step_graph {GRAPH} is measured on CUDA only (there its step replays as CUDA graphs; "
            "a CPU has none, and compiling it with inductor takes minutes here)"
        )
        log(f"packed step_graph={GRAPH}: not measured {graphs['not_measured']}")
    record["step_graph"] = graphs
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(record, indent=2, sort_keys=True))
    return record


def _curves(by_key: dict, device: str, runs, steps, budget: float, log, step_graph: str) -> tuple[dict, dict]:
    """(curves, skipped) of the settings ``by_key`` in their order, with this step, within ``budget`` seconds."""
    curves, skipped = {}, {}
    start = time.perf_counter()
    for key, setting in by_key.items():
        if time.perf_counter() - start > budget:
            skipped[key] = f"not measured: the budget of {budget:g} s was spent"
            continue
        try:
            curves[key] = measure_curve(
                setting, device, runs, steps, log=log, step_graph=step_graph, deadline=start + budget
            )
        except (NotMeasurable, ImportError) as err:
            skipped[key] = str(err)
    return curves, skipped


# IMA Table 1's FMNIST rows: the table a GPU slot extrapolates, so its setting is measured first
FIRST = ("fmnist/cnn:50",)


def by_compute(runs, device: str = "cuda") -> list[dict]:
    """The settings of ``runs`` (expanded runs), one per (dataset, model, batch size): FIRST, then the most
    compute on the sequential path first (local steps x the device's step cost; unpriced ones last), so that a
    measurement cut short by its budget has the settings that weigh most in a plan."""
    from fedrepro.ops.pricing import local_steps, step_costs

    costs = step_costs(device)
    weight: dict[str, float] = {}
    first: dict[str, dict] = {}
    for run in runs:
        key = step_key(run.setting)
        first.setdefault(key, run.setting)
        seconds = costs.seconds(run.setting)
        weight[key] = weight.get(key, 0.0) + (0.0 if seconds is None else local_steps(run.setting) * seconds)
    order = sorted(first, key=lambda k: (k not in FIRST, -weight[k], k))
    return [first[k] for k in order]


def measure_params(
    paths: list[str], device: str, out: str | Path, budget: float, log=print, graph_budget: float = 150.0
) -> dict:
    """The packed step curves of the (dataset, model, batch size)s of these params files (those present), in
    by_compute's order, within ``budget`` seconds, and with step_graph compile within ``graph_budget`` seconds
    (scripts/gpu_check.sh: the four papers' files)."""
    from fedrepro.configure import expansion, paramsfile

    runs = [r for path in paths if Path(path).exists() for r in expansion.expand(paramsfile.load_params_files([path]))]
    return measure(by_compute(runs, device), device, out, budget=budget, log=log, graph_budget=graph_budget)
