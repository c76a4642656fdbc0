"""Partition properties: IID, Dirichlet (NIID-Bench recipe), FedLAW's hybrid Dirichlet and label shards."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from fedrepro import partitions
from fedrepro.partitions import dirichlet, hybrid, inner_dirichlet, records as partition_records
from fedrepro.partitions.base import PartitionError, class_counts, content_hash, long_tail_counts


def _labels(n: int = 3000, classes: int = 10, seed: int = 0) -> np.ndarray:
    # uneven class sizes, shuffled: closer to real data than arange % 10
    rng = np.random.default_rng(seed)
    weights = np.linspace(1.0, 2.0, classes)
    return rng.choice(classes, size=n, p=weights / weights.sum())


SETTINGS = [
    {"kind": "iid", "num_clients": 7},
    {"kind": "dirichlet", "num_clients": 20, "alpha": 0.1, "min_size": 10, "balance": True},
    {"kind": "dirichlet", "num_clients": 10, "alpha": 0.5, "min_size": 30, "balance": False},
    {"kind": "dirichlet", "num_clients": 15, "alpha": 100.0, "min_size": 50, "balance": True},
    {"kind": "hybrid", "num_clients": 20, "alpha_balanced": 10.0, "alpha": 0.1, "min_size": 5, "balance": False},
    {"kind": "shards", "num_clients": 20, "classes_per_client": 2, "distinct": True},
    {"kind": "shards", "num_clients": 10, "classes_per_client": 3, "distinct": False},
]


def _make(labels, setting, seed=1):
    return partitions.make(labels, {"dataset": "fmnist", "seed": seed, **setting})


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_every_sample_in_at_most_one_client_and_counts_add_up(setting):
    labels = _labels()
    parts = _make(labels, setting)
    assert len(parts) == setting["num_clients"]
    together = np.concatenate(parts)
    assert len(together) == len(np.unique(together)), "a sample is in two clients"
    assert together.min() >= 0 and together.max() < len(labels)
    if setting["kind"] == "shards":
        # FedAvg's shards drop the remainder of N / (clients * C) only
        shard = len(labels) // (setting["num_clients"] * setting["classes_per_client"])
        assert len(together) == shard * setting["num_clients"] * setting["classes_per_client"]
        assert {len(p) for p in parts} == {shard * setting["classes_per_client"]}
    else:
        assert len(together) == len(labels), "every sample must be in exactly one client"
    counts = class_counts(labels, parts, 10)
    assert counts.shape == (setting["num_clients"], 10)
    assert counts.sum() == len(together)
    assert (counts.sum(axis=1) == [len(p) for p in parts]).all()
    if setting["kind"] != "shards":
        assert (counts.sum(axis=0) == np.bincount(labels, minlength=10)).all()
    for p in parts:
        assert (np.diff(p) > 0).all(), "client indices are sorted and unique"


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s["kind"] == "dirichlet"], ids=str)
def test_dirichlet_min_size_holds(setting):
    parts = _make(_labels(), setting)
    assert min(len(p) for p in parts) >= setting["min_size"]


def test_dirichlet_impossible_min_size_is_refused_with_the_setting_named():
    with pytest.raises(PartitionError, match="min_size"):
        dirichlet.split(_labels(200), 10, np.random.default_rng(0), alpha=0.05, min_size=19, max_tries=20)


def test_dirichlet_small_alpha_is_more_skewed_than_large_alpha():
    labels = _labels()

    def mean_classes_held(alpha):
        parts = _make(labels, {"kind": "dirichlet", "num_clients": 20, "alpha": alpha, "min_size": 10, "balance": True})
        counts = class_counts(labels, parts, 10)
        return float((counts / counts.sum(1, keepdims=True) > 0.05).sum(1).mean())

    assert mean_classes_held(0.1) < mean_classes_held(100.0)


def test_hybrid_is_a_dirichlet_first_half_and_a_dirichlet_split_of_the_rest():
    """Oracle: the same generator drives the two draws in order, so the first half must be the first
    n/2 clients of Dir(alpha_balanced) on all samples, and the rest Dir(alpha) on what is left."""
    labels = _labels()
    parts = hybrid.split(labels, 20, np.random.default_rng(5), 10.0, 0.1, min_size=5, balance=False)
    rng = np.random.default_rng(5)
    first = dirichlet.split(labels, 20, rng, 10.0, 5, False)[:10]
    rest = np.setdiff1d(np.arange(len(labels)), np.concatenate(first))
    second = dirichlet.split(labels[rest], 10, rng, 0.1, 5, False)
    want = first + [rest[p] for p in second]
    assert all(np.array_equal(a, b) for a, b in zip(parts, want))
    # and the groups differ as their names say: the imbalanced clients hold fewer classes
    counts = class_counts(labels, parts, 10)
    held = (counts / counts.sum(1, keepdims=True) > 0.05).sum(1)
    assert held[:10].mean() > held[10:].mean() + 3
    setting = {"kind": "hybrid", "num_clients": 20}
    groups = partitions.groups(setting)
    assert groups["balanced"].tolist() == list(range(10)) and groups["imbalanced"].tolist() == list(range(10, 20))
    assert partitions.groups({"kind": "dirichlet", "num_clients": 20}) == {}


def test_a_hybrid_partition_of_one_client_is_refused_before_any_work():
    from fedrepro.configure import expansion, schema

    params = {
        "experiments": {"h": {"base": {"num_clients": 1, "partition": {"kind": "hybrid"}}, "grid": {"seed": [1]}}}
    }
    with pytest.raises(
        schema.ConfigError, match=r"partition.kind = hybrid: num_clients >= 2 does not hold \(num_clients = 1\)"
    ):
        expansion.expand(params)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_same_seed_same_partition_other_seed_other_partition(setting):
    labels = _labels()
    a, b, c = _make(labels, setting, 1), _make(labels, setting, 1), _make(labels, setting, 2)
    assert content_hash(a) == content_hash(b)
    assert all((x == y).all() for x, y in zip(a, b))
    assert content_hash(a) != content_hash(c)


def test_partition_does_not_touch_the_global_rng():
    np.random.seed(123)
    before = np.random.random()
    np.random.seed(123)
    _make(_labels(), SETTINGS[1])
    assert np.random.random() == before


@pytest.mark.parametrize("classes", [1, 2, 3, 5])
def test_shard_clients_hold_exactly_c_classes(classes):
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 600))  # equal classes: a shard is one class
    parts = _make(labels, {"kind": "shards", "num_clients": 20, "classes_per_client": classes, "distinct": True})
    for p in parts:
        assert len(np.unique(labels[p])) == classes


def test_shards_on_uneven_classes_have_at_most_c_majority_classes():
    labels = _labels(3000)
    parts = _make(labels, {"kind": "shards", "num_clients": 20, "classes_per_client": 2, "distinct": True})
    size = len(labels) // 40
    for p in parts:
        # two shards: each shard spans at most two classes (it is a slice of the sorted labels)
        assert 1 <= len(np.unique(labels[p])) <= 4
        assert len(p) == 2 * size


def test_artifact_counts_csv_and_hash(tmp_path):
    labels = _labels()
    setting = {"dataset": "fmnist", "seed": 1, **SETTINGS[1]}
    parts = partitions.make(labels, setting)
    info = partition_records.save(tmp_path, setting, labels, parts, 10)
    for name in ("clients.npz", "counts.csv", "heatmap.png", "partition.json"):
        assert (tmp_path / name).stat().st_size > 0
    loaded = partition_records.load(tmp_path)
    assert content_hash(loaded) == info["content_hash"] == content_hash(parts)
    frame = pd.read_csv(tmp_path / "counts.csv", index_col="client")
    assert frame.shape == (20, 10)
    assert int(frame.values.sum()) == len(labels)
    assert (frame.values == class_counts(labels, parts, 10)).all()
    assert json.loads((tmp_path / "partition.json").read_text())["setting"] == setting


def test_an_unreachable_min_size_fails_within_seconds_naming_the_setting(monkeypatch):
    """20 clients, alpha = 0.001, min_size 2999 of 60000 samples: within the bound num_clients * min_size
    <= 60000 the config check applies, but each class goes to one client, so no draw reaches it; the job
    redrew for 30 s and more. A cap on the redraw's time ends it, naming partition.min_size."""
    import time

    monkeypatch.setattr(dirichlet, "DIRICHLET_SECONDS", 1.0)
    labels = np.repeat(np.arange(10), 6000)
    setting = {
        "dataset": "fmnist",
        "kind": "dirichlet",
        "num_clients": 20,
        "alpha": 0.001,
        "min_size": 2999,
        "balance": True,
        "seed": 1,
    }
    start = time.monotonic()
    with pytest.raises(PartitionError) as err:
        partitions.make(labels, setting)
    assert time.monotonic() - start < 6, "the redraw stops at its time cap (1 s here) plus one draw"
    message = str(err.value)
    assert message.startswith("partition.min_size = 2999: ") and "lower partition.min_size or raise" in message
    assert "\n" not in message


