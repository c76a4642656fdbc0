"""``fedrepro report``, ``tables``, ``figures``, ``index`` and ``collect``: what reads the runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fedrepro.cli.common import (
    EXAMPLES,
    _absent_or,
    _existing,
    _json_arg,
    _manifest_of,
    _name,
    _number,
    _output,
    finish,
)


def add_parsers(sub) -> None:
    """report, tables, figures, index, collect."""
    add_report(sub)
    add_tables(sub)
    add_figures(sub)
    add_index(sub)
    add_collect(sub)


def add_report(sub) -> None:
    """The HTML report page."""
    p = sub.add_parser("report", help="build the self-contained HTML report (also of a partial grid)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--manifest", type=_existing("file"), help="the manifest the workflow wrote (results/manifests/)"
    )
    source.add_argument(
        "--configfile",
        nargs="+",
        type=_existing("file"),
        help="params file(s), merged in order as snakemake does; "
        "reports whatever runs exist now and lists the missing ones",
    )
    p.add_argument("--runs-dir", default="results/runs", type=_absent_or("folder"), help="the run folders")
    p.add_argument(
        "--partitions-dir", default="results/partitions", type=_absent_or("folder"), help="the partition folders"
    )
    p.add_argument("--out", required=True, type=_output("file"), help="the report page")
    p.add_argument("--figures", type=_output("folder"), help="also write its figures as PNG files into this folder")
    p.add_argument(
        "--paper-figures",
        type=_absent_or("folder"),
        help="embed the papers' analysis figures (fedrepro figures) of this folder",
    )
    p.set_defaults(func=cmd_report)
    finish(p, EXAMPLES["report"])


def cmd_report(args) -> None:
    from fedrepro.configure import expansion, paramsfile
    from fedrepro.report import page

    manifest = args.manifest
    if manifest is None:  # straight from the params files: a partial grid, while runs are missing
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        manifest = Path(args.out).with_suffix(".manifest.json")
        from fedrepro.configure import tuning

        content = expansion.run_manifest(
            paramsfile.load_params_files(args.configfile),
            args.configfile,
            "fedrepro report --configfile " + " ".join(args.configfile),
        )
        if content.get("tunings"):  # the final runs of the tunings that chose already; the others are missing
            content = tuning.tuned_manifest(
                content, tuning.choices_on_disk(content, Path(args.runs_dir).parent / "tuning")
            )
        manifest.write_text(json.dumps(content))
    out = page.build(manifest, args.runs_dir, args.partitions_dir, args.out, args.figures, args.paper_figures)
    print(f"report: {Path(out).resolve()}")


def add_tables(sub) -> None:
    """The paper-vs-ours tables."""
    p = sub.add_parser(
        "tables",
        help="print the paper-vs-ours tables (as the report page shows them) as LaTeX (booktabs), CSV or Markdown",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--configfile",
        nargs="+",
        type=_existing("file"),
        help="params file(s), merged in order as snakemake does (also of a partial grid)",
    )
    source.add_argument(
        "--manifest", type=_existing("file"), help="the manifest the workflow wrote (results/manifests/)"
    )
    p.add_argument("--format", choices=["latex", "csv", "md"], default="latex")
    p.add_argument(
        "--table", action="append", help="only this paper table (repeat for several; default: all of the params file's)"
    )
    p.add_argument("--runs-dir", default="results/runs", type=_absent_or("folder"), help="the run folders")
    p.set_defaults(func=cmd_tables)
    finish(p, EXAMPLES["tables"])


def cmd_tables(args) -> None:
    from fedrepro.configure import schema
    from fedrepro.report import page, tables

    manifest = _manifest_of(args, "tables")
    comparisons = page.paper_comparisons(manifest, Path(args.runs_dir))
    if args.table:
        unknown = sorted(set(args.table) - {c["name"] for c in comparisons})
        if unknown:
            raise schema.ConfigError(
                f"--table {', '.join(unknown)}: not a paper table of this params file; its "
                f"tables: {', '.join(c['name'] for c in comparisons) or 'none'}"
            )
        comparisons = [c for c in comparisons if c["name"] in args.table]
    sys.stdout.write(tables.render(comparisons, args.format))


def add_figures(sub) -> None:
    """One of the papers' analysis figures."""
    p = sub.add_parser("figures", help="draw one of the papers' analysis figures from runs (docs/figures.md)")
    p.add_argument(
        "--name",
        required=True,
        type=_name("figure name"),
        help="the figure's name in the params file's figures section",
    )
    p.add_argument("--spec", required=True, help="the figure's spec as JSON (or a JSON file)")
    p.add_argument(
        "--manifest", type=_existing("file"), help="the manifest the workflow wrote (not needed for pure-math figures)"
    )
    p.add_argument("--runs-dir", default="results/runs", type=_absent_or("folder"))
    p.add_argument(
        "--data-root",
        type=_absent_or("folder"),
        help="the params file's data root (landscapes and interpolations evaluate models)",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--threads", type=_number(int, 0), default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", required=True, type=_output("file"), help="the PNG; its caption goes beside it as .json")
    p.set_defaults(func=cmd_figures)
    finish(p, EXAMPLES["figures"])


