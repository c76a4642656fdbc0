"""The batched and packed path priced from measured packed step costs, and how many runs a pack holds.

A packed step advances S stacked models (runs x clients, ``run/packed.py``) by one local SGD step each;
``fedrepro.ops.packed_bench`` measures its seconds at a few pack sizes per (dataset, model, batch size) and
device, with the peak device memory where the device reports it. From such a record:

* **the knee**: runs per device-hour at S stacked models grow as S / seconds(S); walking the measured S upwards,
  the knee is the first S whose next measured size adds at most ``KNEE_GAIN`` of its runs per device-hour (the
  largest measured S when every step adds more; a larger S is never chosen, as nothing measured it);
* **memory**: peak(S) = fixed + S x per model, fitted through the smallest and largest measured S (one point:
  fixed 0, per model its peak / S); S fits when peak(S) <= (1 - ``MEMORY_HEADROOM``) x the device's memory, and
  stays below a pack size that ran out of memory. On a CPU the peak is not measured and memory bounds nothing;
* **runs a pack**: for runs of c clients a round, min(knee // c, memory limit // c), at least 1;
* **a run's seconds**: steps per client per round x rounds x seconds(runs x c) / runs, seconds(S) interpolated
  linearly between measured S, taken at the smallest measured S below it (an upper bound) and grown in
  proportion above the largest (what a flat throughput means).

Where a device has no record for a setting, the plan prices it on the sequential path (``pricing.py``) and says so.
A run of ``step_graph: compile`` is priced from the record's curves of that step (``"step_graph"``) where it has
one for the setting, else from the plain packed step's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from fedrepro import schedule
from fedrepro.ops.pricing import local_steps, step_key

# This checkout's own measurement on a device (``fedrepro plan --measure-packed``), then the kept GPU records
# (scripts/gpu_check.sh writes evidence/gpu/packed_steps-<commit>.json; the newest measurement wins).
OWN_FILE = "results/bench/packed_steps-{device}.json"
KEPT_GLOB = {"cuda": "evidence/gpu/packed_steps-*.json"}
KNEE_GAIN = 0.10  # a larger pack that adds at most 10% runs per device-hour is not worth the memory and the wait
MEMORY_HEADROOM = 0.20  # of the device's memory left to the CUDA context, fragmentation, data and evaluation


@dataclass(frozen=True)
class PackedCurve:
    """One (dataset, model, batch size)'s measured packed steps on one device."""

    key: str
    clients: int  # clients a round of each measured run
    stacked: tuple[int, ...]  # stacked models (runs x clients) of each measured point, ascending
    seconds: tuple[float, ...]  # seconds per packed step at each
    peak_bytes: tuple[int, ...] | None  # peak device memory at each; None: not measured (a CPU)
    total_memory: int | None
    out_of_memory_at: int | None = None  # stacked models of a pack size that ran out of memory
    alone: str = ""  # why runs of this model never stack in a pack (each trains its own batched round)
    source: str = ""

    def step_seconds(self, stacked: int) -> float:
        """Seconds of one packed step of ``stacked`` models (module docstring)."""
        s, t = self.stacked, self.seconds
        if stacked <= s[0]:
            return t[0]
        if stacked >= s[-1]:
            return t[-1] * stacked / s[-1]
        i = next(i for i in range(1, len(s)) if stacked <= s[i])
        return t[i - 1] + (t[i] - t[i - 1]) * (stacked - s[i - 1]) / (s[i] - s[i - 1])


@dataclass(frozen=True)
class PackChoice:
    runs: int  # runs a pack (a GPU trains one pack at a time)
    stacked: int  # runs x clients
    bound: str  # "knee", "memory", "knee and memory", "one run per step (dropout)"
    why: str


def knee(curve: PackedCurve, gain: float = KNEE_GAIN) -> tuple[int, str]:
    """The stacked models past which runs per device-hour grow by at most ``gain``, and why in words."""
    s, t = curve.stacked, curve.seconds
    if len(s) == 1:
        return s[0], f"one pack size measured ({s[0]} stacked models)"
    rate = [n / sec for n, sec in zip(s, t)]  # stacked model-steps per second: runs per device-hour up to a factor
    for i in range(len(s) - 1):
        grew = rate[i + 1] / rate[i] - 1
        if grew <= gain:
            return s[i], (
                f"knee at {s[i]} stacked models: {s[i + 1]} add {grew:+.0%} runs per device-hour (at most {gain:.0%})"
            )
    return s[-1], f"runs per device-hour still grow past {gain:.0%} at {s[-1]} stacked models, the largest measured"


