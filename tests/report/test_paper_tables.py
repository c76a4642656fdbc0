"""A paper table's cells as report/paper.py reads them from report/tables/*.yaml, and which runs each cell takes:
the paper's mean and std of a cell, the row's and column's match, a table's rows checked against its columns, and
the match rules (plugins as a set, a null key unset, numbers equal up to float rounding, bools not numbers)."""

from __future__ import annotations

import pandas as pd
import pytest

from fedrepro.report import paper

METRIC = {"kind": "mean_last_rounds", "rounds": 2}


def _tables() -> dict:
    return {
        "t1": {
            "paper": "fedlaw",
            "metric": METRIC,
            "columns": [{"label": "MLP", "match": {"model": "mlp"}}, {"label": "LeNet", "match": {"model": "lenet5"}}],
            "rows": [
                {"label": "FedAvg", "match": {"algorithm": "fedavg"}, "values": [{"mean": 80.5, "std": 0.4}, 70.0]}
            ],
        },
        "t2": {
            "paper": "ima",
            "metric": METRIC,
            "columns": [{"label": "FMNIST", "match": {"dataset": "fmnist"}}],
            "rows": [{"label": "FedAvg", "match": {"algorithm": "fedavg"}, "values": [88.0]}],
        },
    }


def test_each_cell_carries_its_table_paper_labels_match_and_the_papers_mean_and_std():
    first, second, third = paper.cells(_tables())
    assert (first.table, first.paper, first.row, first.column) == ("t1", "fedlaw", "FedAvg", "MLP")
    assert first.match == {"algorithm": "fedavg", "model": "mlp"} and first.metric == METRIC
    assert (first.value, first.std) == (80.5, 0.4)
    assert (second.column, second.value, second.std) == ("LeNet", 70.0, None)  # a bare number: no std
    assert (third.table, third.paper, third.column, third.value) == ("t2", "ima", "FMNIST", 88.0)
    assert [c.table for c in paper.cells(_tables(), ["t2"])] == ["t2"]


def test_a_row_with_another_count_of_values_than_columns_is_refused_naming_table_row_and_counts():
    tables = _tables()
    tables["t1"]["rows"][0]["values"] = [80.5]
    with pytest.raises(ValueError, match=r"^t1, row 'FedAvg': 1 values for 2 columns$"):
        paper.cells(tables)


def test_join_fills_the_named_tables_alone_with_the_matching_runs_metric():
    frame = pd.DataFrame({"round": [1, 2, 3], "test_acc": [0.5, 0.7, 0.9]})
    run = {"id": "r1", "setting": {"algorithm": "fedavg", "dataset": "fmnist", "model": "mlp"},
           "summary": {"status": "finished"}, "metrics": frame}  # fmt: skip
    joined = paper.join(_tables(), [run], ["t2"])
    assert [(c.table, c.ours, c.runs) for c in joined] == [("t2", [pytest.approx(0.8)], ["r1"])]


@pytest.mark.parametrize(
    "setting, match, expected",
    [
        ({"plugins": ["ima", "aware"]}, {"plugins": ["aware", "ima"]}, True),  # a set: order does not count
        ({"plugins": ["ima"]}, {"plugins": ["aware", "ima"]}, False),
        ({}, {"plugins": []}, True),  # no plug-ins written: none
        ({}, {"plugins": ["ima"]}, False),
        ({"client": {"lr": 0.1 + 0.2}}, {"client.lr": 0.3}, True),  # equal up to float rounding
        ({"client": {"lr": 0.31}}, {"client.lr": 0.3}, False),
        ({"rounds": 200}, {"rounds": 200.0}, True),
        ({"balance": True}, {"balance": 1}, True),  # == in Python, so it matches
        ({"balance": True}, {"balance": 1.0000000001}, False),  # a bool is not a number: no tolerance
        ({"x": 1.0000000001}, {"x": True}, False),
        ({"fedprox": {"mu": 0.01}}, {"fedprox.mu": None}, False),  # null: must be unset
        ({}, {"fedprox.mu": None}, True),
        ({}, {"fedprox.mu": 0.01}, False),
    ],
)
def test_a_setting_matches_a_cell_by_these_rules(setting, match, expected):
    assert paper.matches(setting, match) is expected
