"""What a run trains and is scored on, built before its first round: the data on the device, the partition
its folder names, the validation, hold-out and proxy splits, label corruption, class shares and client groups.

Every split here is drawn from the run's seed through its own stream (``fedrepro.streams``), never from
torch's global generator, so building the inputs leaves the model's initialisation untouched.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedrepro import data, partitions
from fedrepro.evaluation import split_test, validation_set, validation_split
from fedrepro.identity import partition_setting
from fedrepro.partitions import records as partition_records
from fedrepro.partitions.base import PartitionError, class_counts, content_hash
from fedrepro.run.client import holdout_split


@dataclass
class RunInputs:
    train: data.TensorDataset  # the training split, its corrupted labels swapped
    test: data.TensorDataset  # what every evaluation scores: the test set (or validation samples)
    # without the proxy hold-out
    proxy: data.TensorDataset | None  # the comparison's held-out proxy set (evaluation.proxy_holdout)
    parts: list[np.ndarray]  # each client's samples (validation samples removed)
    partition_hash: str  # the content hash of the partition as read
    client_index: list[torch.Tensor]  # the samples each client trains on (its hold-out removed)
    train_parts: list[torch.Tensor]  # every client's samples, held-out ones included
    client_sizes: torch.Tensor  # n_i, the aggregation weights' data sizes
    client_groups: dict[str, np.ndarray]  # named groups the partition defines (hybrid halves, domains)
    class_counts: np.ndarray | None = None  # clients x classes (setting log_cohort_classes)
    class_share: torch.Tensor | None = None  # each client's class distribution
    global_share: torch.Tensor | None = None  # the data-size weighted class distribution


def build(
    setting: dict,
    device: torch.device,
    partition_dir: str | Path | None,
    data_root: str | Path | None,
    datasets: tuple | None = None,
    parts: list[np.ndarray] | None = None,
) -> RunInputs:
    """``datasets`` (train, test) and ``parts`` replace loading from disk (benchmark, tests)."""
    if datasets is None:
        datasets = tuple(
            data.load(
                setting["dataset"],
                data_root,
                train=split,
                preprocess=setting["preprocess"],
                pretrained=setting["pretrained"],
            )
            for split in (True, False)
        )
    train, test = (d.to(device) for d in datasets)
    # the partition its path names, not another one copied there (partition.json is compared)
    parts = partition_records.load(partition_dir, partition_setting(setting)) if parts is None else parts
    partition_hash = content_hash(parts)
    if len(parts) != setting["num_clients"]:
        raise PartitionError(
            f"partition {partition_dir} has {len(parts)} clients, the setting "
            f"asks for num_clients = {setting['num_clients']}; rerun its partition step"
        )
    # evaluation.validation (tuning runs): the clients train on the rest, and every evaluation scores the
    # pooled validation samples instead of the test set (evaluation.validation_split)
    validation = setting["evaluation"]["validation"]
    if validation:
        parts, held = validation_split(parts, validation, setting["seed"])
        test = validation_set(train, held)
    # client.holdout: each client trains on the rest and the held-out samples serve nothing (FedLAW's
    # code only logs an accuracy on them); the aggregation weights keep the full n_i, as that code does
    holdout = setting["client"]["holdout"]
    trained = [holdout_split(p, holdout, setting["seed"], i)[0] if holdout else p for i, p in enumerate(parts)]
    if setting["corruption"]["fraction"]:  # FedLAW Table 8: the first clients' labels with two classes swapped
        train = swap_labels(train, parts, setting["corruption"], setting["num_clients"])
    client_sizes = torch.tensor([len(p) for p in parts], dtype=torch.float32, device=device)
    test, proxy = split_test(
        test, setting["evaluation"]["proxy_holdout"], setting["seed"], setting["evaluation"]["proxy_long_tail_rho"]
    )
    inputs = RunInputs(
        train,
        test,
        proxy,
        parts,
        partition_hash,
        client_index=[torch.as_tensor(p, device=device) for p in trained],
        train_parts=[torch.as_tensor(p, device=device) for p in parts],
        client_sizes=client_sizes,
        client_groups=partitions.groups(partition_setting(setting)),
    )
    # FedLAW Fig. 7 / Table 11: each client's class distribution (rows) and the data-size weighted global one
    if setting["log_cohort_classes"]:
        labels = train.labels.cpu().numpy()
        counts = class_counts(labels, parts, int(labels.max()) + 1)
        inputs.class_counts = counts
        inputs.class_share = torch.as_tensor(
            counts / counts.sum(1, keepdims=True).clip(min=1), device=device, dtype=torch.float32
        )
        inputs.global_share = inputs.class_share.T @ (client_sizes / client_sizes.sum())
    return inputs


def swap_labels(train, parts: list[np.ndarray], corruption: dict, num_clients: int):
    """A copy of ``train`` whose samples of the first round(fraction x num_clients) clients have the classes
    ``swap`` = (a, b) exchanged (a becomes b, b becomes a); the partition is disjoint, so no other client
    is touched. The test set keeps its true labels."""
    corrupted = round(corruption["fraction"] * num_clients)
    index = torch.as_tensor(np.concatenate([parts[i] for i in range(corrupted)]), device=train.labels.device)
    a, b = corruption["swap"]
    labels = train.labels.clone()
    picked = labels[index]
    labels[index] = torch.where(picked == a, b, torch.where(picked == b, a, picked))
    out = copy.copy(train)
    out.labels = labels
    return out
