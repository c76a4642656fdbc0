"""FedAvg's pathological split: label-sorted shards, classes_per_client a client."""

from __future__ import annotations

import numpy as np

from fedrepro.partitions.base import PartitionError


def split(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, classes_per_client: int, distinct: bool = True
) -> list[np.ndarray]:
    """FedAvg's pathological split: sort by label (stably), cut into num_clients*C equal shards,
    give each client C random shards; the remainder is dropped, as FedLab does.

    With ``distinct`` each client's shards carry different majority labels, so a client holds
    exactly C classes when shards align with classes ("#C = 2" as IMA's text describes it);
    FedLab's random assignment can hand a client two shards of one class (``distinct: false``).
    """
    total = num_clients * classes_per_client
    size = len(labels) // total
    order = np.argsort(labels, kind="stable")[: total * size].reshape(total, size)
    shard_label = np.array([np.bincount(labels[s]).argmax() for s in order])
    assign = rng.permutation(total).reshape(num_clients, classes_per_client)
    if distinct:
        assign = _make_distinct(assign, shard_label, rng)
    return [np.sort(order[row].reshape(-1)) for row in assign]


def _make_distinct(
    assign: np.ndarray, shard_label: np.ndarray, rng: np.random.Generator, max_sweeps: int = 1000
) -> np.ndarray:
    """Repair a random assignment by swaps until no client holds two shards of one label."""
    assign = assign.copy()
    n_clients, per = assign.shape
    classes = len(np.unique(shard_label))
    if per > classes:
        raise PartitionError(
            f"partition.classes_per_client = {per} exceeds the {classes} classes; choose at most {classes}"
        )
    for _ in range(max_sweeps):
        bad = list(_repeated_labels(assign, shard_label))
        if not bad:
            return assign
        for c, j in bad:
            for d in rng.permutation(n_clients):
                if d == c:
                    continue
                for k in rng.permutation(per):
                    mine, theirs = shard_label[assign[c, j]], shard_label[assign[d, k]]
                    keep_c = np.delete(shard_label[assign[c]], j)
                    keep_d = np.delete(shard_label[assign[d]], k)
                    if theirs not in keep_c and mine not in keep_d:
                        assign[c, j], assign[d, k] = assign[d, k], assign[c, j]
                        break
                else:
                    continue
                break
    raise PartitionError("could not give every client shards of distinct classes; set partition.distinct: false")


def _repeated_labels(assign: np.ndarray, shard_label: np.ndarray):
    """(client, slot) pairs whose shard repeats a label the client already holds."""
    for client, row in enumerate(shard_label[assign]):
        seen = set()
        for slot, label in enumerate(row):
            if label in seen:
                yield client, slot
            seen.add(label)


def make(labels: np.ndarray, setting: dict, groups=None) -> list[np.ndarray]:
    return split(
        labels,
        setting["num_clients"],
        np.random.default_rng(setting["seed"]),
        setting["classes_per_client"],
        setting["distinct"],
    )
