"""Which runs of a Snakemake invocation train together as a pack (``run/packed.py``), and what a pack's job is
given. A run's pack is fixed by its own id (a hash of it modulo the number of packs of its dataset, model and
device), never by the other runs of the grid: adding, removing or changing a run moves no other run to another
pack, so the finished runs' jobs and results stay as they are.
"""

from __future__ import annotations

import hashlib
import re

STAGING = "results/packs/{pack}/runs/{run}"  # where a pack trains a run before its own job takes the result


def pack_of(run: str, setting: dict, packs: int) -> str:
    bucket = int(hashlib.sha256(run.encode()).hexdigest()[:8], 16) % packs
    # one process holds one arithmetic (run/process.set_precision is process-wide)
    precision = "" if setting["precision"] == "float32" else f"-{setting['precision']}"
    return f"{setting['dataset']}-{setting['model']}-{setting['device']}{precision}-{bucket}"


class WorkflowPacks:
    """``runs``: id -> setting; ``alone``: ids that must train in their own process (forks)."""

    def __init__(self, runs: dict[str, dict], packs: int, alone: set[str] = frozenset()):
        self.settings = runs
        self.pack = {} if not packs else {run: pack_of(run, s, packs) for run, s in runs.items() if run not in alone}
        self.members: dict[str, list[str]] = {}
        for run, pack in sorted(self.pack.items()):
            self.members.setdefault(pack, []).append(run)

    def __bool__(self) -> bool:
        return bool(self.pack)

    def run_pattern(self) -> str:
        """A regular expression the packed runs' ids match and no other run's (one that matches none if none)."""
        return "|".join(re.escape(run) for run in sorted(self.pack)) or "(?!)"

    def marker(self, run: str) -> str:
        """The file a pack's job writes once it has trained (or found done) this run."""
        return f"results/packs/{self.pack[run]}/done/{run}.json"

    def staged(self, run: str) -> str:
        return STAGING.format(pack=self.pack[run], run=run)

    def job_members(self, pack: str, partition_of, data_root_of) -> list[dict]:
        """The ``fedrepro train-pack --members`` list: each run's setting, staging folder, partition folder,
        data folder, and its own run folder (a run whose summary is there is done and left alone)."""
        return [
            {
                "setting": self.settings[run],
                "out": self.staged(run),
                "done_at": f"results/runs/{run}",
                "partition": partition_of(run),
                "data_root": data_root_of(run),
            }
            for run in self.members[pack]
        ]
