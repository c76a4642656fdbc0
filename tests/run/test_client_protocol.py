"""The official codes' client-side protocol as settings: momentum kept across rounds
(client.keep_momentum) and a per-client hold-out (client.holdout), checked against oracles."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import rounding_bound
from fedrepro import data
from fedrepro.configure.schema import ConfigError
from fedrepro.configure.settings import resolve
from fedrepro.run.client import client_generator, holdout_split
from fedrepro.run.trainer import Trainer

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

SIZES = [23, 31, 17]
BATCH = 8


def _data(n: int):
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, 10, (n,), generator=gen)
    return data.TensorDataset(images, labels, 0.2860, 0.3530)


def _module() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))


def _parts(sizes):
    bounds = np.cumsum([0] + list(sizes))
    return [np.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]


def _trainer(tmp_path, client: dict, algorithm: str = "fedavg", sizes=SIZES, epochs: int = 2) -> Trainer:
    train = _data(sum(sizes))
    setting = resolve(
        {
            "algorithm": algorithm,
            "num_clients": len(sizes),
            "participation": 1.0,
            "local_epochs": epochs,
            "batch_size": BATCH,
            "device": "cpu",
            "rounds": 2,
            "eval_every": 1,
            "client": {"lr": 0.08, "lr_decay": 0.99, "momentum": 0.9, "weight_decay": 5e-4, **client},
        }
    )
    return Trainer(
        setting, tmp_path / algorithm, None, None, datasets=(train, _data(32)), parts=_parts(sizes), module=_module()
    )


def _oracle(sizes, rounds: int, epochs: int, keep: bool) -> torch.Tensor:
    """FedAvg with one torch.optim.SGD per client, created once (keep) or every round."""
    train = _data(sum(sizes))
    parts = [torch.as_tensor(p) for p in _parts(sizes)]
    global_model = _module()
    clients = [_module() for _ in sizes]
    optims = [torch.optim.SGD(m.parameters(), lr=0.08, momentum=0.9, weight_decay=5e-4) for m in clients]
    weights = torch.tensor(sizes, dtype=torch.float32) / sum(sizes)
    for t in range(rounds):
        for c, (model, index) in enumerate(zip(clients, parts)):
            model.load_state_dict(global_model.state_dict())
            if not keep:
                optims[c] = torch.optim.SGD(model.parameters(), lr=0.08, momentum=0.9, weight_decay=5e-4)
            for group in optims[c].param_groups:
                group["lr"] = 0.08 * 0.99**t
            gen = client_generator(1, t, c)  # the default run seed
            for _ in range(epochs):
                order = index[torch.randperm(len(index), generator=gen)]
                for start in range(0, len(index), BATCH):
                    x, y = train.batch(order[start : start + BATCH])
                    optims[c].zero_grad()
                    F.cross_entropy(model(x), y).backward()
                    optims[c].step()
        with torch.no_grad():
            for name, p in global_model.named_parameters():
                p.copy_(sum(w * dict(m.named_parameters())[name] for w, m in zip(weights, clients)))
    return torch.cat([p.detach().reshape(-1) for p in global_model.parameters()])


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "restarted"])
def test_momentum_equals_per_client_torch_sgd(tmp_path, keep):
    trainer = _trainer(tmp_path, {"keep_momentum": keep})
    for t in range(3):
        trainer.round(t)
    expected = _oracle(SIZES, rounds=3, epochs=2, keep=keep)
    other = _oracle(SIZES, rounds=3, epochs=2, keep=not keep)
    # float32 rounding of the same steps in other orders (conftest.rounding_bound) over 3 rounds of 2 epochs
    # of at most ceil(31 / 8) = 4 steps, plus one rounding per client of each round's weighted mean
    steps = 3 * 2 * -(-max(SIZES) // BATCH)
    bound = rounding_bound(_trainer(tmp_path / "bound", {"keep_momentum": keep}), steps, 0.08, 0.9) + 3 * (
        len(SIZES) + 1
    ) * 2.0**-24 * float(expected.abs().max())
    assert (expected - other).abs().max() > 100 * bound, "the oracle cannot tell kept from restarted momentum"
    torch.testing.assert_close(trainer.model.flat, expected, rtol=0, atol=bound)


def test_keep_momentum_without_momentum_is_the_plain_run_and_fednova_refuses_it():
    # FedLAW's code keeps buffers, but runs FedProx without momentum: the protocol applies where there are any
    assert resolve({"client": {"keep_momentum": True, "momentum": 0.0}}) == resolve({"client": {"momentum": 0.0}})
    with pytest.raises(ConfigError, match=r"client.keep_momentum cannot be combined with fednova"):
        resolve({"algorithm": "fednova", "client": {"keep_momentum": True, "momentum": 0.9}})
    with pytest.raises(ConfigError, match=r"client.*keep_momentum"):
        resolve({"client": {"keep_momentum": "yes"}})


def test_holdout_split_sizes_disjoint_and_seeded():
    part = np.arange(100, 153)
    kept, held = holdout_split(part, 0.3, seed=8, client=2)
    assert len(held) == int(0.3 * 53) == 15 and len(kept) == 38
    assert set(kept).isdisjoint(held) and set(kept) | set(held) == set(part)
    again = holdout_split(part, 0.3, seed=8, client=2)
    assert np.array_equal(kept, again[0]) and np.array_equal(held, again[1])
    assert not np.array_equal(np.sort(held), np.sort(holdout_split(part, 0.3, seed=9, client=2)[1]))
    assert not np.array_equal(np.sort(held), np.sort(holdout_split(part, 0.3, seed=8, client=3)[1]))


def test_holdout_is_the_same_for_every_method_and_keeps_full_weights(tmp_path):
    a = _trainer(tmp_path, {"holdout": 0.3}, "fedavg")
    b = _trainer(tmp_path, {"holdout": 0.3}, "fedprox")
    for c, n in enumerate(SIZES):
        assert len(a.inputs.client_index[c]) == n - int(0.3 * n)
        assert torch.equal(a.inputs.client_index[c], b.inputs.client_index[c])
        assert set(a.inputs.client_index[c].tolist()) < set(_parts(SIZES)[c].tolist())
    # a client trains on its kept samples only: its update equals that of a run whose partition is
    # just those samples; the aggregation weights stay the full partition's n_i (FedLAW's code)
    cohort = np.arange(len(SIZES))
    x = a.model.flat.clone()
    held = a.train_cohort(a.plan(0, cohort, x, a.client_lr(0)))
    kept_only = _trainer(tmp_path, {}, sizes=SIZES)
    kept_only.inputs.client_index = [a.inputs.client_index[c] for c in cohort]
    plain = kept_only.train_cohort(kept_only.plan(0, cohort, x, kept_only.client_lr(0)))
    full = _trainer(tmp_path, {})
    full = full.train_cohort(full.plan(0, cohort, x, a.client_lr(0)))
    assert torch.equal(held.deltas, plain.deltas) and not torch.allclose(held.deltas, full.deltas)
    assert held.sizes.tolist() == SIZES


def test_holdout_bounds_are_checked():
    with pytest.raises(ConfigError, match="holdout"):
        resolve({"client": {"holdout": 1.0}})
    with pytest.raises(ConfigError, match="holdout"):
        resolve({"client": {"holdout": -0.1}})
