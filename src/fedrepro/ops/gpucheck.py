"""``fedrepro check-gpu``: is the engine correct on this device, and what does it cost there.

Each check takes a device and raises AssertionError on a wrong result; tests/ops/test_gpu.py runs them
on CUDA (marker ``gpu``) and at CI size on the CPU. The command runs them all on CUDA without
pytest, then the benchmark with several runs per GPU, and writes everything to one JSON file
(results/bench/gpu_check.json) that docs/benchmark.md cites. It imports only torch, numpy and the package
(never snakemake or mlflow), so it runs on a GPU node with a site PyTorch and ``PYTHONPATH=src``.
"""

from __future__ import annotations

import json
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from fedrepro import catalog, data, models, partitions
from fedrepro.configure import expansion, forks, paramsfile, registry, settings
from fedrepro.run.cohorts import sample_cohort
from fedrepro.run.process import pick_device
from fedrepro.run.provenance import device_line, machine
from fedrepro.run.rundir import RunDir
from fedrepro.run.trainer import Trainer

OUT = Path("results/bench/gpu_check.json")

# Settings a method needs to run at this size (as in tests/workflow/test_resume.py).
_PROXY = {"proxy_size": 20, "server_epochs": 2}  # proxy samples come out of the 100 test samples
_HOLDOUT = {"evaluation": {"proxy_holdout": 20}}  # the comparison's hold-out the proxy methods train on
METHOD_EXTRAS = {
    "fedlaw": {"fedlaw": {"proxy_size": 20}, **_HOLDOUT},
    "fedfa": {"model": "cnn"},
    "feddf": {"feddf": _PROXY, **_HOLDOUT},
    "fedbe": {"fedbe": _PROXY, **_HOLDOUT},
    "serverft": {"serverft": _PROXY, **_HOLDOUT},
    "fedavg+ima": {"ima": {"start_round": 2, "window": 2}},
    # FedAWARE's code walks a permutation of the clients first: 4 clients, 2 a round, so every
    # client is seen by round 2 and the warm-up ends (with random cohorts 3 rounds may never
    # reach the AWARE step)
    "fedaware": {"cohort": {"warmup": "permutation"}},
    "fedavg+aware": {"cohort": {"warmup": "permutation"}},
}
BASE = {
    "dataset": "fmnist",
    "model": "mlp",
    "num_clients": 4,
    "participation": 0.5,
    "rounds": 4,
    "batch_size": 50,
    "eval_every": 1,
    "client": {"lr": 0.05},
    "partition": {"kind": "iid", "seed": 1},
}


