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