# --------------------------------------------------------------------------- FedLAW's robustness data (Tables 7, 8)


def test_long_tail_counts_follow_the_exponential_profile():
    # rho 10 over 10 classes of 100: 100 * 10^(-c/9), floored; class 0 keeps all, class 9 a tenth
    expected = [int(np.floor(100 * 10 ** (-c / 9) + 1e-9)) for c in range(10)]
    assert list(long_tail_counts(np.full(10, 100), 10.0)) == expected
    assert expected[0] == 100 and expected[-1] == 10 and expected[5] == 27


@pytest.mark.parametrize(
    "kind", [{"kind": "iid"}, {"kind": "dirichlet", "alpha": 1.0, "min_size": 5, "balance": False}]
)
def test_long_tailed_clients_share_exactly_the_long_tailed_subset(kind):
    labels = _labels()
    setting = {**kind, "num_clients": 10, "seed": 3, "long_tail_rho": 5.0}
    parts = partitions.make(labels, setting)
    union = np.concatenate(parts)
    assert len(np.unique(union)) == len(union)  # disjoint
    held = np.bincount(labels[union], minlength=10)
    assert list(held) == list(long_tail_counts(np.bincount(labels, minlength=10), 5.0))
    assert held[0] == np.bincount(labels)[0] and held[9] < held[0] / 2
    assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted training-set indices
    assert [list(p) for p in partitions.make(labels, setting)] == [list(p) for p in parts]  # the seed decides


