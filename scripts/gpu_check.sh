#!/usr/bin/env bash
# On a GPU node, from a checkout, with nothing but a site PyTorch (>= 2.11, with torchvision):
#   scripts/gpu_check.sh                 # CUDA checks + benchmark (a few minutes), -> results/bench/gpu_check.json
#   scripts/gpu_check.sh --skip-bench    # the checks only
# Cite results/bench/gpu_check.json (docs/benchmark.md) with the GPU model it names.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
# Besides torch, the engine still imports these (settings validation, metrics files, progress bar):
missing=$(python - <<'PY'
import importlib.util
print(" ".join(m for m in ("yaml", "jsonschema", "pandas", "tqdm", "numpy") if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
  echo "gpu_check: missing Python modules: $missing (pip install --user pyyaml jsonschema pandas tqdm)" >&2
  exit 2
fi
python -m fedrepro.cli check-gpu "$@"
