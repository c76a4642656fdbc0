"""Run at start-up by every Python process the end-to-end tests start on generated Fashion-MNIST
(tests/conftest.py puts this folder on their PYTHONPATH and names the checksums file in
FEDREPRO_TEST_FMNIST_SUMS).

The download rule then fetches the generated files from their mirror folder and checks them as it
checks the published ones, against fedrepro.data.fmnist.FMNIST_CONTENT_SHA256, which this replaces by
the generated files' checksums once that module is imported. Nothing else changes; a process that
never imports it (Snakemake itself) imports no more than before.
"""

import importlib.abc
import importlib.machinery
import json
import os
import sys

SUMS = os.environ.get("FEDREPRO_TEST_FMNIST_SUMS")


class _GeneratedChecksums(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "fedrepro.data.fmnist":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            with open(SUMS) as fh:
                module.FMNIST_CONTENT_SHA256 = json.load(fh)

        spec.loader.exec_module = exec_module
        return spec


if SUMS:
    sys.meta_path.insert(0, _GeneratedChecksums())
