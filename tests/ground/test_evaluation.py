"""Scoring a model: eval mode (dropout off) everywhere a model is scored, train mode for training."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from conftest import float32_forward_bound, float64_cross_entropy, rounding_bound
from fedrepro import data
from fedrepro.configure.settings import resolve
from fedrepro.evaluation import evaluate, proxy_indices, split_test
from fedrepro.functional import FunctionalModel
from fedrepro.run.cohorts import sample_cohort
from fedrepro.run.trainer import Trainer

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats


def dropout_mlp(seed: int = 3) -> nn.Module:
    """An MLP with VGG-11's classifier pattern (dropout before each hidden Linear)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(), nn.Dropout(0.5), nn.Linear(784, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 10)
    )


def tiny_split(n: int = 256, seed: int = 0) -> data.TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=gen)
    images = (torch.randint(0, 60, (n, 1, 28, 28), generator=gen) + 19 * labels.view(-1, 1, 1, 1)).to(torch.uint8)
    return data.TensorDataset(images, labels, 0.0, 1.0)


def test_dropout_model_scores_the_same_twice_and_as_a_manual_eval_pass():
    model, test = dropout_mlp(), tiny_split()
    model.train()
    first = evaluate(model, test, batch_size=100)
    second = evaluate(model, test, batch_size=100)
    assert first == second
    model.eval()
    with torch.no_grad():
        x, y = test.batch(torch.arange(len(test)))
        logits = model(x)
    assert first[0] == float((logits.argmax(1) == y).float().mean())
    oracle, bound = float64_cross_entropy(model, x, y)  # the loss in float64, and float32's reach from it
    assert first[1] == pytest.approx(oracle, abs=bound)


def test_evaluation_restores_train_mode():
    model = dropout_mlp()
    model.train()
    evaluate(model, tiny_split(64))
    assert model.training and all(m.training for m in model.modules())


def test_teachers_logits_are_scored_in_eval_mode_and_training_stays_in_train_mode():
    module = dropout_mlp()
    module.train()
    net = FunctionalModel(module)
    w = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    x, _ = tiny_split(64).batch(torch.arange(64))
    a, b = net.logits(w, x, 16), net.logits(w, x, 16)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    module.eval()
    with torch.no_grad():
        # two float32 passes (batches of 16 and of 64), each within the forward bound of the exact logits
        torch.testing.assert_close(a, module(x), rtol=0, atol=float(2 * float32_forward_bound(module, x).max()))
    module.train()
    assert module.training
    torch.manual_seed(0)
    assert not torch.equal(net(w, x), net(w, x))  # training passes draw dropout masks


def _trainer(tmp_path, name: str, mode: str = "off") -> Trainer:
    train, test = tiny_split(240, seed=1), tiny_split(128, seed=2)
    parts = [np.arange(i * 40, (i + 1) * 40) for i in range(6)]
    setting = resolve(
        {
            "model": "mlp",
            "num_clients": 6,
            "participation": 4 / 6,
            "local_epochs": 1,
            "batch_size": 16,
            "device": "cpu",
            "rounds": 3,
            "eval_every": 1,
            "client": {"lr": 0.05, "momentum": 0.5},
        }
    )
    trainer = Trainer(setting, tmp_path / name, None, None, datasets=(train, test), parts=parts, module=dropout_mlp())
    trainer.cohort_mode = mode
    return trainer


def test_a_run_reports_eval_mode_accuracy_and_trains_in_train_mode(tmp_path):
    trainer = _trainer(tmp_path, "run")
    modes = []
    hook = trainer.model.module[1].register_forward_hook(lambda m, i, o: modes.append(m.training))
    row = trainer.round(0)
    hook.remove()
    assert modes[0] is True and modes[-1] is False  # clients trained in train mode, the test pass in eval
    assert trainer.model.module.training
    assert row["test_acc"] == evaluate(trainer.model.module, trainer.inputs.test)[0]


