"""The ``fedrepro`` command: every step a Snakemake rule runs, each with --help."""

from __future__ import annotations

import argparse
import errno

from fedrepro.cli import data, evidence, grid, manifest, ops, reports, run
from fedrepro.cli.common import (  # noqa: F401 (the names callers import from fedrepro.cli)
    DEBUG_HELP,
    DEBUG_VARIABLE,
    EXAMPLES,
    Parser,
    _debugging,
    _existing,
    _json_arg,
    _number,
)
from fedrepro.cli.run import RUN_FOLDER, _check_run_folder  # noqa: F401

# One module per command group, each command's arguments beside its handler; in this order in --help.
GROUPS = (data, run, grid, manifest, reports, ops, evidence)


def build_parser() -> argparse.ArgumentParser:
    from fedrepro import __version__

    parser = Parser(prog="fedrepro", description=__doc__)
    parser.add_argument("--version", action="version", version=f"fedrepro {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_parsers(sub)
    return parser


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
    except OSError as err:
        # a full disk or a results folder that turned unwritable mid-run: the files fedrepro writes are
        # written to a temporary name and renamed (checkpoints, summaries), so the last complete one stands
        if err.errno not in UNWRITABLE or _debugging(args):
            raise
        # a failed write() names no file: the command's output then stands for it (a run's folder)
        where = err.filename or getattr(args, "out", None) or "its output"
        parser.exit(
            2,
            f"fedrepro {args.command}: cannot write {where}: {err.strerror}; free space there or make "
            f"it writable, then run the same command again (a training run resumes from its last "
            f"checkpoint)\n",
        )


# What a write meets when the disk or the folder stops taking files, as against a fault of fedrepro's
UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG})
