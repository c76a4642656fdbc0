"""Mutation testing (mutmut) of the modules that hold the papers' mathematics, one module at a time, each
against the fast in-process tests that cover it (the golden-id test never: it fails on any edit, right or
wrong, so it would kill every mutant and say nothing).

    python scripts/mutants.py                  # list the modules and their tests
    python scripts/mutants.py server_optim ... # run those modules (one mutmut worker, niced)
    python scripts/mutants.py all              # every module (well under three hours on 2 cores)

Each module runs in its own folder, build/mutants/<module>/: a generated pyproject.toml with its
[tool.mutmut] section and links to src/, tests/ and params/, so mutmut's copy (mutants/) and its cached
results are the module's own and a rerun only tests what changed. The last lines of each run are its
counts (killed, survived, no tests, timeouts); `mutmut results` and `mutmut show <name>` in that folder list
and show the survivors. docs/testing.md records the scores and every survivor's triage. `make mutants` runs
this script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "mutants"
PYTEST_ARGS = ["-p", "no:randomly", "-p", "no:cacheprovider", "-m", "not slow and not slurm and not gpu"]

# module: (the files mutated, the test files under tests/ that cover them, then any pytest options)
ALG = "src/fedrepro/algorithms/"
MODULES: dict[str, tuple[list[str], list[str]]] = {
    "server_optim": (
        ["src/fedrepro/server_optim.py"],
        ["algorithms/test_oracles.py", "algorithms/test_baselines.py", "algorithms/test_fedadagrad.py"],
    ),
    "server": (
        ["src/fedrepro/server.py"],
        ["algorithms/test_oracles.py", "algorithms/test_baselines.py", "run/test_rows.py"],
    ),
    "minnorm": (
        ["src/fedrepro/minnorm.py"],
        [
            "algorithms/test_fedaware.py",
            "algorithms/test_fedaware_na.py",
            "ground/test_minnorm_size.py",
            "ground/test_minnorm_steps.py",
            "ground/test_minnorm_minor_cycle.py",
        ],
    ),
    "metrics": (["src/fedrepro/metrics.py"], ["ground/test_metrics.py"]),
    "cohorts": (
        ["src/fedrepro/run/cohorts.py"],
        ["run/test_cohort_sampler.py", "run/test_cohort_warmup.py", "algorithms/test_oracles.py"],
    ),
    "parts": (
        ["src/fedrepro/parts.py"],
        ["ground/test_parts.py", "algorithms/test_oracles.py", "algorithms/test_baselines.py"],
    ),
    "report_paper": (
        ["src/fedrepro/report/paper.py"],
        [
            "algorithms/test_oracles.py",
            "configure/test_paper_params.py",
            "report/test_claims.py",
            "report/test_verification.py",
            "report/test_report.py",
            "report/test_paper_cells.py",
            "report/test_paper_tables.py",
            # the two that rebuild the whole matrix from evidence/ (12 s each) stay out: the others test its parts
            "-k not the_docs_hold_the_generated_matrix and not every_collapsed_run_of_the_matrix",
        ],
    ),
    "tuning": (
        ["src/fedrepro/configure/tuning.py"],
        ["configure/test_tuning.py", "configure/test_tuning_selection.py"],  # the second: each part's behaviour
    ),
    "partitions": (
        ["src/fedrepro/partitions/[!r]*.py"],
        [
            "inputs/test_partition.py",
            "inputs/test_partition_oracle.py",
            "inputs/test_pachinko.py",
            "inputs/test_partition_file.py",  # the file kind
            "inputs/test_partition_edges.py",  # boundaries, refusals' numbers, the natural kind
            "inputs/test_domains.py",  # natural, per-domain and label-quantity splits
            # dirichlet_legacy against the FedNova code's recipe (the file's other tests read evidence/)
            "ops/test_parity_harness.py::test_dirichlet_legacy_draws_fednovas_client_sets",
        ],
    ),
    "fedopt": (
        [ALG + n for n in ("fedadam.py", "fedyogi.py", "fedams.py", "fedavgm.py", "fedadagrad.py")],
        ["algorithms/test_oracles.py", "algorithms/test_baselines.py", "algorithms/test_fedadagrad.py"],
    ),
    "client_corrections": (
        [ALG + n for n in ("fedprox.py", "scaffold.py", "feddyn.py", "fedcm.py")],
        ["algorithms/test_baselines.py", "run/test_batched.py"],  # the batched forms too
    ),
    "fednova": ([ALG + "fednova.py"], ["algorithms/test_fednova.py", "run/test_batched.py"]),  # VR batched too
    "fedaware": (
        [ALG + "fedaware.py", ALG + "aware.py"],
        ["algorithms/test_fedaware.py", "algorithms/test_fedaware_na.py", "algorithms/test_fedaware_wiring.py"],
    ),
    "fedlaw": (
        [ALG + n for n in ("fedlaw.py", "proxy.py", "feddf.py", "fedbe.py", "serverft.py")],
        ["algorithms/test_fedlaw.py", "algorithms/test_fedlaw_baselines.py"],
    ),
    "ima": ([ALG + "ima.py"], ["algorithms/test_ima.py", "algorithms/test_oracles.py"]),
    "ima_baselines": (  # the batched forms are run/test_batched.py's
        [ALG + n for n in ("fedasam.py", "fedgma.py", "fedfa.py")],
        ["algorithms/test_ima_baselines.py", "run/test_batched.py"],
    ),
    "schedule": (  # the client lr schedule and the cohort size every run trains with
        ["src/fedrepro/schedule.py"],
        ["ground/test_schedule.py", "algorithms/test_oracles.py"],
    ),
    "fedavg": ([ALG + "fedavg.py"], ["algorithms/test_oracles.py", "algorithms/test_baselines.py"]),
    "client_draws": (
        [ALG + "random_epochs.py", ALG + "random_batch.py"],
        ["algorithms/test_client_draws.py", "algorithms/test_oracles.py", "run/test_client_protocol.py"],
    ),
}


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def _selection(tests: list[str]) -> list[str]:
    """The test files under tests/, and an option as "-k EXPRESSION" split into its two arguments."""
    return [a for t in tests for a in (t.split(" ", 1) if t.startswith("-") else ["tests/" + t])]


def prepare(module: str) -> Path:
    """The module's folder: links to the tree mutmut copies, and its configuration."""
    mutated, tests = MODULES[module]
    folder = BUILD / module
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("src", "tests", "params", "docs", "README.md", "evidence"):  # tests read the docs and evidence
        link = folder / name
        if not link.is_symlink():
            link.symlink_to(ROOT / name, target_is_directory=(ROOT / name).is_dir())
    (folder / "pyproject.toml").write_text(
        "[tool.mutmut]\n"
        'source_paths = ["src/"]\n'
        f"only_mutate = {_toml_list(mutated)}\n"
        'also_copy = ["params/", "docs/", "README.md", "evidence/"]\n'
        f"pytest_add_cli_args = {_toml_list(PYTEST_ARGS)}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(_selection(tests))}\n"
    )
    return folder


