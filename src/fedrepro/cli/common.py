"""What the command groups share: argument types, each sub-command's example, the --debug switch."""

from __future__ import annotations

import argparse
import json
import math
import os
import stat
import tempfile
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


def _file_type(mode: int) -> str:
    """What a path is, in the words of the refusals."""
    for test, name in (
        (stat.S_ISREG, "a file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a pipe"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _existing(kind: str):
    """An argparse type: a path that exists now, is a regular ``file`` (not a device, a pipe or a folder) or a
    ``folder``, and can be read."""

    def parse(text: str) -> str:
        try:
            mode = os.stat(text).st_mode
        except (FileNotFoundError, NotADirectoryError):
            raise argparse.ArgumentTypeError(f"no such {kind}: {text}") from None
        except OSError as err:
            raise argparse.ArgumentTypeError(f"{text}: cannot be read ({err.strerror})") from None
        wanted = stat.S_ISREG(mode) if kind == "file" else stat.S_ISDIR(mode)
        if not wanted:
            raise argparse.ArgumentTypeError(
                f"{text} is {_file_type(mode)}; a {'regular file' if kind == 'file' else kind} is expected"
            )
        if not os.access(text, os.R_OK if kind == "file" else os.R_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"{text}: cannot be read (permission denied)")
        return text

    return parse


def _absent_or(kind: str):
    """An argparse type: a ``file`` or ``folder`` that may not exist yet (it is then made, or treated as
    empty), but that is not something else."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"an empty path; a {kind} is expected")
        return _existing(kind)(text) if os.path.lexists(text) else text

    return parse


# Pseudo file systems: a path inside them may look writable to root but takes no files.
PSEUDO_FILE_SYSTEMS = (Path("/proc"), Path("/sys"))


def _output(kind: str):
    """An argparse type: where a command writes a ``file`` or a ``folder``. Checked before any work, so a bad
    path costs no half-written result: not a folder where a file goes (or the reverse), not inside /proc or
    /sys, and its nearest existing folder takes a new file (one is created there and removed at once)."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"an empty path; the {kind} to write is expected")
        path = Path(text)
        if os.path.lexists(path):
            _existing(kind)(text)  # the right kind, and readable
            if kind == "file" and not os.access(path, os.W_OK):
                raise argparse.ArgumentTypeError(f"{text}: cannot be written (permission denied)")
        resolved = path.resolve()
        for root in PSEUDO_FILE_SYSTEMS:
            if resolved == root or root in resolved.parents:
                raise argparse.ArgumentTypeError(
                    f"{text} lies inside {root}, a pseudo file system; choose a path on a disk"
                )
        folder = resolved if kind == "folder" and resolved.is_dir() else resolved.parent
        while not folder.exists():
            folder = folder.parent
        if not folder.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: {folder} is a file, so no {kind} can be made below it")
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as err:
            raise argparse.ArgumentTypeError(f"{text}: cannot write in {folder} ({err.strerror})") from None
        return text

    return parse


def _name(what: str):
    """An argparse type: a name that becomes a file or folder name, by the project's naming rule (letters,
    digits, ``_ . + -``, as experiments, params files and runs are named)."""

    def parse(text: str) -> str:
        from fedrepro.configure.paramsfile import check_name
        from fedrepro.configure.schema import ConfigError

        try:
            return check_name(text, what)
        except ConfigError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


class Parser(argparse.ArgumentParser):
    """A usage error is one line: the command, the argument and what it allows (``--help`` shows the rest)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


# One worked example per sub-command, shown at the end of its --help.
EXAMPLES = {
    "download": "fedrepro download --dataset fmnist --root data/fmnist --mirror /usr/share/datasets/fashion-mnist/",
    "partition": 'fedrepro partition --setting \'{"dataset": "fmnist", "kind": "dirichlet", "alpha": 0.1, '
    '"num_clients": 20, "seed": 1}\' --data-root data/fmnist --out results/partitions/p1',
    "train": 'fedrepro train --setting \'{"dataset": "fmnist", "model": "mlp", "rounds": 5, "num_clients": 20}\' '
    "--partition results/partitions/p1 --data-root data/fmnist --out results/runs/r1",
    "fork": 'fedrepro fork --setting \'{"dataset": "fmnist", "model": "mlp", "rounds": 5, "num_clients": 20}\' '
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
    "bench-table": "fedrepro bench-table --configfile params/ima.yaml --only ima_table1_fmnist --seconds 180",
    "check-gpu": "fedrepro check-gpu --out results/bench/gpu_check.json --throughput 2 4 8",
    "tables": "fedrepro tables --configfile params/fedlaw.yaml "
    "params/subsets/fedlaw_table3_fmnist_mlp_dir0.1_seed8.yaml --format latex",
    "figures": 'fedrepro figures --name quadratic --spec \'{"kind": "quadratic"}\' '
    "--out reports/default_figures/quadratic.png",
    "evidence": "fedrepro evidence keep --configfile params/fedlaw.yaml "
    "params/subsets/fedlaw_table3_fmnist_mlp_dir0.1_seed8.yaml --name fedlaw_table3_fmnist_mlp_dir0.1_seed8\n"
    "  fedrepro evidence report evidence/fedlaw_table3_fmnist_mlp_dir0.1_seed8 --out reports/fedlaw_evidence.html\n"
    "  fedrepro evidence matrix --write-readme\n"
    "  fedrepro evidence compare evidence/fednova_fig5_synthetic --configfile params/fednova.yaml "
    "params/subsets/verify_fednova_fig5_synthetic.yaml\n"
    "  fedrepro evidence collapses evidence/fedlaw_table3_fmnist_mlp --write",
}


DEBUG_VARIABLE = "FEDREPRO_DEBUG"
DEBUG_HELP = f"on an error fedrepro raises on purpose, show the traceback too (or set {DEBUG_VARIABLE}=1)"


def _debugging(args) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


def finish(p: argparse.ArgumentParser, example: str) -> None:
    """The last touch on a sub-command's parser: --debug (also accepted after the sub-command), and its
    example at the end of its --help."""
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    p.epilog = "example:\n  " + example
    p.formatter_class = argparse.RawDescriptionHelpFormatter


def _manifest_of(args, command: str) -> dict:
    """The manifest a command reads: --manifest as written, or the one of --configfile's params files."""
    from fedrepro import records
    from fedrepro.configure import expansion, paramsfile

    if args.manifest:
        return records.read_json(args.manifest)
    return expansion.run_manifest(
        paramsfile.load_params_files(args.configfile),
        args.configfile,
        f"fedrepro {command} --configfile " + " ".join(args.configfile),
    )
