"""The partition kinds at their edges: the boundaries of what each accepts, the numbers its refusals give,
and the kinds no table uses yet (natural), each against a value worked out here."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from fedrepro import partitions
from fedrepro.partitions import dirichlet, file, hybrid, inner_dirichlet, natural, pachinko, shards
from fedrepro.partitions.base import PartitionError, long_tail_counts

# ----------------------------------------------------------------------------------------------- Dirichlet


def _one_draw_each(labels, clients, seed, alpha, draws):
    """The draws split makes, in order: each call with min_size 0 returns its first draw and consumes the
    generator exactly as a rejected draw does."""
    rng = np.random.default_rng(seed)
    return [dirichlet.split(labels, clients, rng, alpha, min_size=0, max_tries=1) for _ in range(draws)]


def test_a_refused_dirichlet_names_its_draws_and_the_best_draws_smallest_client():
    labels = np.repeat(np.arange(4), 25)
    smallest = [min(len(p) for p in draw) for draw in _one_draw_each(labels, 10, 7, 0.3, 3)]
    with pytest.raises(PartitionError) as err:
        dirichlet.split(labels, 10, np.random.default_rng(7), 0.3, min_size=11, max_tries=3, max_seconds=60)
    message = str(err.value)
    assert f"(3 draws in 0 s; the best draw's smallest client had {max(smallest)})" in message, message
    assert message.startswith("partition.min_size = 11: no Dirichlet(alpha = 0.3) draw over 10 clients")


def test_a_dirichlet_draw_with_an_empty_client_reports_zero():
    with pytest.raises(PartitionError, match=r"\(2 draws in \d+ s; the best draw's smallest client had 0\)"):
        dirichlet.split(np.array([0, 1]), 4, np.random.default_rng(0), 1.0, min_size=1, max_tries=2)


def test_the_time_cap_still_allows_one_draw_and_stops_after_it():
    labels = np.repeat(np.arange(2), 10)
    parts = dirichlet.split(labels, 2, np.random.default_rng(1), 100.0, min_size=1, max_seconds=0)
    assert sum(len(p) for p in parts) == 20  # a zero time cap: the first draw is still made and kept
    with pytest.raises(PartitionError, match=r"\(1 draws in 0 s;"):
        dirichlet.split(labels, 2, np.random.default_rng(1), 100.0, min_size=50, max_tries=10**6, max_seconds=0)


def test_a_draw_whose_smallest_client_has_exactly_min_size_is_kept():
    labels = np.repeat(np.arange(5), 40)
    first = _one_draw_each(labels, 8, 3, 0.5, 1)[0]
    smallest = min(len(p) for p in first)
    assert smallest > 0
    kept = dirichlet.split(labels, 8, np.random.default_rng(3), 0.5, min_size=smallest)
    assert all(np.array_equal(a, b) for a, b in zip(kept, first))


def test_balance_stops_a_client_at_exactly_its_share():
    """Two clients, two classes of two samples: with balance a client holding N/J = 2 samples gets no more, so
    none ever holds all four; Dir(0.1) gives a whole class to one client in many draws (0.1, not smaller: below
    about 0.05 a draw can put all its weight on a capped client, and the recipe's renormalisation divides by 0)."""
    labels = np.array([0, 0, 1, 1])
    largest = [
        max(len(p) for p in dirichlet.split(labels, 2, np.random.default_rng(s), 0.1, min_size=0)) for s in range(100)
    ]
    assert max(largest) == 3
    unbalanced = [
        max(len(p) for p in dirichlet.split(labels, 2, np.random.default_rng(s), 0.1, min_size=0, balance=False))
        for s in range(100)
    ]
    assert 4 in unbalanced  # without the cap the whole set does land on one client


# ------------------------------------------------------------------------------------------------- hybrid


@pytest.mark.parametrize("balance", [True, False])
def test_hybrid_hands_balance_to_both_draws(balance):
    labels = np.repeat(np.arange(4), 30)
    parts = hybrid.split(labels, 6, np.random.default_rng(2), 0.5, 0.1, min_size=2, balance=balance)
    rng = np.random.default_rng(2)
    first = dirichlet.split(labels, 6, rng, 0.5, 2, balance)[:3]
    rest = np.setdiff1d(np.arange(len(labels)), np.concatenate(first))
    want = first + [np.sort(rest[p]) for p in dirichlet.split(labels[rest], 3, rng, 0.1, 2, balance)]
    assert all(np.array_equal(a, b) for a, b in zip(parts, want))


def test_hybrid_needs_two_clients_and_takes_two():
    assert len(hybrid.split(np.repeat(np.arange(2), 10), 2, np.random.default_rng(0), 1.0, 1.0, min_size=1)) == 2
    with pytest.raises(PartitionError, match=r"^partition.kind = hybrid needs num_clients >= 2, got 1$"):
        hybrid.split(np.arange(10) % 2, 1, np.random.default_rng(0), 1.0, 1.0)


def test_hybrids_groups_split_an_odd_count_at_its_floor_half():
    g = hybrid.groups(5)
    assert g["balanced"].tolist() == [0, 1] and g["imbalanced"].tolist() == [2, 3, 4]
    assert g["balanced"].dtype.kind == "i"


def test_a_multi_domain_datasets_groups_are_integer_client_ranges():
    g = partitions.groups({"dataset": "digit5", "num_clients": 10, "kind": "dirichlet"})
    assert all(v.dtype.kind == "i" for v in g.values())
    assert [v.tolist() for v in g.values()] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


# ------------------------------------------------------------------------------------ pachinko and shards


def test_pachinko_takes_one_sample_a_client_and_refuses_none():
    labels = np.repeat(np.arange(4), 3)
    coarse = labels // 2
    parts = pachinko.split(labels, coarse, 12, np.random.default_rng(0), 1.0, 1.0, samples_per_client=1)
    assert sorted(int(p[0]) for p in parts) == list(range(12)) and all(len(p) == 1 for p in parts)
    with pytest.raises(PartitionError, match=r"^pachinko: 13 clients x 0 samples need 0 samples, the dataset has 12$"):
        pachinko.split(labels, coarse, 13, np.random.default_rng(0), 1.0, 1.0)


def test_pachinko_refuses_a_fine_label_under_two_coarse_labels():
    labels, coarse = np.array([0, 0, 1, 1]), np.array([0, 1, 1, 1])
    with pytest.raises(PartitionError, match=r"fine label 0 falls under coarse labels \[0, 1\]; each fine label needs"):
        pachinko.split(labels, coarse, 2, np.random.default_rng(0), 1.0, 1.0)


def test_shards_refuse_distinct_classes_they_cannot_give():
    with pytest.raises(
        PartitionError, match=r"^could not give every client shards of distinct classes; set partition.distinct: false$"
    ):
        # 8 shards of 5: six of class 0, two of class 1, and four clients each asking for both classes
        shards.split(np.repeat([0, 1], [30, 10]), 4, np.random.default_rng(0), 2, distinct=True)


# ------------------------------------------------------------------------------------------ long tail


def test_two_classes_long_tail_keeps_the_second_a_rhoth():
    assert long_tail_counts(np.array([100, 100]), 10.0).tolist() == [100, 10]
    assert long_tail_counts(np.array([100, 100, 100]), 100.0).tolist() == [100, 10, 1]


# ------------------------------------------------------------------------------------- kinds by name


@pytest.mark.parametrize("kind", ["nosuch", "base", "records", "__init__", "no-such", "../dirichlet"])
def test_a_name_that_is_no_kind_is_refused_by_name(kind):
    with pytest.raises(PartitionError, match=rf"^unknown partition kind '{re.escape(kind)}'$"):
        partitions.kind_module(kind)


def test_a_file_partition_of_a_multi_domain_dataset_is_the_files_lists(tmp_path):
    """A file lists indices of the whole training set: the domains do not split it again."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"clients": [[3, 0], [1, 2]]}))
    setting = {"kind": "file", "path": str(path), "sha256": None, "num_clients": 2, "train_size": 4}
    parts = partitions.make(np.zeros(4, dtype=np.int64), setting, domains=np.array([0, 0, 1, 1]))
    assert [p.tolist() for p in parts] == [[3, 0], [1, 2]]


# ------------------------------------------------------------------------------------------------- natural


def test_natural_clients_are_the_datasets_groups():
    groups = np.array([0, 2, 1, 0, 2, 1, 1])
    parts = natural.make(np.zeros(7, dtype=np.int64), {"num_clients": 3}, groups)
    assert [p.tolist() for p in parts] == [[0, 3], [2, 5, 6], [1, 4]]
    assert natural.split(np.zeros(0, dtype=np.int64), 0) == []


def test_natural_refuses_a_count_the_dataset_does_not_have():
    with pytest.raises(PartitionError, match=r"^the dataset has 3 natural clients, the setting asks for 4$"):
        natural.split(np.array([0, 1, 2]), 4)
    with pytest.raises(PartitionError, match=r"^partition kind 'natural' needs the dataset's client of each sample$"):
        natural.make(np.zeros(3, dtype=np.int64), {"num_clients": 3}, None)


# ---------------------------------------------------------------------------------------------------- file


def test_a_file_partitions_refusals_give_the_right_numbers(tmp_path):
    npz = tmp_path / "p.npz"
    np.savez(npz, client_0=np.array([1]), client_1=np.array([2]), client_5=np.array([3]))
    with pytest.raises(PartitionError, match=r"keys must be client_0 \.\. client_2; found client_5$"):
        file.read_file(npz, 3, 10)
    js = tmp_path / "p.json"
    for client, why in (({"a": 1}, "is not a list of indices"), ([[1, 2]], "is not a list of indices")):
        js.write_text(json.dumps({"clients": [[0], client]}))
        with pytest.raises(PartitionError, match=rf"^partition file {re.escape(str(js))}: client 1 {why}$"):
            file.read_file(js, 2, 10)
    js.write_text(json.dumps({"clients": [[0, 12, 5]]}))  # 0 is in range: the first index outside is named
    with pytest.raises(PartitionError, match=r"client 0 holds index 12, outside the training set's 0\.\.9$"):
        file.read_file(js, 1, 10)
    js.write_text("{not json")
    with pytest.raises(PartitionError, match=r"cannot be read \(JSONDecodeError: "):
        file.read_file(js, 1, 10)


def test_natural_clients_reach_the_kind_through_make():
    parts = partitions.make(np.zeros(4, dtype=np.int64), {"kind": "natural", "num_clients": 2}, np.array([1, 0, 1, 0]))
    assert [p.tolist() for p in parts] == [[1, 3], [0, 2]]


# ------------------------------------------------------------------------------------------ inner Dirichlet


def test_inner_dirichlet_draws_a_class_of_one_sample():
    """One client takes the whole set, so the class holding a single sample must be drawn too."""
    parts = inner_dirichlet.split(np.array([0, 0, 0, 1]), 1, np.random.default_rng(0), 0.5)
    assert parts[0].tolist() == [0, 1, 2, 3]


def test_inner_dirichlet_with_fewer_samples_than_clients_gives_empty_integer_clients():
    parts = inner_dirichlet.split(np.array([0, 1, 1]), 4, np.random.default_rng(0), 0.5)
    assert [p.tolist() for p in parts] == [[], [], [], []] and all(p.dtype == np.int64 for p in parts)