def tiny_fmnist(n_train: int = 400, n_test: int = 100):
    """Generated Fashion-MNIST-shaped data whose brightness follows the label (something to learn)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for n in (n_train, n_test):
        labels = torch.arange(n) % 10
        images = (torch.randint(0, 60, (n, 1, 28, 28), generator=gen) + 19 * labels[:, None, None, None]).to(
            torch.uint8
        )
        out.append(data.TensorDataset(images, labels, 0.2860, 0.3530))
    return tuple(out)


def _trainer(setting: dict, run_dir, device: str, datasets=None) -> Trainer:
    setting = settings.resolve({**setting, "device": device})
    datasets = datasets or tiny_fmnist()
    parts = partitions.make(
        datasets[0].labels.numpy(),
        {"kind": "iid", "seed": 1, "num_clients": setting["num_clients"], "dataset": "fmnist"},
    )
    return Trainer(setting, run_dir, None, None, datasets=datasets, parts=parts)


def check_models(device: str) -> list[str]:
    """Every model family: a forward and backward pass gives finite logits and a gradient for every parameter."""
    done = []
    for name, spec in catalog.MODELS.items():
        if spec.get("pretrained"):
            continue  # hub weights; timed by `fedrepro plan --measure` on its architecture instead
        dataset = registry.fits(name)[0]
        shape = catalog.DATASETS[dataset]["shape"]
        torch.manual_seed(0)
        net = models.build(name, dataset).to(device)
        x = torch.rand((4, *shape), device=device)
        logits = net(x)
        assert logits.shape == (4, catalog.DATASETS[dataset]["num_classes"]), (name, logits.shape)
        torch.nn.functional.cross_entropy(logits, torch.arange(4, device=device) % logits.shape[1]).backward()
        for pname, p in net.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}: no or non-finite gradient for {pname}"
        done.append(f"{name}/{dataset}")
    return done


def method_names() -> list[str]:
    return list(registry.ALGORITHMS) + [f"fedavg+{plugin}" for plugin in registry.PLUGINS]


def check_method(method: str, device: str, rounds: int = 3) -> float:
    """A few rounds of one method (or FedAvg with one plug-in): finished, finite; its final accuracy."""
    algorithm, *plugins = method.split("+")
    setting = {**BASE, "rounds": rounds, "algorithm": algorithm, "plugins": plugins, **METHOD_EXTRAS.get(method, {})}
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = _trainer(setting, run_dir, device)
        summary = trainer.run(checkpoint_every=0, progress=False)
    assert summary["status"] == "finished", f"{method} on {device}: {summary['status']}"
    assert np.isfinite(summary["final_acc"]), f"{method} on {device}: final accuracy {summary['final_acc']}"
    check_aware_steps(method, trainer.rows, f"{method} on {device}")
    return summary["final_acc"]


def check_aware_steps(method: str, rows: list[dict], what: str) -> None:
    """FedAWARE's min-norm step and the +aware projection ran, not only their warm-up: the momenta are
    ready from the round in which every client has been seen (rounds 0 and 1 under the permutation
    warm-up of 4 clients, 2 a round), and from then on every round takes the AWARE step."""
    algorithm, *plugins = method.split("+")
    if algorithm == "fedaware":
        assert [r["aware_warmup"] for r in rows][1:] == [0] * (len(rows) - 1), f"{what}: never left the warm-up"
        assert all(np.isfinite(r["min_norm_sq"]) and r["support"] >= 1 for r in rows[1:]), f"{what}: no min-norm solve"
    if "aware" in plugins:
        assert [r["aware_projected"] for r in rows][1:] == [1] * (len(rows) - 1), f"{what}: never projected"
        assert all(np.isfinite(r["aware_scale"]) and np.isfinite(r["aware_min_norm_sq"]) for r in rows[1:]), (
            f"{what}: no min-norm solve or projection scale"
        )


def check_cohort_matches_sequential(device: str) -> float:
    """One round of equal-size clients trained together (vmapped cohort) and one by one: the same
    client updates up to float rounding. Returns the largest difference relative to the update norm."""
    setting = {**BASE, "num_clients": 4, "participation": 1.0, "algorithm": "fedavg", "batch_size": 25}
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = _trainer(setting, run_dir, device)
        cohort = sample_cohort(1, 0, 4, 4)
        x = trainer.model.flat.clone()
        results = {}
        for mode in ("off", "on"):
            trainer.cohort_mode = mode
            results[mode] = trainer.train_cohort(trainer.plan(0, cohort, x.clone(), 0.05)).deltas.clone()
            trainer.model.flat.copy_(x)
    gap = float((results["on"] - results["off"]).abs().max() / results["off"].abs().max())
    assert gap < 1e-4, f"cohort and sequential updates differ by {gap:.2e} (relative) on {device}"
    return gap


# unequal client sizes (as a Dir(0.1) split gives): unequal step counts and last batches of 25, 10, 15, 25
UNEQUAL_SIZES = (150, 35, 140, 75)


def _unequal_parts(n_train: int) -> list[np.ndarray]:
    order = np.random.default_rng(1).permutation(n_train)
    bounds = np.cumsum((0, *UNEQUAL_SIZES))
    return [order[bounds[i] : bounds[i + 1]] for i in range(len(UNEQUAL_SIZES))]


def check_batched_matches_sequential(method: str, device: str, rounds: int = 3, step_graph: str = "none") -> dict:
    """One method (or FedAvg with one plug-in) on unequal clients, every client each round: the first
    rounds one client after another in two trainers (so the method's state, c_i, l_i, momenta, anchors,
    is not trivial), then the last round's local training batched (run/batched.py) in one and sequential in the
    other, from the same state: the same client updates up to float rounding. Returns the path taken and
    the largest difference of the updates relative to the largest update; a method without a batched form
    reports the sequential path and why. ``step_graph``: the batched step's (static, compile: run/static_step.py)."""
    algorithm, *plugins = method.split("+")
    setting = {
        **BASE,
        "num_clients": len(UNEQUAL_SIZES),
        "participation": 1.0,
        "rounds": rounds,
        "batch_size": 25,
        "algorithm": algorithm,
        "plugins": plugins,
        **METHOD_EXTRAS.get(method, {}),
        "step_graph": step_graph,
    }
    datasets = tiny_fmnist()
    last = rounds - 1
    updates = {}
    with tempfile.TemporaryDirectory() as run_dir:
        for mode in ("off", "on"):
            resolved = settings.resolve({**setting, "device": device})
            trainer = Trainer(
                resolved, f"{run_dir}/{mode}", None, None, datasets=datasets, parts=_unequal_parts(len(datasets[0]))
            )
            trainer.cohort_mode = "off"
            torch.manual_seed(0)
            for t in range(last):
                trainer.round(t)
            trainer.cohort_mode = mode
            x = trainer.model.flat.clone()
            cohort = sample_cohort(resolved["seed"], last, resolved["num_clients"], trainer.k)
            updates[mode] = trainer.train_cohort(trainer.plan(last, cohort, x, trainer.client_lr(last)))
        why = trainer.batched.why_not
    if why:
        assert not trainer.batched.rounds_trained, f"{method} on {device}: batched although {why}"
        return {"path": "sequential", "why": why}
    assert trainer.batched.rounds_trained, f"{method} on {device}: the batched path was not taken"
    off, on = updates["off"], updates["on"]
    assert torch.equal(off.steps, on.steps), f"{method} on {device}: step counts {on.steps} != {off.steps}"
    moved = float(off.deltas.abs().max())
    gap = float((on.deltas - off.deltas).abs().max()) / moved
    # float rounding of batched kernels is ~1e-6 of the update here; a wrong term, batch or step count
    # moves an update by a sizeable fraction of it
    assert moved > 0 and gap < 1e-4, (
        f"{method} on {device}: batched and sequential updates differ by {gap:.2e} (relative)"
    )
    return {"path": "batched", "relative_gap": gap, "steps": off.steps.tolist()}


