"""The ``fedrepro`` command: every step a Snakemake rule runs, each with --help."""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path


def _json_arg(text: str):
    """A JSON object given inline or as a file; anything else is a usage error naming what was given."""
    path = Path(text)
    if not text.lstrip().startswith("{"):
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"'{text}' is neither a JSON object nor an existing JSON file")
        text = path.read_text()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object {{...}}, not {type(value).__name__}")
    return value


def _partition_setting(text: str) -> dict:
    from fedrepro.registry import DATASETS
    setting = _json_arg(text)
    missing = [k for k in ("dataset", "kind") if k not in setting]
    if missing:
        raise argparse.ArgumentTypeError(f"the partition setting needs {' and '.join(missing)} "
                                         f"(e.g. {{\"dataset\": \"fmnist\", \"kind\": \"iid\", \"num_clients\": 10}})")
    if setting["dataset"] not in DATASETS:
        raise argparse.ArgumentTypeError(f"dataset '{setting['dataset']}' is not one of {', '.join(sorted(DATASETS))}")
    return setting


def _number(kind, minimum, strict: bool = False):
    """An argparse type: ``kind`` (int or float) at least ``minimum`` (above it when ``strict``)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value):  # nan compares false with any bound, so the bound alone would let it through
            raise argparse.ArgumentTypeError(f"'{text}' is not a finite number")
        if value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"{value} must be {'>' if strict else '>='} {minimum}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _rounds(text: str) -> list[int]:
    try:
        rounds = [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated round numbers, e.g. 150,200") from None
    if any(r < 1 for r in rounds):
        raise argparse.ArgumentTypeError(f"{text!r}: rounds must be >= 1")
    return rounds


def _folder_name(text: str) -> str:
    if not text or "/" in text or text.startswith("."):
        raise argparse.ArgumentTypeError(f"'{text}' must be a plain folder name (no '/', not starting with '.')")
    return text


def _existing(kind: str):
    """An argparse type: a path that exists now and is a ``file`` or a ``folder``."""
    def parse(text: str) -> str:
        path = Path(text)
        if not (path.is_file() if kind == "file" else path.is_dir()):
            raise argparse.ArgumentTypeError(f"no such {kind}: {text}")
        return text
    return parse


# One worked example per sub-command, shown at the end of its --help.
EXAMPLES = {
    "download": "fedrepro download --dataset fmnist --root data/fmnist --mirror /usr/share/datasets/fashion-mnist/",
    "partition": "fedrepro partition --setting '{\"dataset\": \"fmnist\", \"kind\": \"dirichlet\", \"alpha\": 0.1, "
                 "\"num_clients\": 20, \"seed\": 1}' --data-root data/fmnist --out results/partitions/p1",
    "train": "fedrepro train --setting '{\"dataset\": \"fmnist\", \"model\": \"mlp\", \"rounds\": 5, \"num_clients\": 20}' "
             "--partition results/partitions/p1 --data-root data/fmnist --out results/runs/r1",
    "fork": "fedrepro fork --setting '{\"dataset\": \"fmnist\", \"model\": \"mlp\", \"rounds\": 5, \"num_clients\": 20}' "
            "--run-dir results/runs/r1 --round 3 --history 2 --partition results/partitions/p1 --data-root data/fmnist "
            "--out results/runs/r1/fork/3.pt",
    "expand": "fedrepro expand --configfile params/fedlaw.yaml params/subsets/fedlaw_table3_fmnist_mlp_seed8.yaml",
    "plan": "fedrepro plan --configfile params/ima.yaml --only 'ima_table1_*'",
    "track": "fedrepro track --manifest results/manifests/default.json --out results/tracking/default.json",
    "manifest": "fedrepro manifest --configfile params/default.yaml",
    "tune": "fedrepro tune select --manifest results/manifests/ima-0123456789.json "
            "--tuning tune-fedprox-fmnist-dir0.1-cnn-fedprox.mu-0123456789 --out results/tuning/choice.json",
    "report": "fedrepro report --configfile params/fedlaw.yaml params/subsets/fedlaw_table3_fmnist_mlp_seed8.yaml "
              "--out reports/fedlaw_subset.html",
    "index": "fedrepro index --out reports/index.html",
    "collect": "fedrepro collect --manifest results/manifests/default.json --metrics results/metrics/default "
               "--curves results/curves/default",
    "bench": "fedrepro bench --quick --settings fmnist_mlp --device cpu --rounds 1",
    "check-gpu": "fedrepro check-gpu --out results/bench/gpu_check.json --throughput 2 4 8",
    "tables": "fedrepro tables --configfile params/fedlaw.yaml params/subsets/fedlaw_table3_fmnist_mlp_dir0.1_seed8.yaml "
              "--format latex",
    "figures": "fedrepro figures --name quadratic --spec '{\"kind\": \"quadratic\"}' --out reports/default_figures/quadratic.png",
    "evidence": "fedrepro evidence keep --configfile params/fedlaw.yaml params/subsets/fedlaw_table3_fmnist_mlp_dir0.1_seed8.yaml "
                "--name fedlaw_table3_fmnist_mlp_dir0.1_seed8\n"
                "  fedrepro evidence report evidence/fedlaw_table3_fmnist_mlp_dir0.1_seed8 --out reports/fedlaw_evidence.html\n"
                "  fedrepro evidence matrix --write-readme\n"
                "  fedrepro evidence compare evidence/fednova_fig5_synthetic --configfile params/fednova.yaml "
                "params/subsets/verify_fednova_fig5_synthetic.yaml\n"
                "  fedrepro evidence collapses evidence/fedlaw_table3_fmnist_mlp --write",
}


def cmd_download(args) -> None:
    from fedrepro import data
    mirrors = args.mirror or (args.mirror_map or {}).get(args.dataset) or None
    folder = data.prepare(args.dataset, args.root, mirrors, args.out, timeout=args.timeout)
    print(f"{args.dataset}: ready in {folder}")


def cmd_partition(args) -> None:
    from fedrepro import data, partition, partition_records, registry
    setting = args.setting  # parsed and checked by the parser
    labels = data.train_labels(setting["dataset"], args.data_root)
    groups = None
    if setting["kind"] == "natural":  # the dataset's own clients (Synthetic)
        from fedrepro.data import synthetic
        groups = synthetic.train_groups(setting["dataset"], args.data_root)
    # a multi-domain dataset (digit5, pacs): each domain is split over its own clients
    parts = partition.make(labels, setting, groups, data.train_domains(setting["dataset"], args.data_root))
    info = partition_records.write(args.out, setting, labels, parts, registry.DATASETS[setting["dataset"]]["num_classes"])
    print(f"partition {Path(args.out).name}: {info['content_hash']}, client sizes {info['sizes']}, "
          f"{partition_records.caption(info['heterogeneity'])}")


def cmd_train(args) -> None:
    import torch
    from fedrepro import engine
    from fedrepro.config import resolve
    engine.die_with_parent()  # killing Snakemake stops its training jobs too
    if args.threads:
        torch.set_num_threads(args.threads)
    setting = resolve(args.setting)
    _check_run_folder(setting, args.out)
    if args.device:
        setting["device"] = args.device
    if setting["device"] != "cpu":  # several GPUs here: this job takes its own (fedrepro.slots)
        from fedrepro import slots
        bound = slots.bind_gpu()
        if bound:
            print(bound, file=sys.stderr, flush=True)
    observer = None
    if args.mlflow_experiment:
        from fedrepro import tracking
        observer = tracking.live_run(args.out, args.tracking_uri, args.mlflow_experiment, args.mlflow_manifest,
                                     args.partition)
    from fedrepro import forks
    summary = engine.train(setting, args.out, args.partition, args.data_root, args.checkpoint_every,
                           progress=not args.no_progress, stop_after=args.stop_after, observer=observer,
                           keep_forks=args.keep_forks, history=args.fork_history, fork_from=args.fork_from,
                           accepts=lambda parent, rounds: forks.shares_prefix(setting, parent, rounds))
    print(json.dumps({k: summary.get(k) for k in ("run", "status", "final_acc", "best_acc", "runtime_s")}))


RUN_FOLDER = re.compile(r".+-s-?\d+-[0-9a-f]{10}")


def _check_run_folder(setting: dict, out: str) -> None:
    """A run folder named by a run id holds the run of that id: a setting that now hashes to another id (the
    code changed since the grid was expanded) must not train into it."""
    from fedrepro.errors import SetupError
    from fedrepro.identity import run_id
    name = Path(out).name
    if RUN_FOLDER.fullmatch(name) and run_id(setting) != name:
        raise SetupError(f"--out {out}: the setting hashes to run id {run_id(setting)}, not to the folder's name; "
                         f"the code or the setting changed since the grid was expanded: expand it again (snakemake -n)")


def cmd_fork(args) -> None:
    import torch
    from fedrepro import engine
    from fedrepro.config import resolve
    engine.die_with_parent()
    if args.threads:
        torch.set_num_threads(args.threads)
    how = engine.fork_state(resolve(args.setting), args.run_dir, args.round, args.history, args.out, args.partition,
                            args.data_root)
    print(f"fork state of {Path(args.run_dir).name} after {args.round} rounds: {args.out} "
          f"({'kept by the run' if how == 'kept' else 'its first rounds trained again'})")


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
    device = args.device or "cuda"  # a cluster user plans for the GPUs the runs will get
    if args.measure:
        import torch
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")  # plan what was measured
        plan.measure(params, device, args.bench or plan.STEP_COSTS_FILE, log=lambda line: print(line, file=sys.stderr))
    result = plan.plan(params, args.bench, args.runs_dir, device)
    if args.walltime:  # Slurm: group size that keeps each submission within the site's walltime
        runs_per_gpu = args.runs_per_gpu or plan.measured_runs_per_gpu()[0]
        result["cluster"] = plan.cluster_requests(params, args.walltime, runs_per_gpu, args.bench)
    print(json.dumps(result, indent=2) if args.json else plan.format_plan(result))


def _manifest_of(args, command: str) -> dict:
    """The manifest a command reads: --manifest as written, or the one of --configfile's params files."""
    from fedrepro import config, records
    if args.manifest:
        return records.read_json(args.manifest)
    return config.run_manifest(config.load_params_files(args.configfile), args.configfile,
                               f"fedrepro {command} --configfile " + " ".join(args.configfile))


