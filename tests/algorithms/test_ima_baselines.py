"""IMA's three extra baselines: FedASAM's two-pass step, FedGMA's sign mask and FedFA's anchors and
calibration against hand-computed values; two real rounds each on the FMNIST CNN, resumed exactly."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conftest import make_partition
from fedrepro.algorithms.fedasam import AdaptiveSharpness
from fedrepro.algorithms.fedfa import FeatureAnchors
from fedrepro.algorithms.fedgma import MaskedAveraging
from fedrepro.configure import schema, settings
from fedrepro.data import TensorDataset
from fedrepro.flat import FlatModel
from fedrepro.parts import ClientRun, RoundUpdates
from fedrepro.run import checkpoint
from fedrepro.run.client import LocalSGD

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats


def zero_linear(n_in: int, n_out: int) -> FlatModel:
    module = nn.Linear(n_in, n_out)
    model = FlatModel(module, torch.device("cpu"))
    model.flat.zero_()
    return model


def updates_with(deltas, sizes) -> RoundUpdates:
    k = len(deltas)
    return RoundUpdates(0, torch.arange(k), deltas, sizes, torch.ones(k), torch.zeros(k), 0.1)


# --------------------------------------------------------------------------- FedASAM


def test_asam_step_by_hand():
    """Linear(1 -> 2) at w = 0, one sample x = 1 of class 0.

    g = softmax(0) - e_0 = (-1/2, 1/2) on W and on b. T = eta on W (|0| + eta), 1 on b, so
    ||T g|| = sqrt((eta^2 + 1) / 2) and eps = rho T^2 g / ||T g||; the logits at w + eps are
    (-a, a) with a = rho (eta^2 + 1) / (2 ||T g||), whose CE gradient is (s - 1, 1 - s), s = 1/(1 + e^{2a}).
    """
    rho, eta, lr, wd = 0.7, 0.2, 0.1, 0.01
    model = zero_linear(1, 2)
    data = TensorDataset(torch.full((1, 1), 255, dtype=torch.uint8), torch.tensor([0]), 0.0, 1.0)
    norm = math.sqrt((eta**2 + 1) / 2)
    a = rho * (eta**2 + 1) / (2 * norm)
    s = 1 / (1 + math.exp(2 * a))
    g_perturbed = torch.tensor([s - 1, 1 - s])

    objective = AdaptiveSharpness(rho, eta)
    run = ClientRun(0, 0, model, model.flat.clone(), lr)
    objective.begin(run)
    loss = objective(run, *data.batch(torch.tensor([0])))
    assert float(loss) == pytest.approx(math.log(2))  # the loss at w, not at w + eps
    torch.testing.assert_close(model.flat, torch.zeros(4))  # w restored
    # flat order: W (2x1), then b (2)
    torch.testing.assert_close(model.grad, torch.cat([g_perturbed, g_perturbed]))

    # the same through LocalSGD: the descent step uses g' (+ weight decay on w = 0)
    model.flat.zero_()
    result = LocalSGD(momentum=0.9, weight_decay=wd).train(
        ClientRun(0, 0, model, torch.zeros(4), lr),
        data,
        torch.tensor([0]),
        1,
        1,
        torch.Generator().manual_seed(0),
        objective=AdaptiveSharpness(rho, eta),
    )
    assert result.steps == 1
    torch.testing.assert_close(model.flat, -lr * torch.cat([g_perturbed, g_perturbed]))


def test_asam_adapts_to_weight_magnitude():
    """At w != 0 the ascent is scaled per weight entry by (|w| + eta)^2; biases are not scaled."""
    rho, eta = 0.5, 0.1
    model = zero_linear(2, 2)
    model.flat.copy_(torch.tensor([1.0, -2.0, 0.0, 3.0, 0.5, -0.5]))  # W (2x2), b (2)
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([1])
    w0 = model.flat.clone()
    model.loss_and_grad(torch.nn.functional.cross_entropy, x, y)
    g = model.grad.clone()
    t = torch.cat([w0[:4].abs() + eta, torch.ones(2)])
    eps = rho * t * t * g / (t * g).norm()
    # oracle: the gradient at w0 + eps, computed on a separate copy of the model
    probe = zero_linear(2, 2)
    probe.flat.copy_(w0 + eps)
    probe.loss_and_grad(torch.nn.functional.cross_entropy, x, y)

    objective = AdaptiveSharpness(rho, eta)
    run = ClientRun(0, 0, model, w0, 0.1)
    objective.begin(run)
    objective(run, x, y)
    torch.testing.assert_close(model.flat, w0)
    torch.testing.assert_close(model.grad, probe.grad)
    assert not torch.allclose(probe.grad, g)


def test_asam_defaults_follow_table5():
    # null is resolved before the run is named, from the model's small_cnn fact (models/*.yaml)
    cnn = settings.resolve({"algorithm": "fedasam", "model": "cnn"})
    assert cnn["fedasam"] == {"rho": 0.7, "eta": 0.2}
    assert settings.resolve({"algorithm": "fedasam", "model": "cnn", "fedasam": {"rho": 0.7, "eta": 0.2}}) == cnn
    resnet = settings.resolve({"algorithm": "fedasam", "model": "resnet18_gn2", "dataset": "cifar10"})
    assert resnet["fedasam"] == {"rho": 0.2, "eta": 0.05}


# --------------------------------------------------------------------------- FedGMA

DELTAS = torch.tensor([[1.0, 2.0, -1.0, 0.5], [2.0, -1.0, -3.0, 0.5], [1.0, 1.0, -1.0, -0.5]])
SIZES = torch.tensor([1.0, 1.0, 2.0])
MEAN = torch.tensor([1.25, 0.75, -1.5, 0.0])  # weights (1/4, 1/4, 1/2)


def test_gma_masks_coordinates_without_agreement():
    # sign sums (3, 1, -3, 1); eps = 0.8 keeps |s| > 2.4: coordinates 0 and 2, where all clients agree
    d = MaskedAveraging(0.1, 0.8)(torch.zeros(4), updates_with(DELTAS, SIZES))
    torch.testing.assert_close(d, MEAN - 0.1 * torch.tensor([4 / 3, 0.0, -5 / 3, 0.0]))


def test_gma_keeps_only_the_agreeing_clients():
    # eps = 0.3 keeps every coordinate; on 1 and 3 one client disagrees with the majority and is left out
    updates = updates_with(DELTAS, SIZES)
    d = MaskedAveraging(0.1, 0.3)(torch.zeros(4), updates)
    torch.testing.assert_close(d, MEAN - 0.1 * torch.tensor([4 / 3, 3 / 3, -5 / 3, 1 / 3]))
    assert float(updates.info["gma_kept"]) == 1.0


def test_gma_with_zero_lr_is_fedavg():
    d = MaskedAveraging(0.0, 0.8)(torch.zeros(4), updates_with(DELTAS, SIZES))
    torch.testing.assert_close(d, MEAN)


# --------------------------------------------------------------------------- FedFA


def anchors_objective(round_=1, lam=0.1, momentum=0.5, calibrate_after=100.0, lr=1e-3, model=None):
    model = model or zero_linear(3, 3)  # a bare classifier: the features are the inputs
    objective = FeatureAnchors(torch.eye(3), lam, momentum, calibrate_after, lr)
    run = ClientRun(round_, 7, model, model.flat.clone(), lr)
    objective.begin(run)
    return objective, run


def test_anchor_loss_by_hand():
    objective, _ = anchors_objective()
    f = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    y = torch.tensor([0, 0, 1])
    # class 0 has 2 samples: (0 + 1) / 2; class 1 has one: ||(0,2,0) - e_1||^2 = 1; / C = 3; * 0.1
    assert float(objective.anchor_loss(f, y)) == pytest.approx(0.1 * 1.5 / 3)


def test_round_zero_trains_on_cross_entropy_alone():
    x, y = torch.tensor([[1.0, 2.0, 0.0]]), torch.tensor([2])
    for round_, extra in ((0, 0.0), (1, 0.1 * ((1.0 + 4.0 + 1.0) / 1) / 3)):
        objective, run = anchors_objective(round_)
        loss = objective(run, x, y)
        assert float(loss) == pytest.approx(math.log(3) + extra)


def test_anchor_momentum_update_over_an_epoch():
    """Two batches; per class, the batch means are summed and divided by all 2 batches (the code's rule)."""
    objective, run = anchors_objective(momentum=0.5)
    objective(run, torch.tensor([[2.0, 0.0, 0.0], [4.0, 0.0, 0.0], [0.0, 3.0, 0.0]]), torch.tensor([0, 0, 1]))
    objective(run, torch.tensor([[0.0, 0.0, 6.0]]), torch.tensor([0]))
    objective.end_epoch(run)
    b0 = (torch.tensor([3.0, 0.0, 0.0]) + torch.tensor([0.0, 0.0, 6.0])) / 2
    b1 = torch.tensor([0.0, 3.0, 0.0]) / 2
    expected = torch.stack([0.5 * torch.eye(3)[0] + 0.5 * b0, 0.5 * torch.eye(3)[1] + 0.5 * b1, torch.eye(3)[2]])
    torch.testing.assert_close(objective.local, expected)  # class 2 absent: its anchor is kept
    torch.testing.assert_close(objective.anchors, torch.eye(3))  # the global anchors move only at the server
    objective.end(run)
    other = FeatureAnchors(torch.eye(3), 0.1, 0.5, 0.0, 1e-3)
    other_run = ClientRun(1, 3, run.model, run.model.flat.clone(), 1e-3)
    other.begin(other_run)
    other.end(other_run)
    objective.client_anchors[3] = other.local  # client 3 kept the global anchors
    objective.end_round(
        RoundUpdates(
            1, torch.tensor([7, 3]), torch.zeros(2, 12), torch.tensor([3.0, 1.0]), torch.ones(2), torch.zeros(2), 0.1
        )
    )
    torch.testing.assert_close(objective.anchors, 0.75 * expected + 0.25 * torch.eye(3))


def test_calibration_is_one_adam_step_on_the_classifier():
    """W = 0, b = (1, 0, 0), anchors I: every anchor's logits are b, p = softmax(b). The calibration CE
    (mean over the 3 anchors) has gradient (p_j - delta_jc)/3 on W[j, c] and p_j - 1/3 on b_j. A first
    Adam step moves each entry by -lr * g / (|g| + 1e-8), i.e. -lr * sign(g): W gains +lr on the
    diagonal, -lr off it; b_0 (p_0 > 1/3) loses lr, b_1 and b_2 gain it."""
    lr = 1e-2
    objective, run = anchors_objective(round_=5, calibrate_after=4.0, lr=lr)
    run.model.flat[9] = 1.0
    objective.after_step(run)
    W, b = run.model.flat[:9].view(3, 3), run.model.flat[9:]
    torch.testing.assert_close(W, lr * (2 * torch.eye(3) - 1))
    torch.testing.assert_close(b, torch.tensor([1 - lr, lr, lr]))
    idle, run2 = anchors_objective(round_=4, calibrate_after=4.0, lr=lr)  # t > R/4 fails at t = R/4
    idle.after_step(run2)
    assert torch.equal(run2.model.flat, torch.zeros(12))


def test_fedfa_refuses_models_without_a_feature_layer():
    with pytest.raises(schema.ConfigError, match="fedfa needs a feature layer"):
        settings.resolve({"algorithm": "fedfa", "model": "mlp"})
    settings.resolve({"algorithm": "fedfa+ima", "model": "cnn"})


# --------------------------------------------------------------------------- two real rounds on the CNN, resumed


@pytest.fixture(scope="module")
def tiny_partition(tiny_data_root, tmp_path_factory):
    return make_partition(tiny_data_root, tmp_path_factory.mktemp("part"), num_clients=4, kind="iid")


@pytest.mark.parametrize("method", ["fedasam", "fedgma", "fedfa", "fedfa+ima"])
def test_cnn_runs_and_resumes_exactly(method, tiny_data_root, tiny_partition, tmp_path):
    from fedrepro.run.trainer import Trainer

    extra = {"ima": {"window": 1, "start_round": 1}} if "ima" in method else {}
    s = settings.resolve(
        {
            "algorithm": method,
            "model": "cnn",
            "num_clients": 4,
            "participation": 0.5,
            "rounds": 3,
            "batch_size": 50,
            "device": "cpu",
            "partition": {"kind": "iid"},
            "client": {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3},
            **extra,
        }
    )
    straight = Trainer(s, tmp_path / "a", tiny_partition, tiny_data_root)
    summary = straight.run(progress=False)
    assert summary["status"] == "finished"
    Trainer(s, tmp_path / "b", tiny_partition, tiny_data_root).run(progress=False, stop_after=1)
    resumed = Trainer(s, tmp_path / "b", tiny_partition, tiny_data_root)
    assert resumed.run(progress=False)["resumed"]
    a, b = checkpoint.load(tmp_path / "a" / "model.pt"), checkpoint.load(tmp_path / "b" / "model.pt")
    assert torch.isfinite(a["x"]).all()
    assert torch.equal(a["x"], b["x"])
    if method.startswith("fedfa"):
        # anchors moved off the initial one-hot rows, and the resumed run restored the same ones
        anchors = straight.algorithm.objective.anchors
        assert not torch.equal(anchors, (anchors > 0.999).float())
        torch.testing.assert_close(resumed.algorithm.objective.anchors, anchors, rtol=0, atol=0)


# --------------------------------------------------------------------------- each method as its setting builds it


def built(setting: dict):
    from fedrepro import algorithms

    return algorithms.build(settings.resolve(setting), 3, 12, torch.device("cpu"), torch.ones(3))


def test_fedgma_built_from_its_setting_steps_as_the_formula():
    """x_new = x - eta_g (mean - eta_gma (1/m) sum_i M_i Delta_i), each constant from the setting, none equal."""
    algo = built({"algorithm": "fedgma", "fedgma": {"lr": 0.3, "threshold": 0.3}, "server": {"lr": 0.5}})
    assert algo.name == "fedgma"
    updates = updates_with(DELTAS, SIZES)
    x = torch.ones(4)
    d = algo.aggregator(x, updates)
    torch.testing.assert_close(d, MEAN - 0.3 * torch.tensor([4 / 3, 3 / 3, -5 / 3, 1 / 3]))
    torch.testing.assert_close(algo.optimizer(x, d, updates), x - 0.5 * d)
    # threshold 0.8 of the same setting family keeps coordinates 0 and 2 only: half of them
    strict = built({"algorithm": "fedgma", "fedgma": {"lr": 0.3, "threshold": 0.8}})
    strict.aggregator(x, updates)
    assert float(updates.info["gma_kept"]) == 0.5
    torch.testing.assert_close(updates.info["weights"], updates.weights)


def test_gma_threshold_is_strict():
    """|s| > eps m: with m = 3 and eps = 1/3 a coordinate whose signs sum to 1 is dropped; to 3, kept."""
    deltas = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, -1.0]])  # s = (3, 1)
    d = MaskedAveraging(1.0, 1 / 3)(torch.zeros(2), updates_with(deltas, torch.ones(3)))  # eps m = 1.0 exactly
    torch.testing.assert_close(d, torch.tensor([1.0, 1 / 3]) - torch.tensor([1.0, 0.0]))


