"""`snakemake --lint` on the workflow, failing on any warning the Snakefile does not explain.

The Snakefile lists the warnings left on purpose, each with its reason (the comment above its includes); this
runs the linter on the quick default and on every paper's params file, and exits 1 naming any other warning.

    python scripts/lint_workflow.py            (make lint; .ci/run)
"""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the titles of the warnings the Snakefile explains; a variable or param named in the title must be one it names
EXPLAINED = [
    re.compile(
        r"Shell command directly uses variable (FEDREPRO|TRACK_LIVE|MIRRORS|DATA_ROOT) from outside of the rule"
    ),
    re.compile(r"Param (data_root|paper_figures) is a prefix of input or output file but hardcoded"),
    re.compile(r"Mixed rules and functions in same snakefile\."),
]
MIXED_FILES = {"train.smk", "tune.smk"}  # the files whose input functions stay beside their rules
TITLE = re.compile(r"^\s+\* (.+?):?$")
HEADER = re.compile(r"^Lints for (?:snakefile|rule \w+ \(line \d+,) ?(\S+?)\)?:$")


def unexplained(output: str) -> list[str]:
    """The warnings in ``snakemake --lint`` output that the Snakefile does not explain, with where they are."""
    where, out = "", []
    for line in output.splitlines():
        header = HEADER.match(line)
        if header:
            where = line.rstrip(":")
            continue
        title = TITLE.match(line)
        if not title:
            continue
        text = title[1]
        if not any(p.fullmatch(text) for p in EXPLAINED):
            out.append(f"{where}: {text}")
        elif text.startswith("Mixed rules") and Path(where.split()[-1]).name not in MIXED_FILES:
            out.append(f"{where}: {text}")
    return out


def lint(config: Path) -> tuple[int, str]:
    """`snakemake --lint` of the workflow with one params file: its exit status and output."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--lint",
            "--snakefile",
            str(ROOT / "Snakefile"),
            "--configfile",
            str(config),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return proc.returncode, proc.stdout + proc.stderr


def main() -> int:
    configs = [ROOT / "params" / "default.yaml", *sorted((ROOT / "params").glob("*.yaml"))]
    configs = [c for c in dict.fromkeys(configs) if c.name != "paper_results.yaml"]
    # one linter process per params file, two at a time: each spends most of its time importing Snakemake
    with ThreadPoolExecutor(max_workers=2) as pool:
        outputs = list(pool.map(lint, configs))
    failed = False
    for config, (returncode, text) in zip(configs, outputs):
        if "Lints for" not in text and returncode != 0:
            print(f"{config.name}: snakemake --lint failed:\n{text[-3000:]}", file=sys.stderr)
            failed = True
            continue
        left = unexplained(text)
        for warning in left:
            print(f"{config.name}: unexplained lint warning: {warning}", file=sys.stderr)
        failed |= bool(left)
        print(
            f"{config.name}: {'unexplained warnings' if left else 'every lint warning is explained in the Snakefile'}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
