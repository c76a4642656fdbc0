#!/usr/bin/env bash
# On a GPU node, from a checkout, with nothing but a site PyTorch (>= 2.11, with torchvision):
#   scripts/gpu_check.sh                 # CUDA checks + benchmark (a few minutes), -> results/bench/gpu_check.json
#   scripts/gpu_check.sh --skip-bench    # the checks only
# Cite results/bench/gpu_check.json in the README with the GPU model it names.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
python -m fedrepro.cli check-gpu "$@"