def test_fedasam_built_from_its_setting():
    algo = built({"algorithm": "fedasam", "model": "cnn", "fedasam": {"rho": 0.3, "eta": 0.04}, "server": {"lr": 0.5}})
    assert algo.name == "fedasam"
    assert (algo.objective.rho, algo.objective.eta) == (0.3, 0.04)
    x, d = torch.ones(4), torch.full((4,), 2.0)
    torch.testing.assert_close(algo.optimizer(x, d, updates_with(DELTAS, SIZES)), x - 0.5 * d)
    torch.testing.assert_close(algo.aggregator(x, updates_with(DELTAS, SIZES)), MEAN)


def test_fedfa_built_from_its_setting():
    """lambda, the anchor momentum, calibration after calibration_start x R rounds with its lr, and the
    anchors: one distinct one-hot row per class in the classifier's input dimension, drawn from the run's seed."""
    from fedrepro.algorithms.fedfa import initial_anchors

    setting = {"algorithm": "fedfa", "model": "cnn", "rounds": 40, "seed": 5, "server": {"lr": 0.5}}
    setting["fedfa"] = {"lam": 0.2, "momentum": 0.7, "calibration_start": 0.5, "calibration_lr": 0.003}
    algo = built(setting)
    objective = algo.objective
    assert algo.name == "fedfa"
    assert (objective.lam, objective.momentum) == (0.2, 0.7)
    assert (objective.calibrate_after, objective.calibration_lr) == (20.0, 0.003)
    torch.testing.assert_close(objective.anchors, initial_anchors(10, objective.anchors.shape[1], 5))
    x, d = torch.ones(4), torch.full((4,), 2.0)
    torch.testing.assert_close(algo.optimizer(x, d, updates_with(DELTAS, SIZES)), x - 0.5 * d)