def _final_model(run_dir) -> torch.Tensor:
    return torch.load(RunDir(run_dir).model, weights_only=False)["x"]


def check_exact_resume(device: str) -> None:
    """Stopped after 2 rounds and resumed on the same device: the same metrics and model, bit for bit."""
    setting = {**BASE, "algorithm": "fedavg", "plugins": ["ima"], **METHOD_EXTRAS["fedavg+ima"]}
    datasets = tiny_fmnist()
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        _trainer(setting, a, device, datasets).run(checkpoint_every=0, progress=False)
        assert _trainer(setting, b, device, datasets).run(progress=False, stop_after=2)["status"] == "stopped"
        resumed = _trainer(setting, b, device, datasets)
        summary = resumed.run(progress=False)
        assert summary["resumed"], "the second start did not resume"
        assert torch.equal(_final_model(a), _final_model(b)), (
            f"resumed model differs from the uninterrupted one on {device}"
        )
        ma = RunDir(a).metrics.read_text().splitlines()
        mb = RunDir(b).metrics.read_text().splitlines()
        # the clock columns (seconds a round took, when it ended) differ by nature
        clock = {i for i, name in enumerate(ma[0].split(",")) if name in ("seconds", "wall_time")}
        strip = lambda lines: [",".join(c for i, c in enumerate(l.split(",")) if i not in clock) for l in lines]
        assert strip(ma) == strip(mb), f"resumed metrics differ on {device}"


def check_fork_child(device: str) -> None:
    """An +IMA child started from its parent's kept state at t_s ends with the model the +IMA run trained
    from round 0 has, bit for bit on one device (the grid-as-a-tree path: the kept state is loaded
    onto the device, as a checkpoint is)."""
    start, window = METHOD_EXTRAS["fedavg+ima"]["ima"]["start_round"], METHOD_EXTRAS["fedavg+ima"]["ima"]["window"]
    parent = {**BASE, "algorithm": "fedavg"}
    child = {**BASE, "algorithm": "fedavg", "plugins": ["ima"], **METHOD_EXTRAS["fedavg+ima"]}
    datasets = tiny_fmnist()
    with (
        tempfile.TemporaryDirectory() as alone,
        tempfile.TemporaryDirectory() as host,
        tempfile.TemporaryDirectory() as forked,
    ):
        _trainer(child, alone, device, datasets).run(checkpoint_every=0, progress=False)
        host_run = _trainer(parent, host, device, datasets)
        host_run.forks.keep, host_run.forks.history_length = {start: host_run.paths.kept_fork(start)}, window - 1
        host_run.run(checkpoint_every=0, progress=False)
        child_run = _trainer(child, forked, device, datasets)
        summary = child_run.run(
            checkpoint_every=0,
            progress=False,
            fork_from=host_run.paths.kept_fork(start),
            accepts=lambda p, rounds: forks.shares_prefix(child_run.setting, p, rounds),
        )
        assert summary["forked_from"], f"the child did not start from its parent's state on {device}"
        assert torch.equal(_final_model(alone), _final_model(forked)), (
            f"the forked +IMA child differs from the run trained from round 0 on {device}"
        )


def check_eval_mode(device: str) -> None:
    """Evaluation runs the model in eval mode (dropout off, normalisation on running statistics)."""
    setting = {**BASE, "algorithm": "fedavg", "rounds": 1}
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = _trainer(setting, run_dir, device)
        modes = []
        handle = trainer.model.module.register_forward_hook(lambda m, i, o: modes.append(m.training))
        trainer.run(checkpoint_every=0, progress=False)
        handle.remove()
    assert modes and not modes[-1], f"the last forward pass (evaluation) ran in training mode on {device}"


