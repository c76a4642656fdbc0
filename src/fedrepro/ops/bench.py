"""``fedrepro bench``: seconds per federated round of the engine, of a reference-style loop, and
of the pure compute, measured in one process on the same partition, model and cohorts.

(a) engine     ``Trainer.round``: data on the device as one uint8 tensor, batches by index,
               one flat parameter buffer reused for every client (and, where it pays, the round's
               clients trained together as one batched computation, ``fedrepro.run.batched``).
(b) reference  the loop the papers' public code runs: a torchvision dataset on the CPU returning
               PIL-converted samples, a ``DataLoader`` per client, ``copy.deepcopy`` of the global
               model per client, ``torch.optim.SGD``, and averaging of ``state_dict``s.
(c) floor      the same SGD steps (same model, batch sizes and count) on batches already on the
               device, with ``torch.optim.SGD`` and no federated bookkeeping at all.

Evaluation is left out of all three (the engine's ``eval_every`` is set beyond the timed rounds),
so the ratios compare training rounds only.
"""
from __future__ import annotations

import copy
import json
import math
import os
import resource
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedrepro import catalog, data, models, partitions
from fedrepro.ops.bench_baselines import ComputeFloor, ReferenceLoop, reference_dataset
from fedrepro.ops.bench_settings import SETTINGS, BenchSetting
from fedrepro.run.provenance import machine
from fedrepro.run.trainer import Trainer

GOALS = {"cpu": {"reference_over_engine": 4.0, "engine_over_floor": 1.15},
         "cuda": {"reference_over_engine": 10.0, "engine_over_floor": 1.2}}


# ----------------------------------------------------------------------------- inputs


def load_train(dataset: str, data_root: str | Path | None, quick: bool) -> tuple[torch.Tensor, torch.Tensor, str]:
    """uint8 images (N, C, H, W) and labels; real Fashion-MNIST when it is on disk."""
    if dataset == "fmnist" and data_root is not None:
        try:
            split = data.load("fmnist", data_root, train=True)
            return split.images, split.labels, "real"
        except (OSError, RuntimeError):
            pass
    facts = catalog.DATASETS[dataset]
    n = facts["train_size"] // (10 if quick else 1)
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, *facts["shape"]), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, facts["num_classes"], (n,), generator=gen)
    return images, labels, "generated"


def make_parts(bench: BenchSetting, labels: torch.Tensor, quick: bool) -> list[np.ndarray]:
    spec = {"kind": bench.partition, "seed": 1, "num_clients": bench.num_clients, "dataset": bench.dataset}
    if bench.partition == "dirichlet":
        spec.update(alpha=0.5, min_size=10, balance=True)
    if bench.partition == "shards":
        spec.update(classes_per_client=2, distinct=True)
    parts = partitions.make(labels.numpy(), spec)
    if quick:  # two batches per client keep a CI run in seconds
        parts = [p[:2 * bench.batch_size] for p in parts]
    return parts


def build_module(bench: BenchSetting) -> nn.Module:
    return models.build(bench.model, bench.dataset)


def engine_setting(bench: BenchSetting, device: str) -> dict:
    from fedrepro.configure.settings import resolve
    setting = resolve({
        "dataset": "fmnist", "model": bench.model, "num_clients": bench.num_clients,
        "participation": bench.per_round / bench.num_clients, "local_epochs": bench.epochs,
        "batch_size": bench.batch_size, "device": device, "seed": 1,
        # evaluation happens only in the untimed warm-up round
        "rounds": 10 ** 6, "eval_every": 10 ** 6,
        "client": {"lr": bench.lr}, "partition": {"kind": "iid"}})
    setting["dataset"] = bench.dataset  # the module and the data are handed to the Trainer directly
    return setting


# ----------------------------------------------------------------------------- measuring


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device) -> float:
    _sync(device)
    tic = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - tic


