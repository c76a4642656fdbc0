"""The run and partition ids every shipped params file and subset expands to, pinned in ``ids.json``.

A run id names a run's folder, its MLflow run and its kept evidence; a change that renames runs is one
deliberate commit that rewrites the file with ``python tests/golden/ids.py --write`` and says why.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from fedrepro.configure import expansion, paramsfile  # noqa: E402
from fedrepro.errors import FedreproError  # noqa: E402

GOLDEN = Path(__file__).with_name("ids.json")
BASE = re.compile(r"--configfile\s+(params/[A-Za-z0-9_]+\.yaml)")
NOT_A_GRID = {"paper_results.yaml"}


def sources() -> dict[str, list[Path]]:
    """Each expandable input by name: the params files, each subset with the file its header names, and
    the hostile fixtures that are valid."""
    found = {f"params/{p.name}": [p] for p in sorted((ROOT / "params").glob("*.yaml")) if p.name not in NOT_A_GRID}
    for subset in sorted((ROOT / "params" / "subsets").glob("*.yaml")):
        found[f"params/subsets/{subset.name}"] = [ROOT / BASE.search(subset.read_text()).group(1), subset]
    for fixture in sorted((ROOT / "tests" / "hostile_params").glob("*.yaml")):
        found[f"tests/hostile_params/{fixture.name}"] = [fixture]
    return found


def _with_partition_files(params: dict, root: Path) -> dict:
    """A subset reading one of the authors' partition files finds the repository's copy under data.root."""
    for exp in params["experiments"].values():
        path = exp.get("base", {}).get("partition", {}).get("path")
        if path and not path.startswith("/"):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / "evidence" / "official_code" / "partitions" / Path(path).name, root / path)
            params["data"] = {**params.get("data", {}), "root": str(root)}
    return params


def ids_of(files: list[Path]) -> dict | None:
    """Run ids (tuning runs included) and partition ids of the files, or None when they are refused."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            params = _with_partition_files(paramsfile.load_params_files(files), Path(tmp))
            runs = expansion.expand(params, {})
        except FedreproError:
            return None
    return {"runs": sorted({r.id for r in runs}), "partitions": sorted({r.partition for r in runs})}


def current() -> dict[str, dict]:
    return {name: ids for name, files in sources().items() if (ids := ids_of(files)) is not None}


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/golden/ids.py --write   (rewrites tests/golden/ids.json)")
    GOLDEN.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN.relative_to(ROOT)}")
