"""``fedrepro expand`` and ``fedrepro plan``: the runs a params file declares, and what they cost."""

from __future__ import annotations

import json
import sys

from fedrepro.cli.common import EXAMPLES, _absent_or, _existing, _number, finish


def add_parsers(sub) -> None:
    """expand, plan."""
    add_expand(sub)
    add_plan(sub)


def add_expand(sub) -> None:
    """List a params file's runs."""
    p = sub.add_parser("expand", help="list the runs a params file declares (validates it)")
    p.add_argument(
        "--configfile",
        required=True,
        nargs="+",
        type=_existing("file"),
        help="params file(s), merged in order as snakemake does",
    )
    p.add_argument(
        "--add-method",
        help="methods to put on every method axis, comma-separated (as --config "
        "add_method=...): a built-in name, an entry point of your package or a module path",
    )
    p.set_defaults(func=cmd_expand)
    finish(p, EXAMPLES["expand"])


def cmd_expand(args) -> None:
    from fedrepro.configure import expansion, paramsfile

    params = paramsfile.load_params_files(args.configfile)
    if args.add_method:
        params["add_method"] = args.add_method
    runs = expansion.expand(params)
    for run in runs:
        print(run.experiment, run.id)
    print(f"{len(expansion.unique_runs(runs))} runs", file=sys.stderr)


def add_plan(sub) -> None:
    """Price a params file's runs."""
    p = sub.add_parser("plan", help="runs per experiment and estimated compute, before submitting")
    p.add_argument(
        "--configfile",
        required=True,
        nargs="+",
        type=_existing("file"),
        help="params file(s), merged in order as snakemake does",
    )
    p.add_argument("--only", help="experiment names or patterns, comma-separated (as --config only=...)")
    p.add_argument(
        "--bench",
        type=_absent_or("file"),
        help="the step costs to use (default results/bench/step_costs.json, then the "
        "benchmark's bench.json: their --device measurements); with --measure, where to write them",
    )
    p.add_argument(
        "--measure",
        action="store_true",
        help="first time a few steps of each (dataset, model, batch) of the params file on --device, and keep them",
    )
    p.add_argument(
        "--measure-packed",
        action="store_true",
        help="first time the packed step (runs x clients stacked) of each (dataset, model, batch) of the params "
        "file at a few pack sizes on --device, into results/bench/packed_steps-<device>.json: the batched and "
        "packed path's prices and the runs a pack holds",
    )
    p.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        help="the device the runs will train on: only its "
        "measurements price them; what they lack comes from the GPU table (evidence/gpu) for cuda, "
        "or is marked as a guess (default cuda; with --measure, cuda when there is one, else cpu)",
    )
    p.add_argument(
        "--runs-dir", default="results/runs", type=_absent_or("folder"), help="finished runs here are not counted again"
    )
    p.add_argument(
        "--walltime",
        type=_number(int, 1),
        help="the site's walltime limit in minutes: print the Slurm group "
        "size (--group-components trainbatch=N) that keeps every submission within it",
    )
    p.add_argument(
        "--runs-per-gpu",
        type=_number(int, 1),
        help="runs sharing one GPU (the profile's gpu_slot; default: what fedrepro check-gpu measured, else 4)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)
    finish(p, EXAMPLES["plan"])


def cmd_plan(args) -> None:
    from fedrepro.configure import paramsfile
    from fedrepro.ops import plan, pricing

    params = paramsfile.load_params_files(args.configfile)
    if args.only:
        params["only"] = args.only
    device = args.device or "cuda"  # a cluster user plans for the GPUs the runs will get
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731
    if args.measure or args.measure_packed:
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")  # plan what was measured
        if device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("fedrepro plan: --device cuda was asked for, but torch sees no CUDA device to measure")
    if args.measure:
        pricing.measure(params, device, args.bench or pricing.STEP_COSTS_FILE, log=log)
    if args.measure_packed:
        from fedrepro.configure import expansion
        from fedrepro.ops import packed_bench, packed_pricing

        runs = packed_bench.by_compute(expansion.expand(params), device)
        packed_bench.measure(runs, device, packed_pricing.OWN_FILE.format(device=device), log=log)
    result = plan.plan(params, args.bench, args.runs_dir, device)
    if args.walltime:  # Slurm: group size that keeps each submission within the site's walltime
        runs_per_gpu = args.runs_per_gpu or plan.measured_runs_per_gpu()[0]
        result["cluster"] = plan.cluster_requests(params, args.walltime, runs_per_gpu, args.bench)
    print(json.dumps(result, indent=2) if args.json else plan.format_plan(result))