@pytest.mark.parametrize("classes, dim", [(3, 5), (4, 4)])
def test_initial_anchors_are_distinct_one_hot_rows_when_they_fit(classes, dim):
    a = initial_anchors_of(classes, dim, seed=1)
    assert a.shape == (classes, dim)
    torch.testing.assert_close(a @ a.T, torch.eye(classes))  # orthonormal
    assert set(a.unique().tolist()) == {0.0, 1.0}
    draws = {tuple(initial_anchors_of(classes, dim, seed=s).argmax(1).tolist()) for s in range(8)}
    assert len(draws) > 1  # the rows' positions come from the seed
    assert torch.equal(a, initial_anchors_of(classes, dim, seed=1))


def test_initial_anchors_are_unit_gaussian_rows_when_classes_exceed_the_dimension():
    a = initial_anchors_of(6, 3, seed=2)
    assert a.shape == (6, 3)
    torch.testing.assert_close(a.norm(dim=1), torch.ones(6))
    assert len(set(a.unique().tolist())) > 2  # not one-hot
    assert torch.equal(a, initial_anchors_of(6, 3, seed=2)) and not torch.equal(a, initial_anchors_of(6, 3, seed=3))


def initial_anchors_of(classes: int, dim: int, seed: int) -> torch.Tensor:
    from fedrepro.algorithms.fedfa import initial_anchors

    return initial_anchors(classes, dim, seed)


def test_fedfa_build_names_the_model_it_cannot_split():
    """The library's own check, for a setting that did not pass the config check (a caller of build)."""
    from types import SimpleNamespace

    from fedrepro.algorithms import fedfa

    setting = settings.resolve({"algorithm": "fedfa", "model": "cnn"})
    with pytest.raises(ValueError, match=r"model 'mlp' is not one of \[.*'cnn'"):
        fedfa.build({**setting, "model": "mlp"}, SimpleNamespace(module=None, device="cpu"))
