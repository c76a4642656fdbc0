"""What the runs behind a table cost: device-hours from the runs' own records, and the plan's estimate beside it.

A run's own time is its summary's ``runtime_s`` (the sum of its rounds' ``seconds``, carried across resumes),
less the rounds a run started from another run's state did not train itself (``forked_from``: those rounds are
its parent's). It is counted on the device of the run's last start (``summary.device``). The estimate is
``fedrepro plan``'s: the run's local SGD steps (of the rounds it trains) times the plan's seconds per step on the
device the plan prices the run for (``pricing.run_device``; ``pricing.step_costs``: that device's measurement, else the
table kept in evidence/gpu/, else a marked guess); it counts no evaluation and no server-side work, so it is a
floor, on the plan's device.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path


def _fork_round(summary: dict) -> int:
    fork = summary.get("forked_from")
    return int(fork["round"]) if isinstance(fork, dict) and "round" in fork else 0


def own_seconds(summary: dict, metrics: Path) -> float:
    """The seconds the run itself trained (a forked run's parent rounds left out)."""
    total = float(summary.get("runtime_s") or 0.0)
    start = _fork_round(summary)
    if start and metrics.is_file():
        with metrics.open() as f:
            inherited = [float(row.get("seconds") or 0.0) for _, row in zip(range(start), csv.DictReader(f))]
        total -= sum(inherited)
    return max(total, 0.0)


def device_kind(summary: dict) -> str:
    """``CPU`` or the GPU's name, from the summary's ``device`` (``cuda:0 (NVIDIA H200)``)."""
    device = str(summary.get("device", "unknown"))
    if device.startswith("cuda"):
        return device.split("(", 1)[1].rstrip(")") if "(" in device else "GPU"
    return device.upper() if device in ("cpu", "mps") else device


def estimate_seconds(summary: dict, costs: dict) -> tuple[float, str] | None:
    """The plan's seconds for the rounds the run trained itself, and the source that priced them; None where the
    plan knows no step cost. ``costs``: pricing.step_costs_by_device()."""
    from fedrepro.ops import pricing

    try:
        setting = summary["setting"]
        priced = costs[pricing.run_device(setting)].price(setting)
        if priced is None:
            return None
        seconds, table = priced
        return pricing.local_steps(setting, _fork_round(summary)) * seconds, table.label
    except (KeyError, TypeError, ValueError, ZeroDivisionError):  # a setting from code the plan no longer reads
        return None


def of_runs(run_dirs: list[Path]) -> dict:
    """Device-hours of the finished runs in ``run_dirs`` per device, their total, and the plan's estimate for
    the same runs (with how many runs it could not price, and where its step costs come from)."""
    from fedrepro.ops import pricing

    costs = pricing.step_costs_by_device()
    sources: set[str] = set()
    hours: dict[str, float] = {}
    estimate, unpriced, runs = 0.0, 0, 0
    for run_dir in run_dirs:
        path = Path(run_dir) / "summary.json"
        if not path.is_file():
            continue
        summary = json.loads(path.read_text())
        runs += 1
        kind = device_kind(summary)
        hours[kind] = hours.get(kind, 0.0) + own_seconds(summary, Path(run_dir) / "metrics.csv") / 3600
        guess = estimate_seconds(summary, costs)
        if guess is None:
            unpriced += 1
        else:
            estimate += guess[0] / 3600
            sources.add(guess[1])
    return {
        "runs": runs,
        "hours": dict(sorted(hours.items(), key=lambda kv: -kv[1])),
        "total_hours": sum(hours.values()),
        "estimate_hours": estimate,
        "unpriced": unpriced,
        "estimate_source": ", ".join(sorted(sources)) or "none",
    }


def text(cost: dict) -> str:
    """One line: ``41.2 device-hours over 48 runs (CPU 41.0 h, NVIDIA H200 0.2 h); the plan's estimate: 1.3 h``."""
    if not cost["runs"]:
        return ""
    devices = ", ".join(f"{kind} {h:.1f} h" for kind, h in cost["hours"].items())
    line = (
        f"{cost['total_hours']:.1f} device-hours over {cost['runs']} runs ({devices}); "
        f"the plan's estimate: {cost['estimate_hours']:.1f} h"
    )
    if cost["unpriced"]:
        line += f" for the {cost['runs'] - cost['unpriced']} runs it can price"
    return line