def _peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux: the process's high-water mark so far
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _set_mode_and_round(trainer: Trainer, mode: str, t: int) -> None:
    trainer.cohort_mode = mode
    trainer.round(t)


def bench_one(bench: BenchSetting, device_name: str, rounds: int, repeats: int, quick: bool,
              data_root: str | Path | None, log=print) -> dict:
    device = torch.device(device_name)
    images, labels, origin = load_train(bench.dataset, data_root, quick)
    parts = make_parts(bench, labels, quick)
    test = data.TensorDataset(images[:256], labels[:256], 0.0, 1.0)
    torch.manual_seed(1)
    module = build_module(bench)
    seed = 1

    with tempfile.TemporaryDirectory(prefix="fedrepro-bench-") as run_dir:
        trainer = Trainer(engine_setting(bench, device_name), run_dir, None, None,
                                 datasets=(data.TensorDataset(images, labels, 0.0, 1.0), test),
                                 parts=parts, module=copy.deepcopy(module))
        # Both paths are timed (the batched one whatever the client sizes), to show what it buys; (a) is
        # the one the engine picks by itself ("auto").
        trainer.cohort_mode = "auto"
        chosen = "cohort" if trainer.train_together(np.arange(bench.per_round)) \
            else "sequential"
        modes = {"sequential": "off", **({"cohort": "on"} if bench.per_round > 1 else {})}
        reference = ReferenceLoop(module, reference_dataset(bench, images, labels, origin, data_root), parts,
                                  bench, device, seed)
        floor = ComputeFloor(module, images, labels, bench, parts, device, seed)
        times: dict[str, list[float]] = {f"engine_{m}": [] for m in modes}
        step_counts = []
        times.update(reference=[], floor=[])
        t = 0

        def measure(name: str, fn) -> None:
            times[name].append(_timed(fn, device))

        # Warm-up round (allocator, kernels, vmap tracing, the engine's first evaluation), which
        # also takes the memory readings: RSS is the process high-water mark, so it is read after
        # each method's first round in the order engine, floor, reference (the largest last).
        memory = {"before": {"peak_rss_mb": round(_peak_rss_mb(), 1)}}
        for name, warm in [("engine", lambda: [_set_mode_and_round(trainer, m, 0) for m in modes.values()]),
                           ("floor", lambda: floor.round(0)), ("reference", lambda: reference.round(0))]:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            warm()
            memory[name] = {"peak_rss_mb": round(_peak_rss_mb(), 1)}
            if device.type == "cuda":
                memory[name]["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated(device) / 2 ** 20, 1)
        # interleaved, so a noisy neighbour slows every method alike
        for _ in range(repeats):
            for _ in range(rounds):
                t += 1
                step_counts.append(len(floor.batch_sizes(t)))
                for path, mode in modes.items():
                    measure(f"engine_{path}", lambda: _set_mode_and_round(trainer, mode, t))
                measure("floor", lambda: floor.round(t))
                measure("reference", lambda: reference.round(t))
            log(f"  {bench.name} {device_name}: " + ", ".join(f"{k} {statistics.median(v):.3f}s"
                                                               for k, v in times.items()))

    median = {k: statistics.median(v) for k, v in times.items()}
    engine_s = median[f"engine_{chosen}"]
    steps = statistics.mean(step_counts)
    return {
        "setting": bench.name, "paper": bench.paper, "device": device_name, "data": origin, "quick": quick,
        "config": asdict(bench), "engine_path": chosen, "steps_per_round": steps, "timed_rounds": len(times["floor"]),
        "seconds_per_round": {"engine": engine_s, "reference": median["reference"], "floor": median["floor"],
                              **{k: v for k, v in median.items() if k.startswith("engine_")}},
        "samples": times,
        "ratios": {"reference_over_engine": median["reference"] / engine_s,
                   "engine_over_floor": engine_s / median["floor"]},
        "memory": memory,
        "step_seconds": {"floor": median["floor"] / steps, "engine": engine_s / steps},
    }


# ----------------------------------------------------------------------------- throughput

# A paper run's length, to turn seconds per round into runs finished per device-hour.
PAPER_ROUNDS = {"fmnist_cnn": 300, "fmnist_mlp": 200, "cifar_cnn": 200}
# IMA Table 1's FMNIST rows: 8 methods with and without IMA, 2 partitions, 3 seeds, 300 rounds each.
IMA_TABLE1_FMNIST = {"setting": "fmnist_cnn", "runs": 8 * 2 * 2 * 3, "rounds": 300}
# A run's share of the device memory it may use when several share one device (the rest: the CUDA
# contexts of the processes and fragmentation).
MEMORY_SHARE = 0.8

WORKER = """
import json, sys
from fedrepro.ops import bench
print(json.dumps(bench.throughput_worker(*json.loads(sys.argv[1]))), flush=True)
"""


def _engine_trainer(bench: BenchSetting, device_name: str, quick: bool, data_root, run_dir) -> Trainer:
    images, labels, _ = load_train(bench.dataset, data_root, quick)
    parts = make_parts(bench, labels, quick)
    torch.manual_seed(1)
    return Trainer(engine_setting(bench, device_name), run_dir, None, None,
                          datasets=(data.TensorDataset(images, labels, 0.0, 1.0),
                                    data.TensorDataset(images[:256], labels[:256], 0.0, 1.0)),
                          parts=parts, module=build_module(bench))


def throughput_worker(name: str, device_name: str, rounds: int, quick: bool, data_root, go_file: str) -> dict:
    """One of several runs side by side: one warm-up round, then wait for ``go_file`` (so all time
    the same crowded stretch), then time ``rounds`` engine rounds."""
    bench = SETTINGS[name].quick() if quick else SETTINGS[name]
    device = torch.device(device_name)
    with tempfile.TemporaryDirectory(prefix="fedrepro-tput-") as run_dir:
        trainer = _engine_trainer(bench, device_name, quick, data_root, run_dir)
        trainer.round(0)
        _sync(device)
        print("ready", flush=True)
        while not Path(go_file).exists():
            time.sleep(0.01)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        seconds = [_timed(lambda: trainer.round(t), device) for t in range(1, rounds + 1)]
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return {"seconds_per_round": statistics.median(seconds), "total_seconds": sum(seconds), "peak_gpu_bytes": peak}


def side_by_side(name: str, device_name: str, runs: int, rounds: int, quick: bool, data_root) -> list[dict]:
    """``runs`` engine runs of one setting as concurrent processes on one device (what a Slurm
    group with ``runs`` GPU slots does); each worker's report."""
    import subprocess
    import sys
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="fedrepro-go-") as folder:
        go = Path(folder) / "go"
        args = json.dumps([name, device_name, rounds, quick, None if data_root is None else str(data_root), str(go)])
        workers = [subprocess.Popen([sys.executable, "-c", WORKER, args], stdout=subprocess.PIPE, text=True, env=env)
                   for _ in range(runs)]
        try:
            for w in workers:
                if w.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"a throughput worker of {name} on {device_name} failed before its first round")
            go.touch()
            reports = [json.loads(w.stdout.readline()) for w in workers]
            for w in workers:
                w.wait(timeout=600)
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                    w.wait()
    return reports


