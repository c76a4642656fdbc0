"""Every subset in params/subsets/ expands, with the params file its header runs it with, into the runs it
promises before any job starts: a subset that narrows a grid must keep the whole file valid (a tune block of
the base file that matches none of the subset's points, a key the base file does not have)."""

from __future__ import annotations

import re
import shutil

import pytest

from fedrepro.configure import expansion, paramsfile
from fedrepro.configure.paramsfile import ROOT

SUBSETS = sorted((ROOT / "params" / "subsets").glob("*.yaml"))
BASE = re.compile(r"--configfile\s+(params/[A-Za-z0-9_]+\.yaml)")


def test_every_subset_names_the_params_file_it_narrows():
    assert SUBSETS
    for subset in SUBSETS:
        assert BASE.search(subset.read_text()), f"{subset.name}: its header names no `--configfile params/<file>.yaml`"


@pytest.mark.parametrize("subset", SUBSETS, ids=lambda p: p.stem)
def test_a_subset_expands_with_its_params_file(subset, tmp_path):
    base = ROOT / BASE.search(subset.read_text()).group(1)
    params = paramsfile.load_params_files([base, subset])
    # a subset reading a partition file finds it under data.root: the repository's copy (evidence/official_code)
    for exp in params["experiments"].values():
        path = exp.get("base", {}).get("partition", {}).get("path")
        if path and not path.startswith("/"):
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / "evidence" / "official_code" / "partitions" / (tmp_path / path).name, tmp_path / path)
            params["data"] = {**params.get("data", {}), "root": str(tmp_path)}
    tunings: dict = {}
    runs = expansion.expand(params, tunings)
    assert [r for r in runs if not r.tuning], f"{subset.name} selects no run"


def test_fedlaw_table3_draws_a_partition_per_seed_and_the_shared_draw_is_a_switch():
    """FedLAW App. D.4 draws a partition per seed: Table 3's FMNIST MLP columns (2 alpha x 8 methods x 3 seeds)
    hold 6 partitions, one per (alpha, seed), each drawn with the run's seed. The switches subset holds these
    same runs (same ids) beside the shared draw, one partition per alpha for all three seeds."""
    subsets = ROOT / "params" / "subsets"
    base = ROOT / "params" / "fedlaw.yaml"
    runs = [
        r
        for r in expansion.expand(
            paramsfile.load_params_files([base, subsets / "verify_fedlaw_table3_fmnist_mlp.yaml"]), {}
        )
        if not r.tuning
    ]
    assert len(runs) == 48
    assert {r.setting["model"] for r in runs} == {"mlp"}
    assert all(r.setting["partition"]["seed"] == r.setting["seed"] for r in runs)
    by_draw = {(r.setting["partition"]["alpha"], r.setting["seed"]): r.partition for r in runs}
    assert sorted(by_draw) == [(0.1, 8), (0.1, 9), (0.1, 10), (100, 8), (100, 9), (100, 10)]
    assert len(set(by_draw.values())) == 6 == len({r.partition for r in runs})
    both = [
        r
        for r in expansion.expand(
            paramsfile.load_params_files([base, subsets / "fedlaw_table3_fmnist_mlp_partition_draw.yaml"]), {}
        )
        if not r.tuning
    ]
    shared = [r for r in both if r.setting["partition"]["seed"] == 1]
    assert {r.id for r in both} - {r.id for r in shared} == {r.id for r in runs}
    assert len(shared) == 48 and len({r.partition for r in shared}) == 2


def test_the_fedlaw_code_draws_run_feddyn_at_the_seed_that_drew_them(tmp_path):
    """Each export of the FedLAW code's Dir(0.1) partition (seeds 8, 9, 10) is read, pinned by its own SHA-256,
    by FedDyn runs at the seed the code drew it with (the code draws its partition with the run's seed)."""
    import hashlib

    subsets = ROOT / "params" / "subsets"
    kept = ROOT / "evidence" / "official_code" / "partitions"
    (tmp_path / "partitions").mkdir()
    for npz in kept.glob("fedlaw_fmnist_dir0.1_seed*_n20.npz"):
        shutil.copy(npz, tmp_path / "partitions" / npz.name)
    names = {
        8: "fedlaw_table3_feddyn_code_partition.yaml",
        9: "fedlaw_table3_feddyn_code_partition_seed9.yaml",
        10: "fedlaw_table3_feddyn_code_partition_seed10.yaml",
    }
    for seed, name in names.items():
        params = paramsfile.load_params_files([ROOT / "params" / "fedlaw.yaml", subsets / name])
        params["data"] = {**params.get("data", {}), "root": str(tmp_path)}
        runs = [r for r in expansion.expand(params, {}) if not r.tuning]
        assert runs and {r.setting["seed"] for r in runs} == {seed}, name
        assert {r.setting["algorithm"] for r in runs} == {"feddyn"}, name
        for run in runs:
            part = run.setting["partition"]
            assert part["kind"] == "file" and part["path"].endswith(f"fedlaw_fmnist_dir0.1_seed{seed}_n20.npz"), name
            assert (
                hashlib.sha256((kept / f"fedlaw_fmnist_dir0.1_seed{seed}_n20.npz").read_bytes()).hexdigest()
                == part["sha256"]
            ), name
