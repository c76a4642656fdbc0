"""``fedrepro evidence``: keep finished runs' compact records, and what is read from them (a report page, the
verification matrix, a comparison with a rerun, the collapses)."""

from __future__ import annotations

import sys
from pathlib import Path

from fedrepro.cli.common import EXAMPLES, _absent_or, _existing, _name, _number, _output, finish

# each action's line of the example
_EXAMPLE = dict(
    zip(
        ["keep", "report", "matrix", "compare", "collapses"],
        (line.strip() for line in EXAMPLES["evidence"].splitlines()),
    )
)


def add_parsers(sub) -> None:
    """evidence keep, matrix, report, compare, collapses."""
    p = sub.add_parser("evidence", help="keep finished runs' compact records in evidence/, or rebuild a page from them")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = actions.add_parser(
        "keep",
        help="copy summary.json, metrics.csv, partitions' records and the manifest of a "
        "params file's finished runs into evidence/NAME (no models, no checkpoints)",
    )
    which = a.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--configfile",
        nargs="+",
        type=_existing("file"),
        help="params file(s), merged in order as snakemake does (e.g. a paper's file and a subset)",
    )
    which.add_argument(
        "--manifest",
        type=_existing("file"),
        help="a manifest the workflow wrote when the runs ran (results/manifests/): keeps the runs it "
        "names, also when they ran with an earlier commit of the code",
    )
    a.add_argument("--name", required=True, type=_name("evidence folder name"), help="the folder's name under --root")
    a.add_argument("--runs-dir", default="results/runs", type=_absent_or("folder"), help="the run folders")
    a.add_argument(
        "--partitions-dir", default="results/partitions", type=_absent_or("folder"), help="the partition folders"
    )
    a.add_argument("--root", default="evidence", type=_output("folder"), help="where evidence folders live")
    a.add_argument(
        "--carry",
        nargs="+",
        type=_existing("folder"),
        metavar="FOLDER",
        help="earlier evidence folders: a declared run not finished in --runs-dir takes the records of an "
        "equal run kept there (same setting under today's code, same partition content), under its own id",
    )
    a.add_argument(
        "--protocol",
        help="the runs' protocol: paper (they enter the verification matrix), official, "
        "or another word (default: official when an *_official_protocol subset is given, else paper)",
    )
    a.set_defaults(func=cmd_evidence)
    finish(a, _EXAMPLE["keep"])
    a = actions.add_parser(
        "matrix",
        help="the verification matrix: the papers' cells that the paper-protocol "
        "evidence reproduces, per table (Markdown)",
    )
    a.add_argument("--root", default="evidence", type=_absent_or("folder"), help="where evidence folders live")
    a.add_argument(
        "--write-readme",
        action="store_true",
        help="rewrite the matrix in docs/verification.md and its summary in README.md",
    )
    a.set_defaults(func=cmd_evidence)
    finish(a, _EXAMPLE["matrix"])
    a = actions.add_parser("report", help="rebuild the report page of an evidence folder from that folder alone")
    a.add_argument("folder", type=_existing("folder"), help="an evidence folder (made by `fedrepro evidence keep`)")
    a.add_argument("--out", required=True, type=_output("file"), help="the report page")
    a.add_argument("--figures", type=_output("folder"), help="also write its figures as PNG files into this folder")
    a.set_defaults(func=cmd_evidence)
    finish(a, _EXAMPLE["report"])
    a = actions.add_parser(
        "compare",
        help="does a rerun confirm the kept records? each kept run against today's run "
        "of equal setting and partition, every round and metric",
    )
    a.add_argument("folder", type=_existing("folder"), help="an evidence folder (made by `fedrepro evidence keep`)")
    a.add_argument(
        "--configfile",
        nargs="+",
        required=True,
        type=_existing("file"),
        help="the params file(s) that declare the rerun, merged in order as snakemake does",
    )
    a.add_argument("--runs-dir", default="results/runs", type=_absent_or("folder"), help="the rerun's run folders")
    a.add_argument(
        "--partitions-dir",
        default="results/partitions",
        type=_absent_or("folder"),
        help="the rerun's partition folders",
    )
    a.add_argument(
        "--tolerance",
        type=_number(float, 0),
        default=0.0,
        help="largest |difference| of any metric in any round that still confirms (default 0: bit for "
        "bit, what the same machine gives; another CPU or a GPU may differ in the last bits)",
    )
    a.set_defaults(func=cmd_evidence)
    finish(a, _EXAMPLE["compare"])
    a = actions.add_parser(
        "collapses",
        help="the kept runs that collapsed (test accuracy more than 20 points below "
        "its best so far, or to chance), from their metrics.csv; --write records each run's "
        "record in its kept summary.json",
    )
    a.add_argument("folder", nargs="+", type=_existing("folder"), help="evidence folders")
    a.add_argument("--write", action="store_true", help="write the record (key collapse) into each kept summary.json")
    a.set_defaults(func=cmd_evidence)
    finish(a, _EXAMPLE["collapses"])
    finish(p, EXAMPLES["evidence"])