def throughput(name: str, device_name: str, concurrency: list[int], rounds: int, quick: bool, data_root,
               log=print) -> dict:
    """Runs finished per device-hour, one at a time and with several side by side, and the number
    per device to use: the smallest within 5% of the best measured throughput that fits in memory.

    Method: for each R, R processes each train one run; after a warm-up round they time ``rounds``
    rounds together; a paper run (PAPER_ROUNDS) then takes PAPER_ROUNDS x (median seconds per round)
    and R of them finish per that time. Evaluation is not timed (as in the per-round table)."""
    paper_rounds = PAPER_ROUNDS[name]
    rows = []
    for runs in concurrency:
        reports = side_by_side(name, device_name, runs, rounds, quick, data_root)
        per_round = statistics.median(r["seconds_per_round"] for r in reports)
        row = {"runs_side_by_side": runs, "seconds_per_round": per_round,
               "runs_per_device_hour": runs * 3600 / (paper_rounds * per_round),
               "peak_gpu_mb_per_run": max(r["peak_gpu_bytes"] for r in reports) / 2 ** 20}
        rows.append(row)
        log(f"  {name} {device_name} x{runs}: {per_round:.4f} s/round per run, "
            f"{row['runs_per_device_hour']:.1f} runs per device-hour")
    single = next((r for r in rows if r["runs_side_by_side"] == 1), None)
    for row in rows:
        row["device_hours_per_run_vs_one"] = (single["runs_per_device_hour"] / row["runs_per_device_hour"]
                                              if single else None)
    fits = rows
    if device_name.startswith("cuda"):
        total = torch.cuda.get_device_properties(torch.device(device_name)).total_memory / 2 ** 20
        fits = [r for r in rows
                if r["runs_side_by_side"] * r["peak_gpu_mb_per_run"] <= MEMORY_SHARE * total] or rows[:1]
    best = max(r["runs_per_device_hour"] for r in fits)
    chosen = min(r["runs_side_by_side"] for r in fits if r["runs_per_device_hour"] >= 0.95 * best)
    return {"setting": name, "device": device_name, "paper_rounds": paper_rounds, "timed_rounds": rounds,
            "quick": quick, "rows": rows, "runs_per_device": chosen}


