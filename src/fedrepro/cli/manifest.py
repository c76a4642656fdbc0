"""``fedrepro track``, ``fedrepro manifest`` and ``fedrepro tune``: a params file's manifest and the steps that
read it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fedrepro.cli.common import EXAMPLES, _absent_or, _existing, _json_arg, _manifest_of, _name, _output, finish


def add_parsers(sub) -> None:
    """track, manifest, tune."""
    add_track(sub)
    add_manifest(sub)
    add_tune(sub)


def add_track(sub) -> None:
    """Reconcile MLflow with the runs' files."""
    p = sub.add_parser(
        "track",
        help="reconcile MLflow with the runs' files, run by run (idempotent; exits 1 "
        "and writes no --out when the store cannot be reached)",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--configfile", nargs="+", type=_existing("file"), help="params file(s), merged in order as snakemake does"
    )
    source.add_argument(
        "--manifest", type=_existing("file"), help="the manifest the workflow wrote (results/manifests/)"
    )
    source.add_argument(
        "--record",
        type=_json_arg,
        help="one run's record as JSON (fedrepro.configure.expansion.run_record: "
        "the workflow's tracking job of one run)",
    )
    p.add_argument("--run", action="append", help="only this run id (repeat for several)")
    p.add_argument("--runs-dir", default="results/runs", type=_absent_or("folder"))
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.add_argument("--out", type=_output("file"), help="write the result here when every run with a summary is tracked")
    p.set_defaults(func=cmd_track)
    finish(p, EXAMPLES["track"])


def cmd_track(args) -> None:
    from fedrepro.tracking import reconcile

    manifest = args.record or _manifest_of(args, "track")
    result = reconcile.track(manifest, args.runs_dir, args.tracking_uri, args.run)
    print(
        f"tracking: {result['registered']} registered, {result['repaired']} repaired, {result['already']} "
        f"already there, {result['missing']} without a summary, {result['failed']} failed ({result['uri']})"
    )
    if result["unwritable"]:  # a full disk or a read-only store: one line, as every command's full disk
        from fedrepro.errors import SetupError

        raise SetupError(result["unwritable"])
    for error in result["errors"]:
        print(f"  {error}", file=sys.stderr)
    if result["failed"]:  # no --out: the step is not done, and Snakemake retries it next time
        raise SystemExit(1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


def add_manifest(sub) -> None:
    """Write a params file's manifest."""
    p = sub.add_parser(
        "manifest",
        help="write the manifest of a params file (its runs per experiment), the "
        "file the track, report and collect steps read",
    )
    p.add_argument(
        "--configfile",
        required=True,
        nargs="+",
        help="params file(s), merged in order as snakemake does; recorded as given",
    )
    p.add_argument(
        "--base",
        default=".",
        type=_existing("folder"),
        help="the folder --configfile paths are relative to (the workflow's, when it runs elsewhere)",
    )
    p.add_argument("--overrides", type=_json_arg, help="Snakemake's --config values as a JSON object, merged last")
    p.add_argument("--command", help="the command to record as how the manifest was made")
    p.add_argument("--out", type=_output("file"), help="default: results/manifests/<name>-<content hash>.json")
    p.add_argument(
        "--check-name",
        action="store_true",
        help="refuse when --out is not the content-addressed name (the workflow's own check)",
    )
    p.add_argument(
        "--experiments",
        nargs="*",
        help="write the slice of these experiments alone (none: of no experiment), a figure's input",
    )
    p.set_defaults(func=cmd_manifest)
    finish(p, EXAMPLES["manifest"])


def cmd_manifest(args) -> None:
    from fedrepro.configure import expansion, paramsfile, schema, settings
    from fedrepro.errors import SetupError

    files = [str(Path(args.base, f)) for f in args.configfile]
    for name in files:  # relative to --base, so checked here rather than by the parser
        try:
            _existing("file")(name)
        except argparse.ArgumentTypeError as err:
            raise SetupError(f"--configfile: {err}") from None
    params = paramsfile.load_params_files(files)
    if args.overrides:  # Snakemake's --config: merged last, as Snakemake does
        params = schema.validate(
            settings.deep_merge(params, args.overrides),
            "params.schema.yaml",
            " ".join(args.configfile) + " with --config",
        )
    manifest = expansion.run_manifest(
        params, args.configfile, args.command or "fedrepro manifest --configfile " + " ".join(args.configfile)
    )
    if args.experiments is not None:
        manifest = expansion.experiment_slice(manifest, args.experiments)
    addressed = Path(
        expansion.slice_path(manifest) if args.experiments is not None else expansion.manifest_path(manifest)
    )
    out = Path(args.out or addressed)
    if args.check_name and out.name != addressed.name:
        raise SystemExit(
            f"fedrepro manifest: the manifest's content hashes to {addressed.name}, not {out.name}: "
            "the workflow and the library read the params differently"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    print(f"manifest: {out}")


def add_tune(sub) -> None:
    """The tuning stage's three actions."""
    p = sub.add_parser(
        "tune",
        help="the tuning stage: pick a tuning's value from its runs (select), or write the "
        "manifest with the final runs the choices give (manifest)",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = actions.add_parser("select", help="rank a tuning's candidates by its criterion on the validation split")
    a.add_argument("--manifest", required=True, type=_existing("file"), help="the manifest the workflow wrote")
    a.add_argument(
        "--tuning", required=True, type=_name("tuning id"), help="the tuning's id (a key of the manifest's tunings)"
    )
    a.add_argument("--runs-dir", default="results/runs", type=_absent_or("folder"), help="the run folders")
    a.add_argument(
        "--out",
        required=True,
        type=_output("file"),
        help="the choice record (JSON): per candidate its values, and the winner",
    )
    a.set_defaults(func=cmd_tune)
    a = actions.add_parser("manifest", help="the manifest with every tuned experiment's final runs")
    a.add_argument("--manifest", required=True, type=_existing("file"), help="the manifest the workflow wrote")
    a.add_argument("--choices", nargs="*", default=[], type=_existing("file"), help="the choice records")
    a.add_argument("--out", required=True, type=_output("file"), help="the tuned manifest")
    a.set_defaults(func=cmd_tune)
    a = actions.add_parser("final", help="the tuned manifest again, once every final run it lists has finished")
    a.add_argument("--manifest", required=True, type=_existing("file"), help="the tuned manifest")
    a.add_argument("--runs-dir", default="results/runs", type=_absent_or("folder"), help="the run folders")
    a.add_argument(
        "--out", required=True, type=_output("file"), help="the manifest the report, tracking and collect steps read"
    )
    a.set_defaults(func=cmd_tune)
    finish(p, EXAMPLES["tune"])  # its actions take neither --debug nor an example


def cmd_tune(args) -> None:
    from fedrepro.configure import tuning

    manifest = json.loads(Path(args.manifest).read_text())
    if args.action == "select":
        try:
            choice = tuning.select(manifest, args.tuning, args.runs_dir)
        except tuning.TuningError as err:
            raise SystemExit(f"fedrepro tune select: {args.tuning}: {err}")
        result = choice
        print(
            f"tuning {args.tuning}: {choice['chosen_label']} ({choice['criterion']} "
            f"{choice['candidates'][choice['chosen_index']]['value']:.4f})"
        )
    elif args.action == "final":
        from fedrepro.run.rundir import RunDir

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
        print(
            f"tuned manifest: {sum('tuned' in r for e in result['experiments'].values() for r in e['runs'])} "
            f"final runs of {len(choices)} tuning(s)"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True))
