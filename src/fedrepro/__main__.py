"""``python -m fedrepro``: the ``fedrepro`` command of this interpreter's environment (how the workflow calls it)."""

from fedrepro.cli import main

main()