def extrapolate_table(tput: dict, runs: int, rounds: int) -> dict:
    """Wall time of ``runs`` runs of ``rounds`` rounds on one device with the chosen runs per device:
    ceil(runs / R) waves of rounds x (measured seconds per round at R side by side)."""
    row = next(r for r in tput["rows"] if r["runs_side_by_side"] == tput["runs_per_device"])
    waves = math.ceil(runs / row["runs_side_by_side"])
    seconds = waves * rounds * row["seconds_per_round"]
    return {"runs": runs, "rounds": rounds, "runs_per_device": row["runs_side_by_side"], "waves": waves,
            "seconds_per_round": row["seconds_per_round"], "wall_seconds": seconds,
            "method": f"ceil({runs} runs / {row['runs_side_by_side']} per device) = {waves} waves x {rounds} rounds x "
                      f"{row['seconds_per_round']:.4f} s per round (median of {tput['timed_rounds']} timed rounds "
                      f"per run, {row['runs_side_by_side']} runs side by side, evaluation not timed)"}


def run(settings: list[str], devices: list[str], rounds: int, repeats: int, quick: bool,
        data_root: str | Path | None, threads: int = 0, log=print, concurrency: list[int] | None = None) -> dict:
    if threads:
        torch.set_num_threads(threads)
    results = []
    for device in devices:
        for name in settings:
            bench = SETTINGS[name].quick() if quick else SETTINGS[name]
            log(f"{name} on {device}: {bench}")
            results.append(bench_one(bench, device, rounds, repeats, quick, data_root, log))
    step_seconds: dict[str, dict] = {}
    engine_step: dict[str, dict] = {}
    for r in results:
        key = BenchSetting(**r["config"]).step_key
        step_seconds.setdefault(r["device"], {})[key] = r["step_seconds"]["floor"]
        engine_step.setdefault(r["device"], {})[key] = r["step_seconds"]["engine"]
    report = {"machine": machine(), "rounds": rounds, "repeats": repeats, "quick": quick, "goals": GOALS,
              "results": results, "step_seconds": step_seconds, "engine_step_seconds": engine_step}
    if concurrency:
        report["throughput"] = [throughput(name, device, sorted(set(concurrency) | {1}), rounds * repeats, quick,
                                           data_root, log)
                                for device in devices for name in settings if name in PAPER_ROUNDS]
        table1 = IMA_TABLE1_FMNIST
        report["ima_table1_fmnist"] = {t["device"]: extrapolate_table(t, table1["runs"], table1["rounds"])
                                       for t in report["throughput"] if t["setting"] == table1["setting"]}
    return report


