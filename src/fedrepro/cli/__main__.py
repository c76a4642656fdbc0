"""``python -m fedrepro.cli``: the same as ``fedrepro`` (scripts/gpu_check.sh calls it so)."""

from fedrepro.cli import main

main()
