"""Run every test file alone, each in its own pytest process, a few at a time: a file that passes only after
another file imported a module, seeded a generator or set a global fails here.

    python scripts/test_each.py [--workers N] [--fresh] [FILE ...] [-- PYTEST_ARGS ...]

Without files: every tests/**/test_*.py, the end-to-end ones first. Prints one line per file (result, seconds),
the output of each failing file, and exits non-zero when any failed. `make test-each` and CI (.ci/run) run it.

Each file's process is forked from this one after it has imported the heavy third-party libraries the tests
use (torch and torchvision, which brings torch._dynamo, MLflow, pandas, seaborn: about 10 s of CPU a process).
fedrepro and the tests' own modules are never imported here, and nothing is run or seeded: a forked file
starts as a fresh interpreter would once those imports are done. `--fresh` starts a new interpreter per file
instead.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# third-party only: importing a fedrepro module here would hide a file's missing import of it
WARM_IMPORTS = (
    "numpy",
    "torch",
    "torchvision",
    "pandas",
    "scipy.stats",
    "matplotlib",
    "seaborn",
    "mlflow",
    "yaml",
    "jsonschema",
    "pytest",
)
PYTEST_ARGS = ["-q", "-rs", "-p", "no:cacheprovider"]


def expected_length(path: str) -> tuple[int, int]:
    """Longest first, so the last file to finish is a short one: the files with end-to-end tests (marked slow
    or slurm: minutes each) before the rest, larger files first within each group."""
    text = (ROOT / path).read_text()
    return sum(text.count(f"pytest.mark.{mark}") for mark in ("slow", "slurm")), len(text)


def start_fresh(path: str, extra: list[str], log) -> int:
    """A new interpreter for the file; returns its pid."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", *PYTEST_ARGS, path, *extra], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
    )
    return proc.pid


def _die_with_parent() -> None:
    """SIGTERM when the runner dies (Linux's PR_SET_PDEATHSIG), so a killed `make test` leaves no file running."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the file runs on to its end
        pass


def start_forked(path: str, extra: list[str], log) -> int:
    """A fork of this process that runs pytest on the file; returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 70  # EX_SOFTWARE, if pytest itself raises
    try:
        _die_with_parent()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        import pytest

        code = int(pytest.main([*PYTEST_ARGS, path, *extra]))
    except BaseException as error:  # the child must never return into the parent's loop
        print(f"test_each: {path}: {error!r}", file=sys.stderr)
    finally:
        try:
            atexit._run_exitfuncs()  # what the interpreter would run at exit (MLflow, logging, temp files)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def run_all(files: list[str], extra: list[str], workers: int, fresh: bool):
    """Every file, ``workers`` at a time, in the order given; (path, exit code, seconds, output) as each ends."""
    start = start_fresh if fresh else start_forked
    pending, running = list(files), {}
    while pending or running:
        while pending and len(running) < workers:
            path = pending.pop(0)
            # an unnamed file, not a TemporaryDirectory: a child runs the exit handlers it inherits, and a
            # temporary directory's finalizer among them would delete the folder under the other files
            log = tempfile.TemporaryFile("w+")
            running[start(path, extra, log)] = (path, log, time.monotonic())
        pid, status = os.wait()
        if pid not in running:
            continue
        path, log, began = running.pop(pid)
        log.seek(0)
        yield path, os.waitstatus_to_exitcode(status), time.monotonic() - began, log.read()
        log.close()


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="files run at once (default 2)")
    parser.add_argument("--fresh", action="store_true", help="a new interpreter per file instead of a fork")
    parser.add_argument("files", nargs="*", help="test files (default: every tests/**/test_*.py)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: at least 1")
    files = args.files or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py"))
    missing = [f for f in files if not (ROOT / f).is_file()]
    if missing:
        parser.error(f"no such test file: {', '.join(missing)}")
    os.chdir(ROOT)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: it reads it once
    if not args.fresh:
        for name in WARM_IMPORTS:
            importlib.import_module(name)
    failed = []
    files = sorted(files, key=expected_length, reverse=True)
    # pytest exits 5 when a file collects no test (every test deselected by -m): not a failure
    for path, code, seconds, output in run_all(files, extra, args.workers, args.fresh):
        ok = code in (0, 5)
        print(f"{'ok  ' if ok else 'FAIL'} {path} ({seconds:.0f} s)", flush=True)
        if not ok:
            failed.append((path, output))
    for path, output in failed:
        print(f"\n===== {path} (alone) =====\n{output[-20000:]}")
    if failed:
        print(f"\n{len(failed)} of {len(files)} test files fail alone: {' '.join(p for p, _ in failed)}")
        return 1
    print(f"\nevery one of {len(files)} test files passes alone")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