def test_long_tail_and_corruption_are_refused_where_they_cannot_apply_and_vanish_when_off():
    from fedrepro.configure import schema, settings

    base = {"dataset": "cifar10", "model": "simplecnn", "num_clients": 20, "rounds": 2}
    hybrid = {"kind": "hybrid", "alpha": 0.1, "alpha_balanced": 10, "long_tail_rho": 5}
    with pytest.raises(
        schema.ConfigError, match=r"partition.long_tail_rho = 5 applies to partition kinds dirichlet, iid, not hybrid"
    ):
        settings.resolve({**base, "partition": hybrid})
    with pytest.raises(schema.ConfigError, match=r"corruption.swap = \[3, 3\]: two different classes of cifar10, 0..9"):
        settings.resolve({**base, "corruption": {"fraction": 0.5, "swap": [3, 3]}})
    with pytest.raises(schema.ConfigError, match=r"corruption.swap = \[0, 10\]"):
        settings.resolve({**base, "corruption": {"fraction": 0.5, "swap": [0, 10]}})
    with pytest.raises(schema.ConfigError, match=r"corruption.fraction = 0.01 of 20 clients corrupts none"):
        settings.resolve({**base, "corruption": {"fraction": 0.01}})
    plain = settings.resolve(base)
    assert settings.resolve({**base, "partition": {"long_tail_rho": 1}, "corruption": {"fraction": 0.0}}) == plain
    on = settings.resolve({**base, "partition": {"long_tail_rho": 5}, "corruption": {"fraction": 0.25}})
    assert on["partition"]["long_tail_rho"] == 5 and on["corruption"] == {"fraction": 0.25, "swap": [0, 1]}


