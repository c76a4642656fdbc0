"""``fedrepro bench``, ``fedrepro bench-table`` and ``fedrepro check-gpu``: timings and the GPU check."""

from __future__ import annotations

from fedrepro.cli.common import EXAMPLES, _absent_or, _existing, _number, _output, finish


def add_parsers(sub) -> None:
    """bench, bench-table, check-gpu."""
    add_bench(sub)
    add_bench_table(sub)
    add_check_gpu(sub)


def add_bench_table(sub) -> None:
    """A table's own runs as one pack for a fixed time (ops/table_pack.py)."""
    p = sub.add_parser(
        "bench-table",
        help="train a table's round-0 runs as one pack for a fixed time: the packed round measured on the "
        "table's own settings, the table's time extrapolated",
    )
    p.add_argument("--configfile", nargs="+", default=["params/ima.yaml"], type=_existing("file"))
    p.add_argument("--only", default="ima_table1_fmnist", help="the experiment (as --config only=...)")
    p.add_argument("--seconds", type=_number(float, 1), default=180.0, help="the time box, data loading included")
    p.add_argument("--max-runs", type=_number(int, 0), default=0, help="pack at most this many runs (0: all)")
    p.add_argument("--algorithms", nargs="+", default=[], metavar="NAME", help="pack only the runs of these methods")
    p.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        type=_override,
        help="set a top-level setting in every run (precision=tf32, step_graph=compile): other runs, timed alike",
    )
    p.add_argument("--data-root", default="data", help="the folder holding <dataset>/ (after fedrepro download)")
    p.add_argument("--root", default="results/table_pack", type=_output("folder"), help="the pack's run folders")
    p.add_argument("--out", default="results/bench/table_pack.json", type=_output("file"))
    p.set_defaults(func=cmd_bench_table)
    finish(p, EXAMPLES["bench-table"])


def cmd_bench_table(args) -> None:
    from fedrepro.ops import table_pack

    table_pack.measure(
        args.configfile,
        args.only,
        args.seconds,
        args.out,
        args.root,
        args.data_root,
        args.max_runs,
        tuple(args.algorithms),
        dict(args.set),
    )


def _override(text: str) -> tuple[str, str]:
    """KEY=VALUE, the value a string (precision and step_graph are names)."""
    import argparse

    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise argparse.ArgumentTypeError(f"'{text}' is not KEY=VALUE (precision=tf32, step_graph=compile)")
    return key, value


