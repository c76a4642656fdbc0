"""BatchNorm running statistics in the flat engine (setting ``batchnorm``): a second flat vector of
buffers, started from the global one by every client, averaged with the data-size weights of the
round, used in eval mode and checkpointed; ``batch_stats`` keeps the engine's earlier behaviour."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedrepro import data, models
from fedrepro.configure.schema import ConfigError
from fedrepro.configure.settings import resolve
from fedrepro.evaluation import evaluate
from fedrepro.flat import FlatModel
from fedrepro.identity import identity_setting
from fedrepro.run import checkpoint
from fedrepro.run.client import client_generator
from fedrepro.run.trainer import Trainer

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

SIZES = [40, 56]
BATCH = 16


def _data(n: int = sum(SIZES)):
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, 10, (n,), generator=gen)
    return data.TensorDataset(images, labels, 0.5, 0.5)


def _parts():
    return [np.arange(0, SIZES[0]), np.arange(SIZES[0], sum(SIZES))]


def _setting(**extra) -> dict:
    return resolve(
        {
            "dataset": "cifar10",
            "model": "resnet8",
            "num_clients": 2,
            "participation": 1.0,
            "rounds": 2,
            "batch_size": BATCH,
            "device": "cpu",
            "eval_every": 1,
            "client": {"lr": 0.05, "momentum": 0.9},
            **extra,
        }
    )


def _small() -> nn.Module:
    """A conv, a BatchNorm with running statistics and a linear head: small enough for an oracle."""
    torch.manual_seed(4)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, stride=2),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


def _test_set() -> data.TensorDataset:
    train = _data()
    return data.TensorDataset(train.images[:40], train.labels[:40], 0.5, 0.5)


def _trainer(tmp_path, module=None, **extra) -> Trainer:
    return Trainer(
        _setting(**extra), tmp_path, None, None, datasets=(_data(), _test_set()), parts=_parts(), module=module
    )


def _fedavg_oracle(initial: nn.Module, rounds: int, lrs: list[float], train: data.TensorDataset):
    """FedAvg written out plainly: every client trains a copy of the global module with torch.optim.SGD on
    the engine's batch order, the server takes the data-size weighted mean of the client models. Returns
    the final module and each round's mean client training loss (the engine's ``train_loss``)."""
    global_model = copy.deepcopy(initial)
    w = torch.tensor(SIZES, dtype=torch.float64) / sum(SIZES)
    losses = []
    for t in range(rounds):
        finals, client_losses = [], []
        for c, part in enumerate(_parts()):
            model = copy.deepcopy(global_model)
            opt = torch.optim.SGD(model.parameters(), lr=lrs[t], momentum=0.9)
            index = torch.as_tensor(part)
            order = index[torch.randperm(len(index), generator=client_generator(1, t, c))]
            batch_losses = []
            for start in range(0, len(index), BATCH):
                x, y = train.batch(order[start : start + BATCH])
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                batch_losses.append(loss.item())
            finals.append(model)
            client_losses.append(sum(batch_losses) / len(batch_losses))
        with torch.no_grad():
            for p, *ps in zip(global_model.parameters(), *(m.parameters() for m in finals)):
                p.copy_(sum(wi * q.double() for wi, q in zip(w, ps)).to(p.dtype))
        losses.append(sum(client_losses) / len(client_losses))
    return global_model, losses


def test_batch_stats_run_equals_plain_fedavg_with_torch_sgd(tmp_path, float64_engine):
    """``batch_stats``: no buffers, BatchNorm normalises with batch statistics in training and scoring
    alike, and two rounds of the engine equal two rounds of FedAvg written with torch.optim.SGD in this
    process.

    Both run in float64, because in float32 the two paths (flat views and a hand-written SGD step against
    per-tensor ones) may pick different kernels, and a rounding difference of one unit can flip a ReLU
    whose input lies within it of zero: a flip moves the weights by one sample's gradient through one
    unit, up to 6.4e-5 on an AVX-512 machine, within sight of what a wrong weight moves. In float64 the
    unit roundoff is u = 2**-53 = 1.1e-16; a gradient entry is a sum of at most n = 16 x 32 x 32 = 16384
    products (the first convolution's weights over a batch), so each differs by at most n * u = 1.8e-12
    of its absolute sum, and 2 rounds x 4 steps x lr 0.05 with momentum 0.9 (a step at most 10 gradients)
    keep the parameters' difference below 1e-10 for gradients below 10, and a flip needs an input within
    1e-12 of zero. 1e-9 is above that, and 1e-6 of what one round moves (the last assert checks it)."""
    tolerance = 1e-9
    train = float64_engine(_data().images, _data().labels, 0.5, 0.5)
    test = float64_engine(train.images[:40], train.labels[:40], 0.5, 0.5)
    trainer = Trainer(_setting(batchnorm="batch_stats"), tmp_path, None, None, datasets=(train, test), parts=_parts())
    assert trainer.model.flat.dtype == torch.float64 and len(trainer.model.buffers) == 0
    initial = copy.deepcopy(trainer.model.module)
    assert not any(m.track_running_stats for m in initial.modules() if isinstance(m, nn.BatchNorm2d))
    lrs = [trainer.client_lr(t) for t in range(2)]
    rows = [trainer.round(t) for t in range(2)]
    oracle, losses = _fedavg_oracle(initial, 2, lrs, train)
    expected = torch.cat([p.detach().reshape(-1) for p in oracle.parameters()])
    torch.testing.assert_close(trainer.model.flat, expected, rtol=0, atol=tolerance)
    # a mean loss of ~2.3 over at most 8 batches: its rounding differences are those of the parameters
    assert rows[-1]["train_loss"] == pytest.approx(losses[-1], rel=tolerance, abs=0)
    assert rows[-1]["test_loss"] == pytest.approx(evaluate(oracle, test)[1], rel=tolerance, abs=0)
    one_round, _ = _fedavg_oracle(initial, 1, lrs, train)
    moved = torch.cat([p.detach().reshape(-1) for p in one_round.parameters()])
    assert (trainer.model.flat - moved).abs().max() > 1e6 * tolerance, "the tolerance would hide a whole round"


def test_running_stats_is_the_default_for_batchnorm_models_only():
    assert _setting()["batchnorm"] == "running_stats"
    # a model without BatchNorm trains with the key resolved, and its id leaves it out (no hash change)
    assert "batchnorm" not in identity_setting(resolve({"model": "mlp"}))
    module = models.build("resnet20", "cifar10")
    assert all(m.track_running_stats for m in module.modules() if isinstance(m, nn.BatchNorm2d))
    plain = models.build("resnet20", "cifar10", batchnorm="batch_stats")
    assert not any(m.track_running_stats for m in plain.modules() if isinstance(m, nn.BatchNorm2d))
    with pytest.raises(ConfigError, match="batchnorm"):
        _setting(batchnorm="running")


def test_flat_buffers_are_views_that_batchnorm_updates_in_place():
    module = _small()
    flat = FlatModel(module, torch.device("cpu"))
    bn = module[1]
    assert len(flat.buffers) == 8 and bn.running_mean.data_ptr() == flat.buffers.data_ptr()
    module(torch.randn(8, 3, 9, 9))
    assert torch.equal(flat.buffers[:4], bn.running_mean) and torch.equal(flat.buffers[4:], bn.running_var)
    assert not torch.equal(flat.buffers[:4], torch.zeros(4)), "train-mode forward did not move the statistics"


def _oracle_clients(initial: nn.Module, lr: float, train: data.TensorDataset):
    """Each client trained alone with torch.optim.SGD from the global module, on the engine's batches."""
    finals = []
    for c, part in enumerate(_parts()):
        model = copy.deepcopy(initial)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        index = torch.as_tensor(part)
        order = index[torch.randperm(len(index), generator=client_generator(1, 0, c))]
        for start in range(0, len(index), BATCH):
            x, y = train.batch(order[start : start + BATCH])
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        finals.append(model)
    return finals


def test_aggregated_running_statistics_are_the_weighted_mean_of_the_clients(tmp_path, float64_engine):
    """In float64, for the reason the test above gives: a client's later batches see weights its SGD steps
    moved, so float32 kernels that differ between the paths would show. The statistics are means over at most
    n = 16 x 16 x 16 = 4096 values of size ~1 per channel, through 3 or 4 steps: n * u = 4.5e-13 each, so
    1e-10 is far above float64 rounding and far below the clients' difference (asserted)."""
    train = float64_engine(_data().images, _data().labels, 0.5, 0.5)
    test = float64_engine(train.images[:40], train.labels[:40], 0.5, 0.5)
    trainer = Trainer(_setting(), tmp_path, None, None, datasets=(train, test), parts=_parts(), module=_small())
    assert trainer.model.buffers.dtype == torch.float64
    initial = copy.deepcopy(trainer.model.module)
    cohort = np.arange(2)
    trainer.train_cohort(trainer.plan(0, cohort, trainer.model.flat.clone(), trainer.client_lr(0)))
    clients = _oracle_clients(initial, trainer.client_lr(0), train)
    w = torch.tensor(SIZES, dtype=torch.float64) / sum(SIZES)
    bn = trainer.model.module[1]
    for name in ("running_mean", "running_var"):
        values = [getattr(m[1], name) for m in clients]
        assert (values[0] - values[1]).abs().max() > 1e4 * 1e-10, "the clients' statistics should differ"
        torch.testing.assert_close(getattr(bn, name), w[0] * values[0] + w[1] * values[1], rtol=0, atol=1e-10)


def test_eval_mode_normalises_with_the_averaged_statistics(tmp_path):
    trainer = _trainer(tmp_path, module=_small())
    trainer.round(0)
    module = trainer.model.module
    bn = module[1]
    seen = {}
    bn.register_forward_hook(lambda m, inputs, output: seen.update(x=inputs[0], y=output))
    module.eval()  # evaluate switches to eval mode on main; here the test does it
    with torch.no_grad():
        module(_test_set().batch(torch.arange(40))[0])
    manual = nn.BatchNorm2d(4).eval()
    with torch.no_grad():
        manual.weight.copy_(bn.weight)
        manual.bias.copy_(bn.bias)
        manual.running_mean.copy_(trainer.model.buffers[:4])
        manual.running_var.copy_(trainer.model.buffers[4:])
        # the same formula, possibly by another kernel ((x - mean) / std * w + b, or x * a + c with a and c
        # folded first): either rounds at most 4 times, each by u = 2**-24 of its terms' magnitude
        mean, var = manual.running_mean[:, None, None], manual.running_var[:, None, None]
        scale = (bn.weight[:, None, None] / (var + bn.eps).sqrt()).abs()
        terms = (seen["x"].abs() * scale + mean.abs() * scale + bn.bias[:, None, None].abs()).max()
        torch.testing.assert_close(seen["y"], manual(seen["x"]), rtol=0, atol=2 * 4 * 2**-24 * float(terms))
        batch_normalised = F.batch_norm(seen["x"], None, None, bn.weight, bn.bias, training=True)
    assert not torch.allclose(seen["y"], batch_normalised, atol=1e-3), "eval mode used batch statistics"


def test_stop_and_resume_with_running_statistics_equals_uninterrupted(tmp_path):
    straight = _trainer(tmp_path / "a", module=_small(), rounds=4)
    straight.run(progress=False)
    _trainer(tmp_path / "b", module=_small(), rounds=4).run(progress=False, stop_after=2)
    assert len(checkpoint.load(tmp_path / "b" / "checkpoint.pt")["buffers"]) == 8
    resumed = _trainer(tmp_path / "b", module=_small(), rounds=4)
    summary = resumed.run(progress=False)
    assert summary["resumed"] is True
    a, b = checkpoint.load(tmp_path / "a" / "model.pt"), checkpoint.load(tmp_path / "b" / "model.pt")
    assert torch.equal(a["x"], b["x"]) and torch.equal(a["buffers"], b["buffers"])
    assert not torch.equal(a["buffers"], FlatModel(_small(), torch.device("cpu")).buffers)
