"""FedLAW: reduction to FedAvg, fixed shrinking, the functional forward, and one Adam step against
finite differences of the proxy loss computed through an ordinary module."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
from conftest import method_section, mlp_proxy_problem  # noqa: E402
from fedrepro.algorithms.fedlaw import LearnedAggregation
from fedrepro.evaluation import proxy_indices

pytestmark = pytest.mark.floats

CFG = {
    **method_section("fedlaw"),
    "variant": "fedlaw",
    "gamma": 1.0,
    "proxy_size": 20,
    "server_epochs": 1,
    "server_lr": 0.01,
    "betas": [0.5, 0.999],
    "lr_step_epochs": 20,
    "lr_step_factor": 0.5,
    "batch_size": 128,
}


def loss_through_module(module, w, proxy_x, proxy_y):
    """The proxy loss the ordinary way: copy w into a fresh module's parameters."""
    fresh = copy.deepcopy(module)
    torch.nn.utils.vector_to_parameters(w, fresh.parameters())
    with torch.no_grad():
        return float(nn.functional.cross_entropy(fresh(proxy_x), proxy_y))


@pytest.mark.parametrize("variant,epochs", [("fixed_gamma", 1), ("fedlaw", 0), ("adaptive_gws", 0)])
def test_no_server_steps_with_unit_gamma_is_fedavg(variant, epochs):
    module, x, updates, px, py = mlp_proxy_problem()
    agg = LearnedAggregation(module, px, py, {**CFG, "variant": variant, "server_epochs": epochs})
    d = agg(x, updates)
    assert torch.allclose(d, updates.weighted_mean(), rtol=0, atol=1e-12)
    assert updates.info["gamma"] == 1.0
    assert torch.allclose(updates.info["weights"], torch.tensor([0.1, 0.3, 0.6], dtype=torch.float64))


def test_fixed_gamma_shrinks_the_fedavg_model():
    module, x, updates, px, py = mlp_proxy_problem()
    agg = LearnedAggregation(module, px, py, {**CFG, "variant": "fixed_gamma", "gamma": 0.9}, server_lr=0.5)
    x_new = x - agg(x, updates)
    # gamma * (x - eta_g * sum_i p_i Delta_i)
    assert torch.allclose(x_new, 0.9 * (x - 0.5 * updates.weighted_mean()), rtol=0, atol=1e-12)


def test_functional_forward_is_the_module_with_those_weights():
    module, x, _, px, _ = mlp_proxy_problem()
    agg = LearnedAggregation(module, px, None, CFG)
    fresh = copy.deepcopy(module)
    torch.nn.utils.vector_to_parameters(x, fresh.parameters())
    assert torch.allclose(agg.forward(x, px), fresh(px))


@pytest.mark.parametrize("variant", ["fedlaw", "adaptive_gws", "attentive"])
def test_one_adam_step_follows_the_finite_difference_gradient(variant, monkeypatch):
    """One full-batch Adam step from (theta, z) = (0, log p): the gradient Adam is handed equals central
    differences of the loss through a module (its value: Adam's first step, -lr * g / (|g| + eps),
    keeps only the sign, so a gradient off by any positive factor would pass the step check alone),
    and the step moves each learned coordinate by that."""
    module, x, updates, px, py = mlp_proxy_problem()
    handed = []
    adam_step = torch.optim.Adam.step

    def recording_step(self, *args, **kwargs):
        handed.append([p.grad.detach().clone() for group in self.param_groups for p in group["params"]])
        return adam_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", recording_step)
    agg = LearnedAggregation(module, px, py, {**CFG, "variant": variant})
    d = agg(x, updates)
    models = x - updates.deltas
    p = updates.weights

    def loss(theta, z):
        return loss_through_module(module, np.exp(theta) * (torch.softmax(z, 0) @ models), px, py)

    h, lr = 1e-6, CFG["server_lr"]
    z0 = torch.log(p)
    g_theta = (loss(h, z0) - loss(-h, z0)) / (2 * h)
    g_z = torch.tensor(
        [(loss(0.0, z0 + h * e) - loss(0.0, z0 - h * e)) / (2 * h) for e in torch.eye(len(p), dtype=torch.float64)],
        dtype=torch.float64,
    )
    learn_gamma, learn_lambda = variant != "attentive", variant != "adaptive_gws"
    # central differences in float64 with h = 1e-6: truncation ~h^2, cancellation ~1e-16 / h, both < 1e-9
    (grads,) = handed  # one server epoch, one full batch: one step
    expected_grads = [
        *([torch.tensor(g_theta, dtype=torch.float64)] if learn_gamma else []),
        *([g_z] if learn_lambda else []),
    ]
    assert len(grads) == len(expected_grads)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got.reshape(want.shape), want, rtol=1e-6, atol=1e-9)
    theta = -lr * g_theta / (abs(g_theta) + 1e-8) if learn_gamma else 0.0
    z = z0 - lr * g_z / (g_z.abs() + 1e-8) if learn_lambda else z0
    expected = np.exp(theta) * (torch.softmax(z, 0) @ models)
    assert updates.info["gamma"] == pytest.approx(np.exp(theta), rel=1e-9)
    assert torch.allclose(updates.info["weights"], torch.softmax(z, 0), atol=1e-9)
    assert torch.allclose(x - d, expected, atol=1e-9)


def test_learning_lowers_the_proxy_loss():
    module, x, updates, px, py = mlp_proxy_problem()
    agg = LearnedAggregation(module, px, py, {**CFG, "server_epochs": 50, "server_lr": 0.05})
    before = loss_through_module(module, updates.weights @ (x - updates.deltas), px, py)
    after = loss_through_module(module, x - agg(x, updates), px, py)
    assert after < before - 1e-3


def test_proxy_set_is_class_balanced_and_seeded():
    labels = torch.arange(1000) % 10
    a = proxy_indices(labels, 100, seed=1)
    assert len(a) == len(set(a.tolist())) == 100
    assert torch.bincount(labels[a], minlength=10).tolist() == [10] * 10
    assert torch.equal(a, proxy_indices(labels, 100, seed=1))
    assert not torch.equal(a, proxy_indices(labels, 100, seed=2))
