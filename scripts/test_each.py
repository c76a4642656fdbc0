"""Run every test file alone, each in its own pytest process, a few at a time: a file that passes only after
another file imported a module, seeded a generator or set a global fails here.

    python scripts/test_each.py [--workers N] [FILE ...] [-- PYTEST_ARGS ...]

Without files: every tests/test_*.py, the end-to-end ones first. Prints one line per file (result, seconds),
the output of each failing file, and exits non-zero when any failed. `make test-each` and CI (.ci/run) run it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_one(path: str, extra: list[str]) -> tuple[str, int, float, str]:
    start = time.monotonic()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", path, *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return path, proc.returncode, time.monotonic() - start, proc.stdout


def expected_length(path: str) -> tuple[int, int]:
    """Longest first, so the last file to finish is a short one: the files with end-to-end tests (marked slow
    or slurm: minutes each) before the rest, larger files first within each group."""
    text = (ROOT / path).read_text()
    return sum(text.count(f"pytest.mark.{mark}") for mark in ("slow", "slurm")), len(text)


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="files run at once (default 2)")
    parser.add_argument("files", nargs="*", help="test files (default: every tests/test_*.py)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: at least 1")
    files = args.files or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))
    missing = [f for f in files if not (ROOT / f).is_file()]
    if missing:
        parser.error(f"no such test file: {', '.join(missing)}")
    failed = []
    files = sorted(files, key=expected_length, reverse=True)
    with ThreadPoolExecutor(args.workers) as pool:
        # pytest exits 5 when a file collects no test (every test deselected by -m): not a failure
        for path, code, seconds, output in pool.map(lambda f: run_one(f, extra), files):
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
