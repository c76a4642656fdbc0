# Two commands on a fresh machine: `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
PROFILE ?= workflow/profiles/local
CONFIG ?= params/default.yaml

.PHONY: setup run test test-fast test-each test-floats dry-run clean-results lock lint mutants parity-fedaware parity-fedlaw parity-ima parity-fednova parity-matrix

setup: $(VENV)/.installed fmnist-data

# Every package at the version and with the hashes requirements.lock names (the test tools included), then
# fedrepro itself with nothing more, installed by uv (itself pinned by hash in requirements-uv.lock): it
# fetches and unpacks wheels in parallel, a minute for the lock where pip took six. --compile-bytecode as pip
# does: without it, where PYTHONDONTWRITEBYTECODE is set every process compiles torch's modules again. torch comes as PyPI's default wheel (with its CUDA libraries; it runs
# on CPU too). The lock was made for CPython 3.11 on x86-64 Linux.
LOCK := requirements.lock
UV_LOCK := requirements-uv.lock
$(VENV)/.installed: $(LOCK) $(UV_LOCK) pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --require-hashes -r $(UV_LOCK)
	$(BIN)/uv pip install --python $(BIN)/python -q --compile-bytecode --require-hashes -r $(LOCK)
	$(BIN)/uv pip install --python $(BIN)/python -q --no-deps --no-build-isolation -e .
	touch $@

# Rewrite requirements.lock from pyproject.toml's pins (the test extra included). uv keeps every version the
# lock holds that still fits, so only what pyproject.toml changed moves; delete the lock to take the newest
# versions of everything it does not pin.
LOCK_TOOLS := .lock-tools
UV_VERSION := 0.13.9
lock:
	@[ -x $(LOCK_TOOLS)/bin/uv ] || { $(PYTHON) -m venv $(LOCK_TOOLS) && $(LOCK_TOOLS)/bin/pip install -q uv==$(UV_VERSION); }
	$(LOCK_TOOLS)/bin/uv pip compile pyproject.toml --extra test --generate-hashes --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --custom-compile-command 'make lock' -o $(LOCK)
	echo "uv==$(UV_VERSION)" | $(LOCK_TOOLS)/bin/uv pip compile - --generate-hashes --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --custom-compile-command 'make lock' -o $(UV_LOCK)

# Real Fashion-MNIST without internet: Debian's package, when we may install it.
.PHONY: fmnist-data
fmnist-data:
	@if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] && command -v apt-get >/dev/null \
	   && [ "$$(id -u)" = 0 ]; then \
	  echo "installing Debian's dataset-fashion-mnist"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null; \
	fi

# One `make run` after a kill finishes the grid. Snakemake's lock has no owner check, so a kill -9
# leaves it behind; `make run` holds a flock for as long as it runs (the kernel drops it when the
# process dies, however it dies), so when it gets the flock no other `make run` is working here and
# any Snakemake lock is stale: it is removed. Interrupted jobs rerun (rerun-incomplete in the profile)
# and resume from their checkpoints. It waits up to 15 s for the flock: right after a kill -9 the
# killed jobs may still be exiting (a torch process takes a moment to unmap), and they hold it until then.
SNAKEMAKE_ARGS ?=
RUN_FLOCK := .snakemake/make-run.flock

run: setup recover-run
	@echo "report: $(CURDIR)/reports/index.html"

.PHONY: recover-run
recover-run:
	@mkdir -p .snakemake
	@flock -w 15 -E 75 $(RUN_FLOCK) $(MAKE) --no-print-directory locked-run \
	  || { status=$$?; [ $$status -eq 75 ] && echo "another 'make run' is working in $(CURDIR)" >&2; exit $$status; }

.PHONY: locked-run
locked-run:
	@if [ -n "$$(ls .snakemake/locks 2>/dev/null)" ]; then \
	  echo "removing a stale Snakemake lock (no other 'make run' holds $(RUN_FLOCK))"; \
	  snakemake --workflow-profile $(PROFILE) --configfile $(CONFIG) --unlock; \
	fi
	snakemake --workflow-profile $(PROFILE) --configfile $(CONFIG) $(SNAKEMAKE_ARGS)

dry-run: setup
	snakemake --workflow-profile $(PROFILE) --configfile $(CONFIG) -n

# Two workers, a whole test file each (--dist loadfile): a module's shared fixture (a tiny workflow run,
# a Slurm cluster, an MLflow server) is built once, and the slow tests' waits on subprocesses overlap.
TEST_WORKERS ?= 2
test: test-each

test-fast: setup
	pytest -q -m "not slow and not slurm" -n $(TEST_WORKERS) --dist loadfile

# The tests that compare floating-point results (marker floats) once more on the kernels of the oldest x86-64
# CPU torch supports (SSE4.1, no AVX): a tolerance read off this machine's kernels fails here as it would on
# another machine. The end-to-end ones (slow) compare bit for bit within one process and are left out.
FLOAT_ISA ?= ONEDNN_MAX_CPU_ISA=SSE41 ATEN_CPU_CAPABILITY=default
test-floats: setup
	$(FLOAT_ISA) pytest -q -m "floats and not slow and not slurm and not gpu" -n $(TEST_WORKERS) --dist loadfile

# The reviewer's checks: Python as ruff lints and formats it (pyproject.toml [tool.ruff]), Snakefile and rules as
# snakefmt writes them, and every `snakemake --lint` warning one the Snakefile explains (scripts/lint_workflow.py).
lint: setup
	ruff check .
	ruff format --check .
	snakefmt --check Snakefile workflow/rules/*.smk
	python scripts/lint_workflow.py

# Parity with the authors' code (docs/parity.md): run the harness on a checkout of a paper's official repository,
# e.g. `make parity-fednova CHECKOUT=../FedNova`, then `make parity-matrix` to rewrite the page's matrix. CPU
# cost on 2 shared cores (measured 2026-11-28, wall, beside other jobs): FedAWARE 4.5 min, FedLAW 4.5, IMA 16, FedNova 9.
CHECKOUT ?=
parity-fedaware parity-fedlaw parity-ima parity-fednova: setup
	@[ -n "$(CHECKOUT)" ] || { echo "CHECKOUT=<path of the paper's official repository> is required"; exit 2; }
	PYTHONPATH=$(CURDIR)/src python -m fedrepro.parity $(@:parity-%=%) --checkout $(CHECKOUT)

parity-matrix: setup
	PYTHONPATH=$(CURDIR)/src python -m fedrepro.parity --matrix

# Each test file alone, in its own pytest process, TEST_WORKERS files at a time (scripts/test_each.py): a file
# that passes only after another one imported a module or set a global fails here. `make test` (CI's command)
# is this. `make test-each TEST_FILES="tests/run/test_a.py tests/ops/test_b.py"` runs only those.
TEST_FILES ?=
test-each: setup
	python scripts/test_each.py --workers $(TEST_WORKERS) $(TEST_FILES)

# Mutation testing of the modules that hold the papers' mathematics, each against the fast tests that cover
# it (scripts/mutants.py names them; docs/testing.md records the scores and every survivor's triage). One
# mutmut worker, niced; results are cached per module in build/mutants/<module>/. `make mutants` lists the
# modules, `make mutants MUTANTS="server_optim minnorm"` runs those, `make mutants MUTANTS=all` every one.
MUTANTS ?=
mutants: setup
	python scripts/mutants.py $(MUTANTS)
