"""partitions/records.py: the heterogeneity a partition's record and heatmap caption carry (mean total-variation
distance of the clients' label distributions from the global one), outside every partition id."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from conftest import make_partition
from fedrepro import cli, identity, partitions
from fedrepro.partitions import records as partition_records
from fedrepro.partitions.base import class_counts

LABELS = np.repeat(np.arange(10), 600)  # 6,000 samples, 10 balanced classes


def dirichlet_tv(alpha: float, seed: int = 1, clients: int = 20) -> float:
    setting = {
        "kind": "dirichlet",
        "num_clients": clients,
        "seed": seed,
        "alpha": alpha,
        "min_size": 10,
        "balance": False,
    }
    parts = partitions.make(LABELS, setting)
    return partition_records.heterogeneity(class_counts(LABELS, parts, 10))["mean_tv"]


def test_the_statistic_is_the_hand_computed_mean_tv():
    # pooled mix (3/6, 3/6): client 0 (1, 0) is 0.5 away, client 1 (1/2, 1/2) 0, client 2 (0, 1) 0.5: mean 1/3
    assert partition_records.label_tv(np.array([[2, 0], [1, 1], [0, 2]])) == pytest.approx([0.5, 0.0, 0.5])
    # unequal sizes: pooled (3/8, 5/8); (3/4, 1/4) and (0, 1) are both 3/8 away
    stat = partition_records.heterogeneity(np.array([[3, 1], [0, 4]]))
    assert (stat["mean_tv"], stat["min_tv"], stat["max_tv"], stat["clients"]) == (0.375, 0.375, 0.375, 2)
    # a client with no sample has no label distribution: left out, not counted as 0
    stat = partition_records.heterogeneity(np.array([[2, 0], [0, 0], [0, 2]]))
    assert (stat["mean_tv"], stat["clients"]) == (0.5, 2)


def test_a_small_alpha_is_clearly_more_heterogeneous_than_a_large_one():
    strong, weak = dirichlet_tv(0.1), dirichlet_tv(100)
    assert strong > 0.5 and weak < 0.1, (strong, weak)
    # the example: alpha 0.5 and 10 must not look alike either
    assert dirichlet_tv(0.5) > dirichlet_tv(10) + 0.2
    iid = partitions.make(LABELS, {"kind": "iid", "num_clients": 20, "seed": 1})
    assert partition_records.heterogeneity(class_counts(LABELS, iid, 10))["mean_tv"] < 0.1


def test_fedrepro_partition_writes_it_in_the_record_and_the_heatmap(tiny_data_root, tmp_path, capsys):
    out = tmp_path / "part"
    setting = {
        "dataset": "fmnist",
        "num_clients": 4,
        "kind": "dirichlet",
        "alpha": 0.1,
        "seed": 1,
        "min_size": 10,
        "balance": False,
    }
    cli.main(["partition", "--setting", json.dumps(setting), "--data-root", str(tiny_data_root), "--out", str(out)])
    info = json.loads((out / "partition.json").read_text())
    counts = pd.read_csv(out / "counts.csv", index_col="client").to_numpy()
    assert info["heterogeneity"] == partition_records.heterogeneity(counts)
    assert info["heterogeneity"]["measure"] == partition_records.MEASURE
    assert "label heterogeneity: mean TV" in capsys.readouterr().out
    assert (out / "heatmap.png").stat().st_size > 0
    # the indices are still partition_records.load's: the record describes the same clients
    assert partition_records.of_folder(out) == info["heterogeneity"]
    assert len(partition_records.load(out, {**info["setting"]})) == 4


def test_a_record_written_before_the_statistic_gets_it_from_its_counts(tiny_data_root, tmp_path):
    out = make_partition(tiny_data_root, tmp_path / "old", num_clients=4, kind="iid")
    record = json.loads((out / "partition.json").read_text())
    del record["heterogeneity"]  # as records written before the statistic existed
    (out / "partition.json").write_text(json.dumps(record))
    counts = pd.read_csv(out / "counts.csv", index_col="client").to_numpy()
    assert partition_records.of_folder(out) == partition_records.heterogeneity(counts)
    assert partition_records.of_folder(tmp_path / "nothing") is None


def test_the_record_module_is_no_part_of_a_partitions_id():
    for kind in ("iid", "dirichlet", "hybrid", "shards", "pachinko", "natural", "file"):
        assert "partitions/records.py" not in identity.partition_code("cifar100", kind)
    assert "partitions/records.py" not in identity.run_code(
        {"algorithm": "fedavg", "plugins": [], "dataset": "fmnist", "model": "mlp"}
    )