def test_a_dropout_model_trains_with_the_same_masks_batched_or_not(tmp_path):
    """cohort_mode "on" with a dropout model trains batched, drawing each client's masks as when it trains
    alone (tests/run/test_batched.py compares the updates): the runs agree to float rounding and the global
    generator ends in the same state."""
    rows, states = {}, {}
    bound = rounding_bound(_trainer(tmp_path, "bound"), 2 * 3, 0.05, 0.5)  # 2 rounds of 3 steps (40 samples)
    for mode in ("off", "on"):
        trainer = _trainer(tmp_path, mode, mode)
        cohort = sample_cohort(1, 0, 6, trainer.k)
        assert trainer.train_together(cohort) == (mode == "on")
        torch.manual_seed(5)
        rows[mode] = [trainer.round(t) for t in range(2)]
        states[mode] = torch.get_rng_state()
        assert bool(trainer.batched and trainer.batched.rounds_trained) == (mode == "on")
    assert torch.equal(states["off"], states["on"])
    for off, on in zip(rows["off"], rows["on"]):
        assert on["train_loss"] == pytest.approx(off["train_loss"], abs=10 * bound)  # as tests/run/test_batched.py
        # a count, not a rounding: one of the 128 test samples may sit within rounding of a tie
        assert on["test_acc"] == pytest.approx(off["test_acc"], abs=1 / 128)