def cmd_evidence(args) -> None:
    from fedrepro.report import evidence

    if args.action == "matrix":
        from fedrepro.report import matrix_text, verification

        rows = verification.matrix(args.root)
        block = matrix_text.markdown(rows)
        if args.write_readme:
            matrix_text.write_readme(block)
            matrix_text.write_block(
                matrix_text.README, matrix_text.glance(rows), matrix_text.GLANCE_START, matrix_text.GLANCE_END
            )
            print("docs/verification.md: verification matrix rewritten; README.md: its summary rewritten")
        else:
            print(block, end="")
        return
    if args.action == "collapses":
        from fedrepro.report import collapses

        for folder in args.folder:
            rows = (
                evidence.record_collapses(folder)
                if args.write
                else [
                    {"run": r.name, "record": collapses.of_run(*_kept_run(r))}
                    for r in sorted(Path(folder, "runs").glob("*"))
                ]
            )
            for row in rows:
                if row["record"] and row["record"]["collapsed"]:
                    print(f"{folder}: {row['run']}: {collapses.describe(row['record'], limit=None)}")
        return
    if args.action == "compare":
        raise SystemExit(
            _print_comparison(
                evidence.compare(args.folder, args.configfile, args.runs_dir, args.partitions_dir),
                args.folder,
                args.tolerance,
            )
        )
    if args.action == "keep":
        kept = evidence.keep(
            args.configfile,
            args.name,
            args.runs_dir,
            args.partitions_dir,
            args.root,
            args.manifest,
            args.protocol,
            args.carry,
        )
        carried = f" ({kept['carried']} carried from earlier evidence)" if kept["carried"] else ""
        if kept["unchanged"]:
            print(f"evidence: {kept['folder']} unchanged: it already holds these {kept['runs']} runs' records")
        else:
            print(
                f"evidence: {kept['runs']} runs{carried} and {kept['partitions']} partitions kept in {kept['folder']} "
                f"({kept['bytes'] / 1024:.0f} KB)"
            )
    else:
        out = evidence.report(args.folder, args.out, args.figures)
        print(f"report: {Path(out).resolve()}")


def _kept_run(run: Path) -> tuple[dict, object]:
    import pandas as pd

    from fedrepro import records

    metrics = run / "metrics.csv"
    return records.read_json(run / "summary.json"), pd.read_csv(metrics) if metrics.is_file() else None


def _print_comparison(rows: list[dict], folder: str, tolerance: float) -> int:
    """A line per kept run and a verdict; the exit status: 1 when a rerun differs by more than ``tolerance``."""
    acc = lambda a: "—" if a is None else f"{100 * a:.2f}"
    kernels = lambda k: k or "not recorded"
    for r in rows:
        if r["state"] == "compared":
            where = "bit for bit" if r["max_abs_diff"] == 0 else f"max |Δ| {r['max_abs_diff']:.3g} ({r['column']})"
            rounds = f"{r['rounds']} rounds" + ("" if r["same_rounds"] else ", not the same rounds")
            print(
                f"{r['kept']}  ->  {r['rerun']}: {where}, {rounds}; final acc {acc(r['kept_final_acc'])} -> "
                f"{acc(r['rerun_final_acc'])}; CPU kernels {kernels(r['kept_cpu_kernels'])} -> "
                f"{kernels(r['rerun_cpu_kernels'])}"
            )
        else:
            print(f"{r['kept']}: {r['state']}" + (f" ({r['rerun']})" if r["rerun"] else ""))
    compared = [r for r in rows if r["state"] == "compared"]
    differ = [r for r in compared if r["max_abs_diff"] > tolerance or not r["same_rounds"]]
    exact = sum(r["max_abs_diff"] == 0 and r["same_rounds"] for r in compared)
    print(
        f"{folder}: {len(compared)} of {len(rows)} kept runs rerun; {exact} bit for bit, "
        f"{len(differ)} beyond the tolerance {tolerance:g}"
    )
    if any(r["max_abs_diff"] and r["kept_cpu_kernels"] != r["rerun_cpu_kernels"] for r in compared):
        print(
            "runs whose CPU kernels differ (or were not recorded) move in float32's last bits: judge them by the "
            "cell's spread over seeds, not bit for bit (docs/verification.md: Checking a kept run by rerunning it)"
        )
    if not compared:
        print("nothing compared: rerun the params files' runs first (snakemake --configfile ...)", file=sys.stderr)
        return 2
    return 1 if differ else 0