def run(module: str, mutmut: str) -> int:
    folder = prepare(module)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the mutated copy, never the tree
    env["OMP_NUM_THREADS"] = "1"
    print(f"== {module}: {', '.join(MODULES[module][0])} against {', '.join(MODULES[module][1])}", flush=True)
    code = subprocess.call(["nice", "-n", "10", mutmut, "run", "--max-children", "1"], cwd=folder, env=env)
    subprocess.call([mutmut, "export-cicd-stats"], cwd=folder, env=env, stdout=subprocess.DEVNULL)
    stats = folder / "mutants" / "mutmut-cicd-stats.json"
    if stats.exists():
        print(f"== {module}: {stats.read_text().strip()}")
    subprocess.call([mutmut, "results"], cwd=folder, env=env)
    return code


def main(argv: list[str]) -> int:
    mutmut = os.environ.get("MUTMUT") or str(Path(sys.executable).parent / "mutmut")
    if not argv:
        for name, (mutated, tests) in MODULES.items():
            print(f"{name:20s} {' '.join(mutated)}\n{'':20s} tests: {' '.join(tests)}")
        return 0
    names = list(MODULES) if argv == ["all"] else argv
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        print(f"unknown module {', '.join(unknown)}; known: {', '.join(MODULES)} (or all)", file=sys.stderr)
        return 2
    return max(run(name, mutmut) for name in names)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
