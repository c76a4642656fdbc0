"""``python -m fedrepro.parity PAPER --checkout PATH``: run every check the harness has for one paper's code and
write its record (evidence/official_code/parity/<paper>.json); ``--matrix`` rewrites docs/parity.md's matrix from
the records instead; ``python -m fedrepro.parity ima-fmnist ...`` runs the IMA code at full scale on Table 1's
FMNIST #C=2 cell (``parity.ima_fullscale_record``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedrepro.parity import matrix, records

PAPERS = ("fedaware", "fedlaw", "ima", "fednova")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ima-fmnist"]:  # the IMA code at full scale on FMNIST (parity.ima_fullscale_record)
        from fedrepro.parity import ima_fullscale_record

        return ima_fullscale_record.main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m fedrepro.parity", description=__doc__)
    p.add_argument("paper", nargs="?", choices=PAPERS)
    p.add_argument("--checkout", help="path of a checkout of the paper's official repository (read only)")
    p.add_argument("--out", default=str(records.FOLDER), help="folder of the records (default: %(default)s)")
    p.add_argument("--inits", type=int, default=3, help="fresh models a side in the initialisation test")
    p.add_argument(
        "--checks",
        default="",
        help="comma-separated checks to run (models, pipeline, partitions, clients, servers, rounds), kept beside "
        "the record's others",
    )
    p.add_argument("--matrix", action="store_true", help="rewrite docs/parity.md's matrix from the records")
    args = p.parse_args(argv)
    if args.matrix:
        matrix.write(Path(args.out), matrix.PAGE)
        return
    if not args.paper or not args.checkout:
        p.error("give PAPER and --checkout PATH (or --matrix)")
    if not Path(args.checkout).is_dir():
        p.error(f"--checkout {args.checkout}: no such folder")
    only = tuple(c for c in args.checks.split(",") if c)
    try:
        path = records.run(args.paper, args.checkout, Path(args.out), args.inits, sys.argv, only)
    except ValueError as err:
        p.error(str(err))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
