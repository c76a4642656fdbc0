#!/bin/bash
# usage: run_one.sh LABEL WORKDIR [ENV=VAL ...] -- python args...
# Runs one training process, niced, one thread, CPU shim via PYTHONPATH; logs to /work/parity/logs/LABEL.log
LABEL=$1; WD=$2; shift 2
EXTRA=()
while [ "$1" != "--" ]; do EXTRA+=("$1"); shift; done; shift
LOG=/work/parity/logs/$LABEL.log
cd "$WD"
export PATH=/work/parity/venv/bin:$PATH
export PYTHONPATH=/work/parity/shim OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 PYTHONUNBUFFERED=1
for e in "${EXTRA[@]}"; do export "$e"; done
{
echo "PARITY_START $(date -u +%FT%TZ) label=$LABEL cwd=$PWD"
echo "PARITY_CMD $*"
echo "PARITY_ENV PYTHONPATH=$PYTHONPATH OMP_NUM_THREADS=$OMP_NUM_THREADS MKL_NUM_THREADS=$MKL_NUM_THREADS TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 ${EXTRA[*]}"
} > "$LOG"
S=$(date +%s)
nice -n 5 "$@" >> "$LOG" 2>&1
RC=$?
E=$(date +%s)
echo "PARITY_END $(date -u +%FT%TZ) rc=$RC wall_s=$((E-S))" >> "$LOG"
exit $RC