def cmd_figures(args) -> None:
    from fedrepro import records
    from fedrepro.report import figures

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    manifest = records.read_json(args.manifest) if args.manifest else None
    spec = figures.check({args.name: _json_arg(args.spec)}, (manifest or {}).get("experiments", {}))[args.name]
    context = figures.Context(
        Path(args.data_root) if args.data_root else None, args.device, bool((manifest or {}).get("quick"))
    )
    record = figures.draw(args.name, spec, manifest, args.runs_dir, args.out, context)
    print(f"figure {args.name}: {'drawn' if record['drawn'] else 'not drawn: ' + record['reason']} -> {args.out}")


def add_index(sub) -> None:
    """The index page."""
    p = sub.add_parser("index", help="the index page: every experiment of every params file and its state")
    p.add_argument("--out", default="reports/index.html", type=_output("file"))
    p.add_argument(
        "--params",
        nargs="+",
        type=_existing("file"),
        help="params files to survey (default: params/*.yaml of the project)",
    )
    p.add_argument("--runs-dir", default="results/runs", type=_absent_or("folder"), help="the run folders")
    p.add_argument(
        "--evidence",
        type=_existing("folder"),
        help="the evidence folders whose verified results open the page (default: the project's evidence/)",
    )
    p.add_argument("--no-evidence", action="store_true", help="leave the verified results out")
    p.set_defaults(func=cmd_index)
    finish(p, EXAMPLES["index"])


def cmd_index(args) -> None:
    from fedrepro.configure.paramsfile import ROOT
    from fedrepro.report import index

    evidence = None if args.no_evidence else (args.evidence or ROOT / "evidence")
    out = index.build(args.out, args.params, args.runs_dir, evidence=evidence)
    print(f"index: {Path(out).resolve()}")


def add_collect(sub) -> None:
    """Metrics and curves for dvc."""
    p = sub.add_parser(
        "collect", help="per experiment and variant: summary metrics (JSON) and mean curves (CSV) for dvc metrics/plots"
    )
    p.add_argument("--manifest", required=True, type=_existing("file"), help="the manifest the workflow wrote")
    p.add_argument("--runs-dir", default="results/runs", type=_absent_or("folder"), help="the run folders")
    p.add_argument(
        "--metrics",
        required=True,
        type=_output("folder"),
        help="folder: <experiment>/<variant>.json, mean final accuracy etc.",
    )
    p.add_argument(
        "--curves",
        required=True,
        type=_output("folder"),
        help="folder: <experiment>/<variant>.csv, per round the mean over seeds",
    )
    p.set_defaults(func=cmd_collect)
    finish(p, EXAMPLES["collect"])


def cmd_collect(args) -> None:
    from fedrepro.report import frames

    frames.collect(args.manifest, args.runs_dir, args.metrics, args.curves)
    print(f"collect: {args.metrics}, {args.curves}")