def add_bench(sub) -> None:
    """Seconds per round."""
    from fedrepro.ops.bench_settings import SETTINGS as BENCH_SETTINGS

    p = sub.add_parser("bench", help="seconds per round: engine vs a reference-style loop vs the compute floor")
    p.add_argument(
        "--settings",
        nargs="+",
        choices=sorted(BENCH_SETTINGS),
        default=list(BENCH_SETTINGS),
        help="which paper settings to time (default: all)",
    )
    p.add_argument(
        "--device",
        action="append",
        choices=["cpu", "cuda"],
        help="repeat for several; default: cpu, and cuda when present",
    )
    p.add_argument(
        "--rounds", type=_number(int, 1), default=3, help="timed rounds per repeat (after one warm-up round)"
    )
    p.add_argument("--repeats", type=_number(int, 1), default=1, help="passes over the timed rounds; medians over all")
    p.add_argument("--quick", action="store_true", help="CI size: a tenth of the clients, short local training")
    p.add_argument(
        "--data-root",
        default="data/fmnist",
        type=_absent_or("folder"),
        help="real Fashion-MNIST here if present, else generated",
    )
    p.add_argument("--threads", type=_number(int, 0), default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", type=_output("file"), help="write the measurements as JSON here")
    p.add_argument("--html", type=_output("file"), help="write a small HTML page with the table here")
    p.add_argument(
        "--throughput",
        type=_number(int, 1),
        nargs="+",
        metavar="R",
        help="also measure runs finished per "
        "device-hour with R runs side by side on one device (1 is always measured), and extrapolate "
        "IMA Table 1's FMNIST rows",
    )
    p.add_argument(
        "--packed",
        action="store_true",
        help="also the packed step (runs x clients stacked) of each setting at a few pack sizes, per device, into "
        "results/bench/packed_steps-<device>.json (what fedrepro plan prices the packed path with)",
    )
    p.set_defaults(func=cmd_bench)
    finish(p, EXAMPLES["bench"])


def cmd_bench(args) -> None:
    import torch

    from fedrepro.ops import bench

    devices = args.device or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if "cuda" in devices and not torch.cuda.is_available():
        raise SystemExit("fedrepro bench: --device cuda was asked for, but torch sees no CUDA device")
    report = bench.run(
        args.settings,
        devices,
        args.rounds,
        args.repeats,
        args.quick,
        args.data_root,
        args.threads,
        concurrency=args.throughput,
    )
    print(bench.table(report))
    if args.out:
        bench.write(report, args.out)
    if args.html:
        bench.html(report, args.html)
    if args.packed:
        from fedrepro.ops import packed_bench, packed_pricing
        from fedrepro.ops.bench_settings import SETTINGS

        chosen = [SETTINGS[name].quick() if args.quick else SETTINGS[name] for name in args.settings]
        for device in devices:
            settings = [bench.engine_setting(setting, device) for setting in chosen]
            packed_bench.measure(settings, device, packed_pricing.OWN_FILE.format(device=device))


def add_check_gpu(sub) -> None:
    """The GPU check."""
    p = sub.add_parser(
        "check-gpu",
        help="on a GPU node: the engine's CUDA checks, then the benchmark with several "
        "runs per GPU; all written to one JSON file (needs only torch, PYTHONPATH=src)",
    )
    p.add_argument("--out", default="results/bench/gpu_check.json", type=_output("file"))
    p.add_argument(
        "--data-root",
        default="data/fmnist",
        type=_absent_or("folder"),
        help="real Fashion-MNIST here if present, else generated",
    )
    p.add_argument("--rounds", type=_number(int, 1), default=5, help="timed rounds per benchmark measurement")
    p.add_argument(
        "--throughput",
        type=_number(int, 1),
        nargs="+",
        default=[2, 4, 8],
        metavar="R",
        help="runs side by side on the GPU to measure (1 is always measured)",
    )
    p.add_argument(
        "--packed-out",
        default="results/bench/packed_steps-cuda.json",
        type=_output("file"),
        help="where the packed step costs (runs x clients stacked, at 1, 4, 16, 64 runs) go",
    )
    p.add_argument(
        "--packed-budget",
        type=_number(float, 1),
        default=90.0,
        help="seconds the packed step measurement may take (IMA Table 1 FMNIST's setting first, then those "
        "with the most compute)",
    )
    p.add_argument(
        "--graph-budget",
        type=_number(float, 1),
        default=150.0,
        help="seconds the same measurement with step_graph compile (CUDA graphs) may take, compiling included",
    )
    p.add_argument("--skip-bench", action="store_true", help="the correctness checks only")
    p.add_argument(
        "--skip",
        nargs="+",
        default=[],
        choices=["step_costs", "packed", "bench"],
        help="leave these measurements out (a short GPU slot: the checks and the packed steps, say)",
    )
    p.set_defaults(func=cmd_check_gpu)
    finish(p, EXAMPLES["check-gpu"])


def cmd_check_gpu(args) -> None:
    from fedrepro.ops import gpucheck

    raise SystemExit(
        gpucheck.main(
            args.out,
            args.data_root,
            args.rounds,
            tuple(args.throughput),
            args.skip_bench,
            packed_out=args.packed_out,
            packed_budget=args.packed_budget,
            graph_budget=args.graph_budget,
            skip=tuple(args.skip),
        )
    )