def cmd_track(args) -> None:
    from fedrepro import tracking
    manifest = _manifest_of(args, "track")
    result = tracking.track(manifest, args.runs_dir, args.tracking_uri, args.run)
    print(f"tracking: {result['registered']} registered, {result['repaired']} repaired, {result['already']} "
          f"already there, {result['missing']} without a summary, {result['failed']} failed ({result['uri']})")
    for error in result["errors"]:
        print(f"  {error}", file=sys.stderr)
    if result["failed"]:  # no --out: the step is not done, and Snakemake retries it next time
        raise SystemExit(1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


def cmd_manifest(args) -> None:
    from fedrepro import config
    params = config.load_params_files([Path(args.base, f) for f in args.configfile])
    if args.overrides:  # Snakemake's --config: merged last, as Snakemake does
        params = config.validate(config.deep_merge(params, args.overrides), "params.schema.yaml",
                                 " ".join(args.configfile) + " with --config")
    manifest = config.run_manifest(params, args.configfile, args.command or "fedrepro manifest --configfile "
                                   + " ".join(args.configfile))
    addressed = Path(config.manifest_path(manifest))
    out = Path(args.out or addressed)
    if args.check_name and out.name != addressed.name:
        raise SystemExit(f"fedrepro manifest: the manifest's content hashes to {addressed.name}, not {out.name}: "
                         "the workflow and the library read the params differently")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    print(f"manifest: {out}")


def cmd_tune(args) -> None:
    from fedrepro import tuning
    manifest = json.loads(Path(args.manifest).read_text())
    if args.action == "select":
        try:
            choice = tuning.select(manifest, args.tuning, args.runs_dir)
        except tuning.TuningError as err:
            raise SystemExit(f"fedrepro tune select: {args.tuning}: {err}")
        result = choice
        print(f"tuning {args.tuning}: {choice['chosen_label']} ({choice['criterion']} "
              f"{choice['candidates'][choice['chosen_index']]['value']:.4f})")
    elif args.action == "final":
        from fedrepro.rundir import RunDir
        final = [r["id"] for exp in manifest["experiments"].values() for r in exp["runs"] if "tuned" in r]
        missing = [r for r in final if not RunDir(Path(args.runs_dir) / r).finished()]
        if missing:
            raise SystemExit(f"fedrepro tune final: final runs without a summary: {', '.join(missing)}")
        result = manifest
        print(f"{len(final)} final runs of the tuned experiments, all finished")
    else:
        choices = {}
        for path in args.choices:
            choice = json.loads(Path(path).read_text())
            choices[choice["tuning"]] = choice
        missing = sorted(set(manifest.get("tunings", {})) - set(choices))
        if missing:
            raise SystemExit(f"fedrepro tune manifest: no choice for {', '.join(missing)}")
        result = tuning.tuned_manifest(manifest, choices)
        print(f"tuned manifest: {sum('tuned' in r for e in result['experiments'].values() for r in e['runs'])} "
              f"final runs of {len(choices)} tuning(s)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True))


def cmd_report(args) -> None:
    from fedrepro import config, report
    manifest = args.manifest
    if manifest is None:  # straight from the params files: a partial grid, while runs are missing
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        manifest = Path(args.out).with_suffix(".manifest.json")
        from fedrepro import tuning
        content = config.run_manifest(config.load_params_files(args.configfile), args.configfile,
                                      "fedrepro report --configfile " + " ".join(args.configfile))
        if content.get("tunings"):  # the final runs of the tunings that chose already; the others are missing
            content = tuning.tuned_manifest(content, tuning.choices_on_disk(content, Path(args.runs_dir).parent / "tuning"))
        manifest.write_text(json.dumps(content))
    out = report.build(manifest, args.runs_dir, args.partitions_dir, args.out, args.figures, args.paper_figures)
    print(f"report: {Path(out).resolve()}")


def cmd_tables(args) -> None:
    from fedrepro import config, report, tables
    manifest = _manifest_of(args, "tables")
    comparisons = report.paper_comparisons(manifest, Path(args.runs_dir))
    if args.table:
        unknown = sorted(set(args.table) - {c["name"] for c in comparisons})
        if unknown:
            raise config.ConfigError(f"--table {', '.join(unknown)}: not a paper table of this params file; its "
                                     f"tables: {', '.join(c['name'] for c in comparisons) or 'none'}")
        comparisons = [c for c in comparisons if c["name"] in args.table]
    sys.stdout.write(tables.render(comparisons, args.format))


def cmd_figures(args) -> None:
    from fedrepro import figures, records
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    manifest = records.read_json(args.manifest) if args.manifest else None
    spec = figures.check({args.name: _json_arg(args.spec)}, (manifest or {}).get("experiments", {}))[args.name]
    context = figures.Context(Path(args.data_root) if args.data_root else None, args.device,
                              bool((manifest or {}).get("quick")))
    record = figures.draw(args.name, spec, manifest, args.runs_dir, args.out, context)
    print(f"figure {args.name}: {'drawn' if record['drawn'] else 'not drawn: ' + record['reason']} -> {args.out}")


def cmd_index(args) -> None:
    from fedrepro import index
    from fedrepro.config import ROOT
    evidence = None if args.no_evidence else (args.evidence or ROOT / "evidence")
    out = index.build(args.out, args.params, args.runs_dir, evidence=evidence)
    print(f"index: {Path(out).resolve()}")


def cmd_collect(args) -> None:
    from fedrepro import report
    report.collect(args.manifest, args.runs_dir, args.metrics, args.curves)
    print(f"collect: {args.metrics}, {args.curves}")


def _kept_run(run: Path) -> tuple[dict, object]:
    import pandas as pd
    from fedrepro import config
    metrics = run / "metrics.csv"
    return config.read_json(run / "summary.json"), pd.read_csv(metrics) if metrics.is_file() else None


def cmd_evidence(args) -> None:
    from fedrepro import evidence
    if args.action == "matrix":
        from fedrepro import verification
        rows = verification.matrix(args.root)
        block = verification.markdown(rows)
        if args.write_readme:
            verification.write_readme(block)
            verification.write_block(verification.README, verification.glance(rows), verification.GLANCE_START,
                                     verification.GLANCE_END)
            print("docs/verification.md: verification matrix rewritten; README.md: its summary rewritten")
        else:
            print(block, end="")
        return
    if args.action == "collapses":
        from fedrepro import collapses
        for folder in args.folder:
            rows = evidence.record_collapses(folder) if args.write else [
                {"run": r.name, "record": collapses.of_run(*_kept_run(r))} for r in sorted(Path(folder, "runs").glob("*"))]
            for row in rows:
                if row["record"] and row["record"]["collapsed"]:
                    print(f"{folder}: {row['run']}: {collapses.describe(row['record'], limit=None)}")
        return
    if args.action == "compare":
        raise SystemExit(_print_comparison(evidence.compare(args.folder, args.configfile, args.runs_dir,
                                                            args.partitions_dir), args.folder, args.tolerance))
    if args.action == "keep":
        kept = evidence.keep(args.configfile, args.name, args.runs_dir, args.partitions_dir, args.root, args.manifest,
                             args.protocol, args.carry)
        carried = f" ({kept['carried']} carried from earlier evidence)" if kept["carried"] else ""
        if kept["unchanged"]:
            print(f"evidence: {kept['folder']} unchanged: it already holds these {kept['runs']} runs' records")
        else:
            print(f"evidence: {kept['runs']} runs{carried} and {kept['partitions']} partitions kept in {kept['folder']} "
                  f"({kept['bytes'] / 1024:.0f} KB)")
    else:
        out = evidence.report(args.folder, args.out, args.figures)
        print(f"report: {Path(out).resolve()}")


def _print_comparison(rows: list[dict], folder: str, tolerance: float) -> int:
    """A line per kept run and a verdict; the exit status: 1 when a rerun differs by more than ``tolerance``."""
    acc = lambda a: "—" if a is None else f"{100 * a:.2f}"
    kernels = lambda k: k or "not recorded"
    for r in rows:
        if r["state"] == "compared":
            where = "bit for bit" if r["max_abs_diff"] == 0 else f"max |Δ| {r['max_abs_diff']:.3g} ({r['column']})"
            rounds = f"{r['rounds']} rounds" + ("" if r["same_rounds"] else ", not the same rounds")
            print(f"{r['kept']}  ->  {r['rerun']}: {where}, {rounds}; final acc {acc(r['kept_final_acc'])} -> "
                  f"{acc(r['rerun_final_acc'])}; CPU kernels {kernels(r['kept_cpu_kernels'])} -> "
                  f"{kernels(r['rerun_cpu_kernels'])}")
        else:
            print(f"{r['kept']}: {r['state']}" + (f" ({r['rerun']})" if r["rerun"] else ""))
    compared = [r for r in rows if r["state"] == "compared"]
    differ = [r for r in compared if r["max_abs_diff"] > tolerance or not r["same_rounds"]]
    exact = sum(r["max_abs_diff"] == 0 and r["same_rounds"] for r in compared)
    print(f"{folder}: {len(compared)} of {len(rows)} kept runs rerun; {exact} bit for bit, "
          f"{len(differ)} beyond the tolerance {tolerance:g}")
    if any(r["max_abs_diff"] and r["kept_cpu_kernels"] != r["rerun_cpu_kernels"] for r in compared):
        print("runs whose CPU kernels differ (or were not recorded) move in float32's last bits: judge them by the "
              "cell's spread over seeds, not bit for bit (docs/verification.md: Checking a kept run by rerunning it)")
    if not compared:
        print("nothing compared: rerun the params files' runs first (snakemake --configfile ...)", file=sys.stderr)
        return 2
    return 1 if differ else 0


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


def build_parser() -> argparse.ArgumentParser:
    from fedrepro import __version__
    from fedrepro.registry import DATASETS
    parser = argparse.ArgumentParser(prog="fedrepro", description=__doc__)
    parser.add_argument("--version", action="version", version=f"fedrepro {__version__}")
    debug_help = f"on an error fedrepro raises on purpose, show the traceback too (or set {DEBUG_VARIABLE}=1)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("download", help="fetch a dataset from its mirrors, checksum-verified")
    p.add_argument("--dataset", default="fmnist", choices=sorted(DATASETS), help="which dataset (default fmnist)")
    p.add_argument("--root", default="data/fmnist", help="folder the dataset goes into")
    p.add_argument("--mirror", action="append", help="URL prefix or local folder; repeat to try several in order")
    p.add_argument("--mirror-map", type=_json_arg, help="the params file's data.mirrors as JSON {dataset: [mirror, "
                   "...]}: this dataset's list, when no --mirror is given (how the workflow passes them)")
    p.add_argument("--timeout", type=_number(float, 0, strict=True), default=20.0, help="seconds per network request")
    p.add_argument("--out", help="write a JSON list of the files here when done")
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("partition", help="split a training set over clients and write the partition artifact")
    p.add_argument("--setting", required=True, type=_partition_setting,
                   help="partition setting as JSON (or a JSON file): dataset, kind, num_clients, ...")
    p.add_argument("--data-root", required=True, type=_existing("folder"), help="the dataset's folder (after download)")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=cmd_partition)

    p = sub.add_parser("train", help="run one federated training run")
    p.add_argument("--setting", required=True, type=_json_arg, help="run setting as JSON (or a JSON file)")
    p.add_argument("--partition", required=True, type=_existing("folder"), help="partition folder")
    p.add_argument("--data-root", required=True, type=_existing("folder"), help="the dataset's folder (after download)")
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument("--checkpoint-every", type=_number(int, 0), default=10, help="rounds between checkpoints (0: never)")
    p.add_argument("--threads", type=_number(int, 0), default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="override the setting's device")
    p.add_argument("--stop-after", type=_number(int, 1), help="checkpoint and stop after this many rounds (for tests)")
    p.add_argument("--no-progress", action="store_true", help="no per-round progress line")
    p.add_argument("--keep-forks", type=_rounds, default=[], help="comma-separated rounds after which to keep this "
                   "run's state for runs that fork from it (fork/kept-<round>.pt)")
    p.add_argument("--fork-history", type=_number(int, 0), default=0, help="last global models each kept state "
                   "holds (the children's parts need them: IMA's window)")
    p.add_argument("--fork-from", help="a parent run's fork state to start from (when this run has no checkpoint)")
    p.add_argument("--mlflow-experiment", help="log the run live into this MLflow experiment (default: no tracking)")
    p.add_argument("--mlflow-manifest", help="the params file's manifest: the run is nested under the parent run of "
                   "the first experiment that holds it (not part of the run's identity)")
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("fork", help="the state of a run after some rounds, for the runs that fork from it "
                       "(the one it kept while training, else its first rounds trained again)")
    p.add_argument("--setting", required=True, type=_json_arg, help="the parent run's setting as JSON (or a JSON file)")
    p.add_argument("--run-dir", required=True, help="the parent run's folder")
    p.add_argument("--round", required=True, type=_number(int, 1), help="rounds the children share")
    p.add_argument("--history", type=_number(int, 0), default=0, help="last global models the state holds")
    p.add_argument("--partition", required=True, type=_existing("folder"), help="partition folder")
    p.add_argument("--data-root", required=True, type=_existing("folder"), help="the dataset's folder")
    p.add_argument("--out", required=True, help="the fork state file")
    p.add_argument("--threads", type=_number(int, 0), default=0, help="torch CPU threads (0: torch's default)")
    p.set_defaults(func=cmd_fork)

    p = sub.add_parser("expand", help="list the runs a params file declares (validates it)")
    p.add_argument("--configfile", required=True, nargs="+", type=_existing("file"),
                   help="params file(s), merged in order as snakemake does")
    p.set_defaults(func=cmd_expand)

    p = sub.add_parser("plan", help="runs per experiment and estimated compute, before submitting")
    p.add_argument("--configfile", required=True, nargs="+", type=_existing("file"),
                   help="params file(s), merged in order as snakemake does")
    p.add_argument("--only", help="experiment names or patterns, comma-separated (as --config only=...)")
    p.add_argument("--bench", help="the step costs to use (default results/bench/step_costs.json, then the "
                   "benchmark's bench.json: their --device measurements); with --measure, where to write them")
    p.add_argument("--measure", action="store_true", help="first time a few steps of each (dataset, model, batch) "
                   "of the params file on --device, and keep them")
    p.add_argument("--device", choices=["cuda", "cpu"], help="the device the runs will train on: only its "
                   "measurements price them; what they lack comes from the GPU table (evidence/gpu) for cuda, "
                   "or is marked as a guess (default cuda; with --measure, cuda when there is one, else cpu)")
    p.add_argument("--runs-dir", default="results/runs", help="finished runs here are not counted again")
    p.add_argument("--walltime", type=int, help="the site's walltime limit in minutes: print the Slurm group "
                   "size (--group-components trainbatch=N) that keeps every submission within it")
    p.add_argument("--runs-per-gpu", type=int, help="runs sharing one GPU (the profile's gpu_slot; default: what "
                   "fedrepro check-gpu measured, else 4)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("track", help="reconcile MLflow with the runs' files, run by run (idempotent; exits 1 "
                       "and writes no --out when the store cannot be reached)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--configfile", nargs="+", type=_existing("file"), help="params file(s), merged in order as snakemake does")
    source.add_argument("--manifest", type=_existing("file"), help="the manifest the workflow wrote (results/manifests/)")
    p.add_argument("--run", action="append", help="only this run id (repeat for several)")
    p.add_argument("--runs-dir", default="results/runs")
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.add_argument("--out", help="write the result here when every run with a summary is tracked")
    p.set_defaults(func=cmd_track)

    p = sub.add_parser("manifest", help="write the manifest of a params file (its runs per experiment), the "
                       "file the track, report and collect steps read")
    p.add_argument("--configfile", required=True, nargs="+",
                   help="params file(s), merged in order as snakemake does; recorded as given")
    p.add_argument("--base", default=".", type=_existing("folder"),
                   help="the folder --configfile paths are relative to (the workflow's, when it runs elsewhere)")
    p.add_argument("--overrides", type=_json_arg, help="Snakemake's --config values as a JSON object, merged last")
    p.add_argument("--command", help="the command to record as how the manifest was made")
    p.add_argument("--out", help="default: results/manifests/<name>-<content hash>.json")
    p.add_argument("--check-name", action="store_true",
                   help="refuse when --out is not the content-addressed name (the workflow's own check)")
    p.set_defaults(func=cmd_manifest)

    p = sub.add_parser("tune", help="the tuning stage: pick a tuning's value from its runs (select), or write the "
                       "manifest with the final runs the choices give (manifest)")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = actions.add_parser("select", help="rank a tuning's candidates by its criterion on the validation split")
    a.add_argument("--manifest", required=True, type=_existing("file"), help="the manifest the workflow wrote")
    a.add_argument("--tuning", required=True, help="the tuning's id (a key of the manifest's tunings)")
    a.add_argument("--runs-dir", default="results/runs", help="the run folders")
    a.add_argument("--out", required=True, help="the choice record (JSON): per candidate its values, and the winner")
    a.set_defaults(func=cmd_tune)
    a = actions.add_parser("manifest", help="the manifest with every tuned experiment's final runs")
    a.add_argument("--manifest", required=True, type=_existing("file"), help="the manifest the workflow wrote")
    a.add_argument("--choices", nargs="*", default=[], type=_existing("file"), help="the choice records")
    a.add_argument("--out", required=True, help="the tuned manifest")
    a.set_defaults(func=cmd_tune)
    a = actions.add_parser("final", help="the tuned manifest again, once every final run it lists has finished")
    a.add_argument("--manifest", required=True, type=_existing("file"), help="the tuned manifest")
    a.add_argument("--runs-dir", default="results/runs", help="the run folders")
    a.add_argument("--out", required=True, help="the manifest the report, tracking and collect steps read")
    a.set_defaults(func=cmd_tune)

    p = sub.add_parser("report", help="build the self-contained HTML report (also of a partial grid)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--manifest", type=_existing("file"), help="the manifest the workflow wrote (results/manifests/)")
    source.add_argument("--configfile", nargs="+", type=_existing("file"),
                        help="params file(s), merged in order as snakemake does; "
                        "reports whatever runs exist now and lists the missing ones")
    p.add_argument("--runs-dir", default="results/runs", help="the run folders")
    p.add_argument("--partitions-dir", default="results/partitions", help="the partition folders")
    p.add_argument("--out", required=True, help="the report page")
    p.add_argument("--figures", help="also write its figures as PNG files into this folder")
    p.add_argument("--paper-figures", help="embed the papers' analysis figures (fedrepro figures) of this folder")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("tables", help="print the paper-vs-ours tables (as the report page shows them) as LaTeX "
                       "(booktabs), CSV or Markdown")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--configfile", nargs="+", type=_existing("file"),
                        help="params file(s), merged in order as snakemake does (also of a partial grid)")
    source.add_argument("--manifest", type=_existing("file"), help="the manifest the workflow wrote (results/manifests/)")
    p.add_argument("--format", choices=["latex", "csv", "md"], default="latex")
    p.add_argument("--table", action="append", help="only this paper table (repeat for several; default: all of "
                   "the params file's)")
    p.add_argument("--runs-dir", default="results/runs", help="the run folders")
    p.set_defaults(func=cmd_tables)

    p = sub.add_parser("figures", help="draw one of the papers' analysis figures from runs (docs/figures.md)")
    p.add_argument("--name", required=True, help="the figure's name in the params file's figures section")
    p.add_argument("--spec", required=True, help="the figure's spec as JSON (or a JSON file)")
    p.add_argument("--manifest", help="the manifest the workflow wrote (not needed for pure-math figures)")
    p.add_argument("--runs-dir", default="results/runs")
    p.add_argument("--data-root", help="the params file's data root (landscapes and interpolations evaluate models)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", required=True, help="the PNG; its caption goes beside it as .json")
    p.set_defaults(func=cmd_figures)

    p = sub.add_parser("index", help="the index page: every experiment of every params file and its state")
    p.add_argument("--out", default="reports/index.html")
    p.add_argument("--params", nargs="+", type=_existing("file"),
                   help="params files to survey (default: params/*.yaml of the project)")
    p.add_argument("--runs-dir", default="results/runs", help="the run folders")
    p.add_argument("--evidence",
                   help="the evidence folders whose verified results open the page (default: the project's evidence/)")
    p.add_argument("--no-evidence", action="store_true", help="leave the verified results out")
    p.set_defaults(func=cmd_index)

    from fedrepro.bench_settings import SETTINGS as BENCH_SETTINGS
    p = sub.add_parser("collect", help="per experiment and variant: summary metrics (JSON) and mean curves (CSV) "
                       "for dvc metrics/plots")
    p.add_argument("--manifest", required=True, type=_existing("file"), help="the manifest the workflow wrote")
    p.add_argument("--runs-dir", default="results/runs", help="the run folders")
    p.add_argument("--metrics", required=True, help="folder: <experiment>/<variant>.json, mean final accuracy etc.")
    p.add_argument("--curves", required=True, help="folder: <experiment>/<variant>.csv, per round the mean over seeds")
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("bench", help="seconds per round: engine vs a reference-style loop vs the compute floor")
    p.add_argument("--settings", nargs="+", choices=sorted(BENCH_SETTINGS), default=list(BENCH_SETTINGS),
                   help="which paper settings to time (default: all)")
    p.add_argument("--device", action="append", choices=["cpu", "cuda"],
                   help="repeat for several; default: cpu, and cuda when present")
    p.add_argument("--rounds", type=_number(int, 1), default=3, help="timed rounds per repeat (after one warm-up round)")
    p.add_argument("--repeats", type=_number(int, 1), default=1, help="passes over the timed rounds; medians over all")
    p.add_argument("--quick", action="store_true", help="CI size: a tenth of the clients, short local training")
    p.add_argument("--data-root", default="data/fmnist", help="real Fashion-MNIST here if present, else generated")
    p.add_argument("--threads", type=_number(int, 0), default=0, help="torch CPU threads (0: torch's default)")
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

    p = sub.add_parser("evidence", help="keep finished runs' compact records in evidence/, or rebuild a page from them")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = actions.add_parser("keep", help="copy summary.json, metrics.csv, partitions' records and the manifest of a "
                           "params file's finished runs into evidence/NAME (no models, no checkpoints)")
    which = a.add_mutually_exclusive_group(required=True)
    which.add_argument("--configfile", nargs="+", type=_existing("file"),
                       help="params file(s), merged in order as snakemake does (e.g. a paper's file and a subset)")
    which.add_argument("--manifest", type=_existing("file"),
                       help="a manifest the workflow wrote when the runs ran (results/manifests/): keeps the runs it "
                            "names, also when they ran with an earlier commit of the code")
    a.add_argument("--name", required=True, type=_folder_name, help="the folder's name under --root")
    a.add_argument("--runs-dir", default="results/runs", help="the run folders")
    a.add_argument("--partitions-dir", default="results/partitions", help="the partition folders")
    a.add_argument("--root", default="evidence", help="where evidence folders live")
    a.add_argument("--carry", nargs="+", type=_existing("folder"), metavar="FOLDER",
                   help="earlier evidence folders: a declared run not finished in --runs-dir takes the records of an "
                        "equal run kept there (same setting under today's code, same partition content), under its own id")
    a.add_argument("--protocol", help="the runs' protocol: paper (they enter the verification matrix), official, "
                   "or another word (default: official when an *_official_protocol subset is given, else paper)")
    a.set_defaults(func=cmd_evidence)
    a = actions.add_parser("matrix", help="the verification matrix: the papers' cells that the paper-protocol "
                           "evidence reproduces, per table (Markdown)")
    a.add_argument("--root", default="evidence", help="where evidence folders live")
    a.add_argument("--write-readme", action="store_true",
                   help="rewrite the matrix in docs/verification.md and its summary in README.md")
    a.set_defaults(func=cmd_evidence)
    a = actions.add_parser("report", help="rebuild the report page of an evidence folder from that folder alone")
    a.add_argument("folder", type=_existing("folder"), help="an evidence folder (made by `fedrepro evidence keep`)")
    a.add_argument("--out", required=True, help="the report page")
    a.add_argument("--figures", help="also write its figures as PNG files into this folder")
    a.set_defaults(func=cmd_evidence)
    a = actions.add_parser("compare", help="does a rerun confirm the kept records? each kept run against today's run "
                           "of equal setting and partition, every round and metric")
    a.add_argument("folder", type=_existing("folder"), help="an evidence folder (made by `fedrepro evidence keep`)")
    a.add_argument("--configfile", nargs="+", required=True, type=_existing("file"),
                   help="the params file(s) that declare the rerun, merged in order as snakemake does")
    a.add_argument("--runs-dir", default="results/runs", help="the rerun's run folders")
    a.add_argument("--partitions-dir", default="results/partitions", help="the rerun's partition folders")
    a.add_argument("--tolerance", type=_number(float, 0), default=0.0,
                   help="largest |difference| of any metric in any round that still confirms (default 0: bit for "
                        "bit, what the same machine gives; another CPU or a GPU may differ in the last bits)")
    a.set_defaults(func=cmd_evidence)
    a = actions.add_parser("collapses", help="the kept runs that collapsed (test accuracy more than 20 points below "
                           "its best so far, or to chance), from their metrics.csv; --write records each run's "
                           "record in its kept summary.json")
    a.add_argument("folder", nargs="+", type=_existing("folder"), help="evidence folders")
    a.add_argument("--write", action="store_true", help="write the record (key collapse) into each kept summary.json")
    a.set_defaults(func=cmd_evidence)
    for action, a in actions.choices.items():
        a.epilog = "example:\n  " + EXAMPLES["evidence"].splitlines()[
            ["keep", "report", "matrix", "compare", "collapses"].index(action)].strip()
        a.formatter_class = argparse.RawDescriptionHelpFormatter

    for p in [*sub.choices.values(), *actions.choices.values()]:  # also after the sub-command
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    for name, p in sub.choices.items():
        if name in EXAMPLES:
            p.epilog = "example:\n  " + EXAMPLES[name]
            p.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


DEBUG_VARIABLE = "FEDREPRO_DEBUG"


def _debugging(args) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    from fedrepro.errors import FedreproError
    try:
        args.func(args)
    except FedreproError as err:
        # raised on purpose: its message names the file or setting and what to do; a rule's log ends with it
        if _debugging(args):
            raise
        parser.exit(2, f"fedrepro {args.command}: {err}\n")


if __name__ == "__main__":
    main()