def test_label_swap_exchanges_two_classes_in_the_first_clients_only():
    import torch

    from fedrepro.data.base import TensorDataset
    from fedrepro.run.inputs import swap_labels

    labels = _labels(600)
    parts = partitions.make(labels, {"kind": "iid", "num_clients": 4, "seed": 1})
    train = TensorDataset(torch.zeros(600, 1, 2, 2, dtype=torch.uint8), torch.as_tensor(labels), 0.0, 1.0)
    out = swap_labels(train, parts, {"fraction": 0.5, "swap": [2, 7]}, 4)
    assert torch.equal(train.labels, torch.as_tensor(labels)), "the original is not modified"
    new = out.labels.numpy()
    for i, part in enumerate(parts):
        before, after = np.bincount(labels[part], minlength=10), np.bincount(new[part], minlength=10)
        if i < 2:  # round(0.5 * 4) = 2 corrupted clients: classes 2 and 7 trade their counts
            assert after[2] == before[7] and after[7] == before[2]
            assert np.all(new[part][labels[part] == 2] == 7) and np.all(new[part][labels[part] == 7] == 2)
            keep = ~np.isin(labels[part], [2, 7])
            assert np.array_equal(new[part][keep], labels[part][keep])
        else:
            assert np.array_equal(new[part], labels[part])


def test_a_run_trains_on_long_tailed_clients_with_swapped_labels(tiny_data_root, tmp_path):
    """The partition the workflow makes from the run's setting carries the long tail, and training with a
    corruption section is training on data whose first clients' labels were swapped in the files."""
    import json

    from conftest import make_partition
    from fedrepro import cli, identity
    from fedrepro.configure import settings

    setting = settings.resolve(
        {
            "dataset": "fmnist",
            "model": "mlp",
            "num_clients": 4,
            "rounds": 2,
            "batch_size": 32,
            "device": "cpu",
            "partition": {"kind": "iid", "seed": 1, "long_tail_rho": 4},
            "corruption": {"fraction": 0.5, "swap": [0, 1]},
        }
    )
    part = identity.partition_setting(setting)
    assert "-lt4-" in identity.partition_id(setting)
    parts_dir = make_partition(
        tiny_data_root,
        tmp_path / "part",
        num_clients=4,
        **{k: v for k, v in part.items() if k not in ("dataset", "num_clients")},
    )
    counts = pd.read_csv(parts_dir / "counts.csv", index_col=0).sum().to_numpy()
    from fedrepro import data

    full = np.bincount(data.train_labels("fmnist", tiny_data_root), minlength=10)
    assert list(counts) == list(long_tail_counts(full, 4.0))
    cli.main(
        [
            "train",
            "--setting",
            json.dumps(setting),
            "--partition",
            str(parts_dir),
            "--data-root",
            str(tiny_data_root),
            "--out",
            str(tmp_path / "run"),
            "--no-progress",
            "--threads",
            "1",
        ]
    )
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "finished"
    # the same run on a copy of the data whose files have the swap written into them by hand: round(0.5 x 4)
    # = 2 first clients' samples of class 0 labelled 1 and of class 1 labelled 0; training is then the same
    from conftest import fake_fmnist_arrays, write_fake_fmnist
    from fedrepro.run import checkpoint

    arrays = fake_fmnist_arrays(400, 100)
    images, labels = arrays["train"]
    swapped = labels.copy()
    for client in partition_records.load(parts_dir)[:2]:
        swapped[client] = np.where(labels[client] == 0, 1, np.where(labels[client] == 1, 0, labels[client]))
    assert (swapped != labels).sum() > 0
    root = tmp_path / "swapped_data"
    write_fake_fmnist(root / "FashionMNIST" / "raw", raw=True, arrays={**arrays, "train": (images, swapped)})
    plain = {k: v for k, v in setting.items() if k != "corruption"}
    cli.main(
        [
            "train",
            "--setting",
            json.dumps(plain),
            "--partition",
            str(parts_dir),
            "--data-root",
            str(root),
            "--out",
            str(tmp_path / "plain"),
            "--no-progress",
            "--threads",
            "1",
        ]
    )
    assert torch.equal(
        checkpoint.load(tmp_path / "run" / "model.pt")["x"], checkpoint.load(tmp_path / "plain" / "model.pt")["x"]
    )


