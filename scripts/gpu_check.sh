#!/usr/bin/env bash
# On a GPU node, from a checkout, with nothing but a site PyTorch (>= 2.11, with torchvision):
#   scripts/gpu_check.sh                 # CUDA checks + benchmark (a few minutes), -> evidence/gpu/gpu_check-<commit>.json
#   scripts/gpu_check.sh --skip-bench    # the checks only (among them: batched = sequential for every method)
# The log goes beside the JSON (evidence/gpu/gpu_check-<commit>.log); cite both with the GPU model they name.
# The packed step costs (runs x clients stacked at 1, 4, 16, 64 runs, at most 90 s; then with step_graph compile,
# CUDA graphs, at most 150 s, --graph-budget) go to evidence/gpu/packed_steps-<commit>.json, where `fedrepro plan`
# reads them (fedrepro.ops.packed_pricing).
# Then IMA Table 1's FMNIST round-0 runs train as one pack for FEDREPRO_TABLE_SECONDS (default 180; 0: not at all),
# from real Fashion-MNIST in data/fmnist (fedrepro download first): the packed round measured on the table's own
# settings and the table's time extrapolated, to evidence/gpu/table_pack-<commit>.json (fedrepro bench-table).
# Options after the script's name go to `fedrepro check-gpu` (--skip step_costs bench, --packed-budget 60, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}  # the interpreter that holds torch (PYTHON=... to name another)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
# Besides torch, the engine still imports these (settings validation, metrics files, progress bar):
missing=$("$PY" - <<'PY'
import importlib.util
print(" ".join(m for m in ("yaml", "jsonschema", "pandas", "tqdm", "numpy") if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
  echo "gpu_check: missing Python modules: $missing (pip install --user pyyaml jsonschema pandas tqdm)" >&2
  exit 2
fi
# Everything under evidence/gpu/, named by the commit: the JSON (checks, step costs, benchmark), the packed step
# costs and the log.
commit=${FEDREPRO_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
mkdir -p evidence/gpu
packed=(--packed-out "evidence/gpu/packed_steps-$commit.json")
case " $* " in *" --packed-out "*) packed=() ;; esac
set +e  # a failed check still leaves the table stage to run; the script's exit says the checks failed
case " $* " in
  *" --out "*) "$PY" -m fedrepro.cli check-gpu ${packed[@]+"${packed[@]}"} "$@" 2>&1 | tee "evidence/gpu/gpu_check-$commit.log" ;;
  *) "$PY" -m fedrepro.cli check-gpu --out "evidence/gpu/gpu_check-$commit.json" ${packed[@]+"${packed[@]}"} "$@" 2>&1 \
       | tee "evidence/gpu/gpu_check-$commit.log" ;;
esac
checked=${PIPESTATUS[0]}
set -e
table_seconds=${FEDREPRO_TABLE_SECONDS:-180}
if [ "$table_seconds" != 0 ]; then
  "$PY" -m fedrepro.cli bench-table --seconds "$table_seconds" --out "evidence/gpu/table_pack-$commit.json" 2>&1 \
    | tee "evidence/gpu/table_pack-$commit.log"
fi
exit "$checked"