def memory_limit(curve: PackedCurve, headroom: float = MEMORY_HEADROOM) -> tuple[int | None, str]:
    """The most stacked models whose fitted peak memory fits (None: memory not measured), and why in words."""
    if curve.peak_bytes is None or not curve.total_memory:
        return None, "memory not measured on this device"
    s, peak = curve.stacked, curve.peak_bytes
    if len(s) == 1:
        per_model, fixed = peak[0] / s[0], 0.0
    else:
        per_model = max((peak[-1] - peak[0]) / (s[-1] - s[0]), 1.0)
        fixed = max(peak[0] - per_model * s[0], 0.0)
    room = (1 - headroom) * curve.total_memory
    limit = max(int((room - fixed) // per_model), 0)
    why = (
        f"{per_model / 2**20:.2f} MiB per stacked model + {fixed / 2**20:.0f} MiB fit {limit} in "
        f"{1 - headroom:.0%} of {curve.total_memory / 2**30:.0f} GiB"
    )
    if curve.out_of_memory_at is not None and limit >= curve.out_of_memory_at:
        limit = curve.out_of_memory_at - 1
        why += f"; {curve.out_of_memory_at} ran out of memory, so at most {limit}"
    return limit, why


def pack_size(curve: PackedCurve, clients: int) -> PackChoice:
    """How many runs of ``clients`` clients a round one pack holds on this device (module docstring)."""
    if curve.alone:
        return PackChoice(1, clients, "one run per step (dropout)", curve.alone)
    at_knee, knee_why = knee(curve)
    limit, memory_why = memory_limit(curve)
    by_knee = max(at_knee // clients, 1)
    by_memory = by_knee if limit is None else max(limit // clients, 1)
    runs = min(by_knee, by_memory)
    if limit is None or by_knee < by_memory:
        bound = "knee"
    elif by_memory < by_knee:
        bound = "memory"
    else:
        bound = "knee and memory"
    return PackChoice(runs, runs * clients, bound, f"{knee_why}; {memory_why}")


def run_seconds(setting: dict, curve: PackedCurve, start: int = 0, stop: int | None = None) -> float:
    """Seconds of the rounds start..stop-1 of one run trained in a pack of pack_size runs: each packed step
    advances every run's clients once, so a run's share is seconds(runs x clients) / runs a step."""
    clients = schedule.cohort_size(setting)
    choice = pack_size(curve, clients)
    steps_per_client = local_steps(setting, start, stop) / clients
    return steps_per_client * curve.step_seconds(choice.stacked) / choice.runs


# ---------------------------------------------------------------- the records


def curves_of(record: dict, source: str) -> dict[str, PackedCurve]:
    curves = {}
    for key, entry in record.get("packed_steps", {}).items():
        points = sorted(entry["points"], key=lambda p: p["stacked"])
        if not points:
            continue
        peaks = [p.get("peak_bytes") for p in points]
        curves[key] = PackedCurve(
            key,
            int(entry["clients"]),
            tuple(int(p["stacked"]) for p in points),
            tuple(float(p["seconds_per_step"]) for p in points),
            None if any(b is None for b in peaks) else tuple(int(b) for b in peaks),
            record.get("total_memory_bytes"),
            entry.get("out_of_memory_at"),
            entry.get("alone", ""),
            source,
        )
    return curves


@dataclass(frozen=True)
class PackedCosts:
    """The packed step costs of one device, from the first record found (``paths``), or none."""

    device: str
    curves: dict[str, PackedCurve]
    source: str  # the record's file and machine, or "" when there is none
    looked_in: tuple[str, ...]
    file: str = ""  # the record's file
    graph_curves: dict[str, PackedCurve] = field(default_factory=dict)  # the step of step_graph: compile

    def curve(self, setting: dict) -> PackedCurve | None:
        key = step_key(setting)
        if setting.get("step_graph") == "compile" and key in self.graph_curves:
            return self.graph_curves[key]
        return self.curves.get(key)

    def missing_line(self, keys: list[str], command: str) -> str | None:
        """One line naming the measurement missing for ``keys`` (None: nothing missing)."""
        lacking = sorted(k for k in set(keys) if k not in self.curves)
        if not lacking:
            return None
        where = f"no packed step costs on {self.device}"
        if self.curves:
            where += f" for {', '.join(lacking)} in {self.file}"
        else:
            where += f" ({' or '.join(self.looked_in)})"
        return f"{where}: priced on the sequential path (one client at a time); `{command}` measures them" + (
            " (scripts/gpu_check.sh on a GPU node)" if self.device == "cuda" else ""
        )


def record_files(device: str) -> list[Path]:
    """Where a device's packed step costs are looked for: this checkout's own, then the kept GPU records,
    the newest measurement first."""
    kept = sorted(Path().glob(KEPT_GLOB[device]), key=_measured_at, reverse=True) if device in KEPT_GLOB else []
    return [Path(OWN_FILE.format(device=device)), *kept]


def _measured_at(path: Path) -> str:
    try:
        return json.loads(path.read_text()).get("measured_at", "")
    except (OSError, ValueError):
        return ""


def packed_costs(device: str, paths: list[Path] | None = None) -> PackedCosts:
    """The first record on ``device`` among ``paths`` (default record_files(device))."""
    shown = (OWN_FILE.format(device=device), *([KEPT_GLOB[device]] if device in KEPT_GLOB else []))
    if paths is not None:
        shown = tuple(map(str, paths))
    paths = record_files(device) if paths is None else [Path(p) for p in paths]
    for path in paths:
        if not path.is_file():
            continue
        record = json.loads(path.read_text())
        if record.get("device", "").split(":")[0] != device:
            continue
        gpu = record.get("machine", {}).get("gpu") if device == "cuda" else record.get("machine", {}).get("cpu")
        source = f"{path} (measured on {gpu or device} at {record.get('measured_at', 'an unrecorded time')})"
        graphs = {**record.get("step_graph", {}), "total_memory_bytes": record.get("total_memory_bytes")}
        graph_curves = curves_of(graphs, f"{source}, step_graph compile")
        return PackedCosts(device, curves_of(record, source), source, shown, str(path), graph_curves)
    return PackedCosts(device, {}, "", shown)


def packing_lines(packing: dict, runs_of: dict, device: str) -> list[str]:
    """The plan's lines on packing: per (setting, clients a round), runs a pack on one device, the packs to ask
    for, and why."""
    lines = []
    for name, choice in packing.items():
        n = runs_of[name]
        lines.append(
            f"  {name}: {choice['runs']} runs a pack on one {'GPU' if device == 'cuda' else device.upper()} "
            f"({choice['stacked']} stacked models, bound by "
            f"{choice['bound']}); its {n} runs: pack: {{packs: {math.ceil(n / choice['runs'])}}}. {choice['why']}"
        )
    return lines
