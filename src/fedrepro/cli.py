"""The ``fedrepro`` command: every step a Snakemake rule runs, each with --help."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _json_arg(text: str):
    path = Path(text)
    if not text.lstrip().startswith("{") and path.exists():
        text = path.read_text()
    return json.loads(text)


def cmd_download(args) -> None:
    from fedrepro import data
    folder = data.prepare(args.dataset, args.root, args.mirror or None, args.out, timeout=args.timeout)
    print(f"{args.dataset}: ready in {folder}")


def cmd_partition(args) -> None:
    from fedrepro import data, partition, registry
    setting = _json_arg(args.setting)
    labels = data.train_labels(setting["dataset"], args.data_root)
    groups = None
    if setting["kind"] == "natural":  # the dataset's own clients (Synthetic)
        from fedrepro import datasets_extra
        groups = datasets_extra.train_groups(setting["dataset"], args.data_root)
    parts = partition.make(labels, setting, groups)
    info = partition.save(args.out, setting, labels, parts, registry.DATASETS[setting["dataset"]]["num_classes"])
    print(f"partition {Path(args.out).name}: {info['content_hash']}, client sizes {info['sizes']}")


def cmd_train(args) -> None:
    import torch
    from fedrepro import engine
    from fedrepro.config import resolve
    if args.threads:
        torch.set_num_threads(args.threads)
    setting = resolve(_json_arg(args.setting))
    if args.device:
        setting["device"] = args.device
    if setting["device"] != "cpu":  # several GPUs here: this job takes its own (fedrepro.slots)
        from fedrepro import slots
        bound = slots.bind_gpu()
        if bound:
            print(bound, file=sys.stderr, flush=True)
    summary = engine.train(setting, args.out, args.partition, args.data_root, args.checkpoint_every,
                           progress=not args.no_progress, stop_after=args.stop_after)
    print(json.dumps({k: summary.get(k) for k in ("run", "status", "final_acc", "best_acc", "runtime_s")}))


def cmd_expand(args) -> None:
    from fedrepro import config
    runs = config.expand(config.load_params_files(args.configfile))
    for run in runs:
        print(run.experiment, run.id)
    print(f"{len(config.unique_runs(runs))} runs", file=sys.stderr)


def cmd_plan(args) -> None:
    from fedrepro import config, plan
    params = config.load_params_files(args.configfile)
    if args.only:
        params["only"] = args.only
    if args.measure:
        import torch
        plan.measure(params, args.device or ("cuda" if torch.cuda.is_available() else "cpu"), args.bench or plan.STEP_COSTS_FILE,
                     log=lambda line: print(line, file=sys.stderr))
    result = plan.plan(params, args.bench, args.runs_dir)
    if args.walltime:  # Slurm: group size that keeps each submission within the site's walltime
        runs_per_gpu = args.runs_per_gpu or plan.measured_runs_per_gpu()[0]
        result["cluster"] = plan.cluster_requests(params, args.walltime, runs_per_gpu, args.bench)
    print(json.dumps(result, indent=2) if args.json else plan.format_plan(result))


def cmd_track(args) -> None:
    from fedrepro import tracking
    manifest = json.loads(Path(args.manifest).read_text())
    result = tracking.register_manifest(manifest, args.runs_dir, args.tracking_uri)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"tracking: {result['registered']} registered, {result['already']} already there, "
          f"{result['failed']} failed ({result['uri']})")


def cmd_report(args) -> None:
    from fedrepro import config, report
    manifest = args.manifest
    if manifest is None:  # straight from the params files: a partial grid, while runs are missing
        params = config.load_params_files(args.configfile)
        name = Path(args.configfile[-1]).stem
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        manifest = Path(args.out).with_suffix(".manifest.json")
        manifest.write_text(json.dumps({**config.manifest(params, config.expand(params), name),
                                        "configfiles": args.configfile,
                                        "command": "fedrepro report --configfile " + " ".join(args.configfile)}))
    out = report.build(manifest, args.runs_dir, args.partitions_dir, args.out, args.figures)
    print(f"report: {Path(out).resolve()}")


def cmd_index(args) -> None:
    from fedrepro import index
    out = index.build(args.out, args.params, args.runs_dir)
    print(f"index: {Path(out).resolve()}")


def cmd_collect(args) -> None:
    from fedrepro import report
    report.collect(args.manifest, args.runs_dir, args.metrics, args.curves)
    print(f"collect: {args.metrics}, {args.curves}")


def cmd_check_gpu(args) -> None:
    from fedrepro import gpucheck
    raise SystemExit(gpucheck.main(args.out, args.data_root, args.rounds, tuple(args.throughput), args.skip_bench))


def cmd_bench(args) -> None:
    import torch
    from fedrepro import bench
    devices = args.device or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if "cuda" in devices and not torch.cuda.is_available():
        raise SystemExit("fedrepro bench: --device cuda was asked for, but torch sees no CUDA device")
    report = bench.run(args.settings, devices, args.rounds, args.repeats, args.quick, args.data_root, args.threads,
                       concurrency=args.throughput)
    print(bench.table(report))
    if args.out:
        bench.write(report, args.out)
    if args.html:
        bench.html(report, args.html)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="fedrepro", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("download", help="fetch a dataset from its mirrors, checksum-verified")
    p.add_argument("--dataset", default="fmnist")
    p.add_argument("--root", default="data/fmnist", help="folder the dataset goes into")
    p.add_argument("--mirror", action="append", help="URL prefix or local folder; repeat to try several in order")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds per network request")
    p.add_argument("--out", help="write a JSON list of the files here when done")
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("partition", help="split a training set over clients and write the partition artifact")
    p.add_argument("--setting", required=True, help="partition setting as JSON (or a JSON file)")
    p.add_argument("--data-root", required=True)
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=cmd_partition)

    p = sub.add_parser("train", help="run one federated training run")
    p.add_argument("--setting", required=True, help="run setting as JSON (or a JSON file)")
    p.add_argument("--partition", required=True, help="partition folder")
    p.add_argument("--data-root", required=True)
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument("--checkpoint-every", type=int, default=10, help="rounds between checkpoints (0: never)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="override the setting's device")
    p.add_argument("--stop-after", type=int, help="checkpoint and stop after this many rounds (for tests)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("expand", help="list the runs a params file declares (validates it)")
    p.add_argument("--configfile", required=True, nargs="+", help="params file(s), merged in order as snakemake does")
    p.set_defaults(func=cmd_expand)

    p = sub.add_parser("plan", help="runs per experiment and estimated compute, before submitting")
    p.add_argument("--configfile", required=True, nargs="+", help="params file(s), merged in order as snakemake does")
    p.add_argument("--only", help="experiment names or patterns, comma-separated (as --config only=...)")
    p.add_argument("--bench", help="the step costs to use (default results/bench/step_costs.json, else the "
                   "benchmark's bench.json); with --measure, where to write them")
    p.add_argument("--measure", action="store_true", help="first time a few steps of each (dataset, model, batch) "
                   "of the params file on --device, and keep them")
    p.add_argument("--device", help="device to measure on (default: cuda when there is one, else cpu)")
    p.add_argument("--runs-dir", default="results/runs", help="finished runs here are not counted again")
    p.add_argument("--walltime", type=int, help="the site's walltime limit in minutes: print the Slurm group "
                   "size (--group-components trainbatch=N) that keeps every submission within it")
    p.add_argument("--runs-per-gpu", type=int, help="runs sharing one GPU (the profile's gpu_slot; default: what "
                   "fedrepro check-gpu measured, else 4)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("track", help="register finished runs in MLflow (idempotent)")
    p.add_argument("--manifest", required=True)
    p.add_argument("--runs-dir", default="results/runs")
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_track)

    p = sub.add_parser("report", help="build the self-contained HTML report (also of a partial grid)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--manifest", help="the manifest the workflow wrote (results/manifests/)")
    source.add_argument("--configfile", nargs="+", help="params file(s), merged in order as snakemake does; "
                        "reports whatever runs exist now and lists the missing ones")
    p.add_argument("--runs-dir", default="results/runs")
    p.add_argument("--partitions-dir", default="results/partitions")
    p.add_argument("--out", required=True, help="the report page")
    p.add_argument("--figures", help="also write its figures as PNG files into this folder")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("index", help="the index page: every experiment of every params file and its state")
    p.add_argument("--out", default="reports/index.html")
    p.add_argument("--params", nargs="+", help="params files to survey (default: params/*.yaml of the project)")
    p.add_argument("--runs-dir", default="results/runs")
    p.set_defaults(func=cmd_index)

    from fedrepro.bench import SETTINGS as BENCH_SETTINGS
    p = sub.add_parser("collect", help="summary metrics (JSON) and all curves (CSV) for dvc metrics/plots")
    p.add_argument("--manifest", required=True)
    p.add_argument("--runs-dir", default="results/runs")
    p.add_argument("--metrics", required=True, help="JSON: per experiment and variant, mean final accuracy etc.")
    p.add_argument("--curves", required=True, help="CSV: one row per run and round")
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("bench", help="seconds per round: engine vs a reference-style loop vs the compute floor")
    p.add_argument("--settings", nargs="+", choices=sorted(BENCH_SETTINGS), default=list(BENCH_SETTINGS),
                   help="which paper settings to time (default: all)")
    p.add_argument("--device", action="append", choices=["cpu", "cuda"],
                   help="repeat for several; default: cpu, and cuda when present")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per repeat (after one warm-up round)")
    p.add_argument("--repeats", type=int, default=1, help="passes over the timed rounds; medians over all")
    p.add_argument("--quick", action="store_true", help="CI size: a tenth of the clients, short local training")
    p.add_argument("--data-root", default="data/fmnist", help="real Fashion-MNIST here if present, else generated")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", help="write the measurements as JSON here")
    p.add_argument("--html", help="write a small HTML page with the table here")
    p.add_argument("--throughput", type=int, nargs="+", metavar="R", help="also measure runs finished per "
                   "device-hour with R runs side by side on one device (1 is always measured), and extrapolate "
                   "IMA Table 1's FMNIST rows")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("check-gpu", help="on a GPU node: the engine's CUDA checks, then the benchmark with several "
                       "runs per GPU; all written to one JSON file (needs only torch, PYTHONPATH=src)")
    p.add_argument("--out", default="results/bench/gpu_check.json")
    p.add_argument("--data-root", default="data/fmnist", help="real Fashion-MNIST here if present, else generated")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per benchmark measurement")
    p.add_argument("--throughput", type=int, nargs="+", default=[2, 4, 8], metavar="R",
                   help="runs side by side on the GPU to measure (1 is always measured)")
    p.add_argument("--skip-bench", action="store_true", help="the correctness checks only")
    p.set_defaults(func=cmd_check_gpu)

    args = parser.parse_args(argv)
    from fedrepro.config import ConfigError
    try:
        args.func(args)
    except ConfigError as err:
        parser.exit(2, f"fedrepro {args.command}: invalid setting\n{err}\n")


if __name__ == "__main__":
    main()