def table(report: dict) -> str:
    """The measured table in Markdown (also what the command prints)."""
    head = ("| setting | device | engine path | steps/round | (a) engine s | (b) reference s | (c) floor s "
            "| (b)/(a) | (a)/(c) | peak RSS MB | peak GPU MB (a/b/c) |")
    lines = [head, "|" + "---|" * 11]
    for r in report["results"]:
        s, m = r["seconds_per_round"], r["memory"]
        gpu = "/".join(str(m[k].get("peak_gpu_mb", "-")) for k in ("engine", "reference", "floor"))
        rss = f"{max(v['peak_rss_mb'] for v in m.values()):.0f}"
        extra = ""
        if "engine_cohort" in s:
            extra = f" (sequential {s['engine_sequential']:.3f}, cohort {s['engine_cohort']:.3f})"
        lines.append(f"| {r['setting']} ({r['paper']}{', quick' if r['quick'] else ''}) | {r['device']} "
                     f"| {r['engine_path']}{extra} | {r['steps_per_round']:.0f} | {s['engine']:.3f} "
                     f"| {s['reference']:.3f} "
                     f"| {s['floor']:.3f} | {r['ratios']['reference_over_engine']:.1f} "
                     f"| {r['ratios']['engine_over_floor']:.2f} | {rss} | {gpu} |")
    mach = report["machine"]
    lines.append("")
    lines.append(f"Machine: {mach['cpu']}, {mach['usable_cores']} usable cores, torch {mach['torch']} with "
                 f"{mach['torch_threads']} threads{', GPU ' + mach['gpu'] if 'gpu' in mach else ''}; "
                 f"load average at the end {mach['load_average'][0]:.1f}. Median of {report['rounds']}x"
                 f"{report['repeats']} rounds per method (interleaved). RSS is the process's high-water mark "
                 "(the three loops share one process, so host memory is not split by method); GPU memory is "
                 "each method's own peak.")
    for t in report.get("throughput", []):
        lines += ["", f"Throughput, {t['setting']} on {t['device']}{' (quick)' if t['quick'] else ''}: runs of "
                      f"{t['paper_rounds']} rounds finished per device-hour ({t['timed_rounds']} timed rounds per run)",
                  "| runs side by side | s/round per run | runs per device-hour | device-hours per run vs one "
                  "at a time | peak GPU MB per run |", "|---|---|---|---|---|"]
        for r in t["rows"]:
            vs = r["device_hours_per_run_vs_one"]
            lines.append(f"| {r['runs_side_by_side']} | {r['seconds_per_round']:.4f} | {r['runs_per_device_hour']:.1f} "
                         f"| {'-' if vs is None else f'{vs:.2f}x fewer'} | {r['peak_gpu_mb_per_run']:.0f} |")
        lines.append(f"Runs per device to use: {t['runs_per_device']} (the fewest within 5% of the best that fit "
                     "in memory).")
    for device, e in report.get("ima_table1_fmnist", {}).items():
        lines += ["", f"IMA Table 1 FMNIST rows ({e['runs']} runs x {e['rounds']} rounds) on one {device}: "
                      f"{e['wall_seconds'] / 60:.1f} min, extrapolated: {e['method']}."]
    return "\n".join(lines)


def write(report: dict, out: str | Path) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2))


def html(report: dict, out: str | Path) -> None:
    """A small self-contained page with the table and the raw round times."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape
    env = Environment(loader=FileSystemLoader(Path(__file__).resolve().parents[1] / "templates"),
                      autoescape=select_autoescape(["html", "j2"]))
    page = env.get_template("bench.html.j2").render(report=report, goals=GOALS)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(page)