def test_inner_dirichlet_gives_equal_clients_their_own_class_priors():
    """FedLab's balanced inner Dirichlet (IMA's CIFAR-100 notebook): floor(N/J) samples each, disjoint, every
    sample used when J divides N, and a small alpha concentrates each client on few classes."""

    labels = np.repeat(np.arange(10), 100)  # 1000 samples, 10 classes
    concentrated = inner_dirichlet.split(labels, 20, np.random.default_rng(0), 0.05)  # classes run out: no hang
    spread = inner_dirichlet.split(labels, 20, np.random.default_rng(0), 1000.0)
    for parts in (concentrated, spread):
        assert [len(p) for p in parts] == [50] * 20
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1000))
    top = lambda parts: np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in parts])  # noqa: E731
    assert top(concentrated) > 0.45 and top(spread) < 0.3
    again = partitions.make(labels, {"kind": "inner_dirichlet", "seed": 3, "alpha": 0.5, "num_clients": 7})
    assert all(
        np.array_equal(a, b)
        for a, b in zip(
            again, partitions.make(labels, {"kind": "inner_dirichlet", "seed": 3, "alpha": 0.5, "num_clients": 7})
        )
    )
    assert [len(p) for p in again] == [1000 // 7] * 7


def test_the_content_hash_is_the_sha256_of_the_client_lists_as_int64():
    """As every partition.json and MLflow's dataset digest record it: each client's indices as int64 bytes,
    each followed by '|', the first 16 hex digits; whatever integer type the lists come in."""
    import hashlib

    parts = [np.array([3, 1, 2], dtype=np.int32), np.array([], dtype=np.int32), np.array([7], dtype=np.int32)]
    digest = hashlib.sha256(b"".join(np.asarray(p, dtype="<i8").tobytes() + b"|" for p in parts)).hexdigest()
    assert content_hash(parts) == digest[:16]
    assert content_hash([np.array([1, 2]), np.array([3])]) != content_hash([np.array([1]), np.array([2, 3])])


def test_shards_give_every_client_every_class_when_it_asks_for_all_of_them():
    labels = np.repeat(np.arange(10), 60)
    parts = partitions.make(
        labels, {"kind": "shards", "num_clients": 3, "classes_per_client": 10, "distinct": True, "seed": 1}
    )
    assert all(sorted(set(labels[p])) == list(range(10)) for p in parts)
    with pytest.raises(PartitionError, match="classes_per_client = 11 exceeds the 10 classes"):
        partitions.make(
            labels, {"kind": "shards", "num_clients": 3, "classes_per_client": 11, "distinct": True, "seed": 1}
        )


def test_label_quantity_may_give_every_client_every_class_and_no_more():
    from fedrepro.partitions import label_quantity

    labels = np.repeat(np.arange(4), 30)
    parts = label_quantity.split(labels, 3, np.random.default_rng(0), classes_per_client=4)
    assert all(sorted(set(labels[p])) == [0, 1, 2, 3] for p in parts)
    assert sorted(np.concatenate(parts).tolist()) == list(range(120))
    with pytest.raises(PartitionError, match="classes_per_client = 5 exceeds the 4 classes"):
        label_quantity.split(labels, 3, np.random.default_rng(0), classes_per_client=5)


def test_a_domain_split_refuses_clients_that_do_not_divide_among_the_domains():
    from fedrepro.partitions.base import per_domain

    domains = np.repeat(np.arange(3), 20)
    with pytest.raises(PartitionError, match="num_clients = 7 must be a positive multiple of the 3 domains of digit5"):
        per_domain(np.zeros(60, dtype=np.int64), {"num_clients": 7, "dataset": "digit5"}, domains, None)
    with pytest.raises(PartitionError, match="num_clients = 2 must be a positive multiple"):
        per_domain(np.zeros(60, dtype=np.int64), {"num_clients": 2, "dataset": "digit5"}, domains, None)
