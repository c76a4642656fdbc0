"""fedrepro bench-table's arithmetic: the steady round from the wall clock, and the table's time from it."""

from types import SimpleNamespace

import pytest

from fedrepro.configure.forks import Fork
from fedrepro.ops import table_pack
from fedrepro.run import checkpoint


def test_steady_round_leaves_the_first_round_out():
    # rounds end at 10 (a slow first round), then 2, 3, 2 seconds apart: the median of the warm steps is 2
    rows = [{"wall_time": w} for w in (10.0, 12.0, 15.0, 17.0)]
    assert table_pack.steady_round_seconds(rows) == 2.0
    assert table_pack.steady_round_seconds(rows[:1]) is None  # no warm round yet


def test_rows_of_a_stopped_run_come_from_its_checkpoint(tmp_path):
    rows = [{"round": 1, "wall_time": 1.0, "test_acc": 0.5}, {"round": 2, "wall_time": 2.5, "test_acc": 0.6}]
    checkpoint.save({"rows": rows, "next_round": 2}, tmp_path / "checkpoint.pt", digest=True)
    assert table_pack.round_rows(tmp_path) == rows
    assert table_pack.round_rows(tmp_path / "absent") == []


def test_the_table_is_priced_from_each_run_s_own_start():
    run = lambda i, rounds: SimpleNamespace(id=i, setting={"rounds": rounds})  # noqa: E731
    runs = [run("a", 300), run("b", 300), run("a+ima", 300)]
    forks = {"a+ima": Fork("a", 225, 5)}
    t = table_pack.extrapolate(runs, forks, pack_round_s=4.0, pack_runs=2)
    assert t["run_rounds"] == 300 + 300 + 75
    assert t["run_round_s"] == 2.0
    assert t["minutes"] == pytest.approx(2.0 * 675 / 60)
    assert (t["runs"], t["forked_runs"], t["packs_of_this_size"]) == (3, 1, 2)


def test_a_run_with_a_setting_overridden_trains_in_its_own_id_s_folder():
    from fedrepro import identity

    runs, _, forks = table_pack.table_runs(["params/ima.yaml"], "ima_table1_fmnist")
    base = [r for r in runs if r.id not in forks][:2]
    partition_of = {r.id: "p" for r in base}
    plain = table_pack.pack_members(base, partition_of, "data", "root", None)
    assert [m["out"] for m in plain] == [f"root/runs/{r.id}" for r in base]
    tf32 = table_pack.pack_members(base, partition_of, "data", "root", {"precision": "tf32"})
    for r, m in zip(base, tf32):
        assert m["setting"]["precision"] == "tf32"
        assert m["out"] == f"root/runs/{identity.run_id(m['setting'])}" != f"root/runs/{r.id}"
