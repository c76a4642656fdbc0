"""Every shipped params file and subset expands to the run and partition ids pinned in tests/golden/ids.json.

A cleanup (a comment, a docstring, a moved function) must rename nothing; a change that does rename runs
is one deliberate commit that rewrites the file (``python tests/golden/ids.py --write``)."""

from __future__ import annotations

import importlib.util
import json

from conftest import ROOT

GOLDEN_MODULE = ROOT / "tests" / "golden" / "ids.py"


def _golden():
    spec = importlib.util.spec_from_file_location("golden_ids", GOLDEN_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_shipped_run_and_partition_keeps_its_id():
    golden = _golden()
    pinned = json.loads(golden.GOLDEN.read_text())
    now = golden.current()
    assert sorted(now) == sorted(pinned), "the expandable params files changed: rewrite tests/golden/ids.json"
    changed = []
    for name in sorted(pinned):
        for kind in ("runs", "partitions"):
            gone = sorted(set(pinned[name][kind]) - set(now[name][kind]))
            new = sorted(set(now[name][kind]) - set(pinned[name][kind]))
            if gone or new:
                changed.append(
                    f"{name} {kind}: {len(gone)} renamed or gone (e.g. {gone[:1]}), {len(new)} new (e.g. {new[:1]})"
                )
    assert not changed, "run ids changed (a deliberate rename rewrites tests/golden/ids.json):\n" + "\n".join(changed)


def test_the_golden_file_covers_every_paper(tmp_path):
    pinned = json.loads(_golden().GOLDEN.read_text())
    for paper in ("fedaware", "fedlaw", "ima", "fednova", "default"):
        assert pinned[f"params/{paper}.yaml"]["runs"], paper
    assert sum(len(v["runs"]) for v in pinned.values()) > 1000