def _datasets():
    from fedrepro.data.agnews import TextDataset
    from fedrepro.data.cifar import ImageDataset
    from fedrepro.data.synthetic import FeatureDataset

    labels = torch.arange(40) % 10
    yield data.TensorDataset(torch.arange(40 * 4, dtype=torch.uint8).view(40, 1, 2, 2), labels, 0.5, 2.0)
    yield ImageDataset(
        torch.arange(40 * 12, dtype=torch.int64).to(torch.uint8).view(40, 3, 2, 2),
        labels,
        torch.tensor([0.1, 0.2, 0.3]),
        torch.tensor([0.5, 0.6, 0.7]),
    )
    yield FeatureDataset(torch.randn(40, 3), labels, torch.arange(40) // 4)
    yield TextDataset(torch.arange(40 * 5).view(40, 5), torch.ones(40, 5, dtype=torch.int64), labels)


@pytest.mark.parametrize("dataset", list(_datasets()), ids=lambda d: type(d).__name__)
def test_the_holdout_split_works_for_every_dataset_class(dataset):
    """The rest and the hold-out are the same class, keep its normalisation, and partition the samples."""
    rest, proxy = split_test(dataset, 20, seed=8)
    index = proxy_indices(dataset.labels, 20, 8)
    assert type(rest) is type(dataset) and type(proxy) is type(dataset)
    assert len(rest) == 20 and len(proxy) == 20
    whole = dataset.batch(torch.arange(40))
    held = proxy.batch(torch.arange(20))
    keep = torch.ones(40, dtype=torch.bool)
    keep[index] = False
    rest_batch = rest.batch(torch.arange(20))
    for a, b, pick in ((held, whole, index), (rest_batch, whole, keep.nonzero().squeeze(1))):
        xa, xb = (a[0].input_ids, b[0].input_ids) if hasattr(a[0], "input_ids") else (a[0], b[0])
        torch.testing.assert_close(xa, xb[pick], rtol=0, atol=0)
        assert torch.equal(a[1], b[1][pick])
    assert split_test(dataset, 0, seed=8) == (dataset, None)


def test_global_train_loss_is_the_size_weighted_mean_of_the_clients_losses_in_eval_mode(tmp_path):
    """Oracle: a hand loop over every client's samples, one sample at a time, weighted n_i / n. The
    clients' sizes differ, so an unweighted mean of the client means would not match; the model has
    dropout, so a train-mode pass would not match either."""
    train, test = tiny_split(240, seed=1), tiny_split(64, seed=2)
    cuts = np.cumsum([0, 10, 20, 30, 40, 60, 80])
    parts = [np.arange(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    setting = resolve(
        {
            "model": "mlp",
            "num_clients": 6,
            "participation": 0.5,
            "local_epochs": 1,
            "batch_size": 16,
            "device": "cpu",
            "rounds": 5,
            "eval_every": 1,
            "evaluation": {"global_train_loss_every": 2},
            "client": {"lr": 0.05},
        }
    )
    trainer = Trainer(setting, tmp_path / "run", None, None, datasets=(train, test), parts=parts, module=dropout_mlp())
    trainer.run(progress=False)
    logged = [row["global_train_loss"] for row in trainer.rows]
    assert [not np.isnan(v) for v in logged] == [True, True, False, True, True]  # rounds 1, 2, 4 and the last
    model = trainer.model.module
    model.eval()
    oracle = 0.0
    twin = copy.deepcopy(model).double()  # the oracle in float64
    with torch.no_grad():
        for part in parts:
            losses = [
                float(nn.functional.cross_entropy(twin(train.batch(torch.tensor([i]))[0].double()), train.labels[[i]]))
                for i in part
            ]
            oracle += len(part) / 240 * (sum(losses) / len(losses))
    x, y = train.batch(torch.arange(240))
    bound = float64_cross_entropy(model, x, y)[1]  # float32's reach from the exact mean loss
    assert logged[-1] == pytest.approx(oracle, abs=bound)
    assert abs(trainer.rows[-1]["train_loss"] - logged[-1]) > 10 * bound  # another quantity, beyond rounding


def test_the_global_train_loss_of_augmented_data_neither_augments_nor_draws_from_the_rng():
    from fedrepro.data.cifar import ImageDataset
    from fedrepro.evaluation import global_train_loss

    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 255, (24, 3, 32, 32), generator=gen, dtype=torch.uint8)
    train = ImageDataset(images, torch.randint(0, 10, (24,), generator=gen), augment=True)
    torch.manual_seed(5)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    before = torch.get_rng_state()
    value = global_train_loss(model, train, [torch.arange(10), torch.arange(10, 24)], batch_size=7)
    assert torch.equal(before, torch.get_rng_state())
    plain = ImageDataset(images, train.labels)
    # two float32 computations (batches of 7 and of 24), each within the bound of the exact mean loss
    bound = float64_cross_entropy(model, *plain.batch(torch.arange(24)))[1]
    assert value == pytest.approx(evaluate(model, plain)[1], abs=2 * bound)


# ---------------------------------------------------------------- FedLAW Table 6: long-tailed proxy, balanced sampling


def test_a_long_tailed_proxy_keeps_its_size_and_the_exponential_profile():
    from fedrepro.evaluation import proxy_class_counts, proxy_indices, split_test

    assert list(proxy_class_counts(100, 10)) == [10] * 10
    counts = proxy_class_counts(100, 10, 10.0)
    share = 100 * 10.0 ** (-np.arange(10) / 9)
    share = share / share.sum() * 100
    assert counts.sum() == 100 and np.all(np.abs(counts - share) < 1) and np.all(np.diff(counts) <= 0)
    assert counts[0] >= 9 * counts[-1]  # rho 10 between the first and the last class, up to rounding
    labels = torch.as_tensor(np.repeat(np.arange(10), 50))
    index = proxy_indices(labels, 100, seed=3, rho=10.0)
    assert list(np.bincount(labels[index].numpy(), minlength=10)) == list(counts)
    test = data.base.TensorDataset(torch.zeros(500, 1, 2, 2, dtype=torch.uint8), labels, 0.0, 1.0)
    rest, proxy = split_test(test, 100, 3, 10.0)
    assert len(proxy) == 100 and len(rest) == 400 and torch.equal(proxy.labels, labels[index])


def test_balanced_sampling_draws_every_class_equally_often():
    from fedrepro.algorithms.proxy import epoch_batches

    labels = torch.as_tensor([0] * 90 + [1] * 10)
    g = torch.Generator().manual_seed(0)
    drawn = torch.cat([torch.cat(epoch_batches(100, 32, g, "cpu", labels)) for _ in range(200)])
    assert len(drawn) == 20000
    share = float((labels[drawn] == 1).double().mean())
    # 20,000 draws of a fair coin: the share is within 5 standard deviations (0.0177) of 1/2
    assert abs(share - 0.5) < 0.018
    plain = torch.cat(epoch_batches(100, 32, torch.Generator().manual_seed(0), "cpu"))
    assert sorted(plain.tolist()) == list(range(100)), "without it, one epoch is a permutation"


def test_a_long_tailed_proxy_without_a_proxy_is_refused():
    from fedrepro.configure.schema import ConfigError

    with pytest.raises(
        ConfigError,
        match=r"evaluation.proxy_long_tail_rho = 10 shapes the proxy hold-out, but "
        r"evaluation.proxy_holdout is 0",
    ):
        resolve({"dataset": "cifar10", "model": "simplecnn", "evaluation": {"proxy_long_tail_rho": 10}})