def run_checks(device: str, log=print) -> dict:
    """Every check on ``device``; a failing check is recorded with its traceback, the rest still run."""
    checks = {
        "models": lambda: check_models(device),
        **{f"method:{m}": (lambda m=m: check_method(m, device)) for m in method_names()},
        "cohort_vs_sequential": lambda: check_cohort_matches_sequential(device),
        **{
            f"batched_vs_sequential:{m}": (lambda m=m: check_batched_matches_sequential(m, device))
            for m in method_names()
        },
        **{
            f"static_vs_sequential:{g}": (lambda g=g: check_batched_matches_sequential("fedavg", device, 3, g))
            for g in ("static", "compile")
        },
        "exact_resume": lambda: check_exact_resume(device),
        "fork_child": lambda: check_fork_child(device),
        "eval_mode": lambda: check_eval_mode(device),
    }
    results = {}
    for name, check in checks.items():
        tic = time.perf_counter()
        try:
            value = check()
            results[name] = {"ok": True, "value": value}
        except Exception:  # noqa: BLE001 (a report of every check, not the first failure)
            results[name] = {"ok": False, "error": traceback.format_exc(limit=3)}
        results[name]["seconds"] = round(time.perf_counter() - tic, 2)
        log(f"{'ok  ' if results[name]['ok'] else 'FAIL'} {name} ({results[name]['seconds']} s)")
    return results


PAPER_PARAMS = ["params/ima.yaml", "params/fedlaw.yaml", "params/fedaware.yaml", "params/fednova.yaml"]


def measure_step_costs(device: str, out: str | Path, log=print) -> dict:
    """Seconds per local step of every (dataset, model, batch size) of the papers' params files on
    this device, in ``fedrepro plan``'s step_costs format: the runtime requests of cluster jobs.
    A model whose code needs a package the node lacks (Pythia needs transformers) is skipped, named."""
    from fedrepro.ops import pricing

    settings = {}
    for path in PAPER_PARAMS:
        if Path(path).exists():
            for run in expansion.expand(paramsfile.load_params_files([path])):
                settings.setdefault(pricing.step_key(run.setting), run.setting)
    costs, skipped = {}, {}
    for key, setting in sorted(settings.items()):
        try:
            costs[key] = pricing.measure_step(setting, device)
            log(f"step {key} on {device}: {costs[key] * 1e3:.3f} ms")
        except ImportError as err:
            skipped[key] = str(err)
    table = {"device": device, "machine": machine(), "step_seconds": costs, "skipped": skipped}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(table, indent=2, sort_keys=True))
    return table


def main(
    out: str | Path = OUT,
    data_root: str | None = "data/fmnist",
    bench_rounds: int = 5,
    concurrency: tuple[int, ...] = (2, 4, 8),
    skip_bench: bool = False,
    log=print,
    packed_out: str | Path = "results/bench/packed_steps-cuda.json",
    packed_budget: float = 90.0,
    graph_budget: float = 150.0,
    skip: tuple[str, ...] = (),
) -> int:
    from fedrepro.ops import bench, packed_bench, pricing

    if not torch.cuda.is_available():
        raise SystemExit(
            f"fedrepro check-gpu: torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}) sees "
            "no CUDA device; run it on a GPU node"
        )
    device = "cuda"  # the current CUDA device, as a setting names it
    log(device_line(pick_device(device), None))
    report = {
        "machine": machine(),
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(),
        "checks": run_checks(device, log),
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    stages = set() if skip_bench else {"step_costs", "packed", "bench"} - set(skip)
    if "step_costs" in stages:
        report["step_costs"] = measure_step_costs(device, pricing.STEP_COSTS_FILE, log)
        out.write_text(json.dumps(report, indent=2, default=str))
    if "packed" in stages:  # the packed step at 1, 4, 16, 64 runs, plain and step_graph compile, for fedrepro plan
        report["packed_steps"] = packed_bench.measure_params(
            PAPER_PARAMS, device, packed_out, packed_budget, log, graph_budget
        )
        out.write_text(json.dumps(report, indent=2, default=str))
    if "bench" in stages:
        report["bench"] = bench.run(
            ["fmnist_cnn", "fmnist_mlp"],
            ["cuda"],
            bench_rounds,
            1,
            False,
            data_root,
            log=log,
            concurrency=list(concurrency),
        )
        log(bench.table(report["bench"]))
        out.write_text(json.dumps(report, indent=2, default=str))
    failed = [name for name, r in report["checks"].items() if not r["ok"]]
    log(
        f"{len(report['checks']) - len(failed)} checks passed, {len(failed)} failed"
        f"{': ' + ', '.join(failed) if failed else ''}; "
        f"written to {out}"
    )
    return 1 if failed else 0
