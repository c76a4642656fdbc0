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


def test_the_logged_round_metrics_are_their_definitions():
    """What Fig. 6 and the GWS sweeps read from a round's log, written out from their definitions: gamma, lambda
    (and per client id), ||(1 - gamma) x|| and ||gamma eta_g sum_i lambda_i Delta_i||, at eta_g = 0.5."""
    from fedrepro import metrics

    module, x, updates, px, py = mlp_proxy_problem()
    cfg = {**CFG, "variant": "fixed_gamma", "gamma": 0.8, "log_client_weights": True}
    LearnedAggregation(module, px, py, cfg, server_lr=0.5)(x, updates)
    lam = updates.sizes / updates.sizes.sum()
    info = updates.info
    assert info["gamma"] == pytest.approx(0.8, rel=1e-12)
    assert info["gws_norm"] == pytest.approx(0.2 * float(x.norm()), rel=1e-9)
    assert info["global_grad_norm"] == pytest.approx(0.8 * 0.5 * float((lam @ updates.deltas).norm()), rel=1e-9)
    assert info["lambda_coherence"] == pytest.approx(float(metrics.coherence(updates.deltas, lam)), rel=1e-9)
    assert info["lambda_client"] == pytest.approx(dict(zip(updates.clients.tolist(), lam.tolist())), rel=1e-12)
    # the coherence of lambda's weighting differs from the uniform one's here (the check above can fail)
    uniform = torch.full_like(lam, 1 / len(lam))
    assert float(metrics.coherence(updates.deltas, uniform)) != pytest.approx(info["lambda_coherence"], rel=1e-6)


@pytest.mark.parametrize("learn_rounds", [1, 2])
def test_learning_stops_after_learn_rounds_and_then_aggregates_as_fedavg(learn_rounds):
    """fedlaw.learn_rounds = N: rounds 0..N-1 learn, round N on is FedAvg (gamma 1, data-size lambda), whatever
    the variant's fixed gamma."""
    module, x, updates, px, py = mlp_proxy_problem()
    for variant, gamma in (("attentive", 0.8), ("fixed_gamma", 0.8)):
        cfg = {**CFG, "variant": variant, "gamma": gamma, "learn_rounds": learn_rounds, "server_epochs": 2}
        for t in (learn_rounds - 1, learn_rounds):
            updates.round, updates.info = t, {}
            LearnedAggregation(module, px, py, cfg)(x, updates)
            fedavg = torch.allclose(updates.info["weights"], updates.weights, rtol=0, atol=1e-12)
            if t == learn_rounds:
                assert updates.info["gamma"] == 1.0 and fedavg
            elif variant == "attentive":
                assert updates.info["gamma"] == pytest.approx(gamma) and not fedavg  # lambda learned
            else:
                assert updates.info["gamma"] == pytest.approx(gamma) and fedavg


def test_learned_gamma_starts_at_one_and_one_server_epoch_moves_it():
    """The learned variants start from gamma = 1 (theta = 0), whatever fedlaw.gamma says; with server_epochs 0 they
    stay there, one epoch moves it."""
    module, x, updates, px, py = mlp_proxy_problem()
    for epochs in (0, 1):
        updates.info = {}
        cfg = {**CFG, "variant": "adaptive_gws", "gamma": 0.8, "server_epochs": epochs}
        LearnedAggregation(module, px, py, cfg)(x, updates)
        assert (updates.info["gamma"] == 1.0) == (epochs == 0)


@pytest.mark.parametrize("variant", ["fedlaw", "swa"])
def test_the_server_optimisers_are_built_with_the_papers_settings(variant, monkeypatch):
    """Adam with the paper's betas (0.5, 0.999) and lr; StepLR(lr_step_epochs, lr_step_factor) for gamma (and for
    both in plain FedLAW); SWA's SWALR with its swa_lr and anneal epochs. Recorded as FedLAW builds them."""
    built = {"Adam": [], "StepLR": [], "SWALR": []}
    for holder, name in ((torch.optim, "Adam"), (torch.optim.lr_scheduler, "StepLR"), (torch.optim.swa_utils, "SWALR")):
        original = getattr(holder, name)

        def recorder(*args, _original=original, _name=name, **kwargs):
            built[_name].append((args[1:], kwargs))
            return _original(*args, **kwargs)

        monkeypatch.setattr(holder, name, recorder)
    module, x, updates, px, py = mlp_proxy_problem()
    cfg = {**CFG, "variant": variant, "server_epochs": 4, "betas": [0.5, 0.999], "lr_step_epochs": 3,
           "lr_step_factor": 0.25, "swa_lr": 0.03, "swa_anneal_epochs": 7, "swa_start": 0}  # fmt: skip
    LearnedAggregation(module, px, py, cfg)(x, updates)
    assert built["Adam"] and all(k == {"lr": 0.01, "betas": (0.5, 0.999)} for _, k in built["Adam"])
    assert built["StepLR"] == [((3, 0.25), {})]
    assert built["SWALR"] == ([] if variant == "fedlaw" else [((), {"swa_lr": 0.03, "anneal_epochs": 7})])


def test_the_trace_records_each_server_epoch_and_the_rate_steps_down():
    """(stage, epoch, theta, z, lr) per server epoch, theta and z at its end: the last entry is the round's
    gamma and lambda; StepLR halves the rate every lr_step_epochs epochs."""
    module, x, updates, px, py = mlp_proxy_problem()
    agg = LearnedAggregation(module, px, py, {**CFG, "server_epochs": 5, "lr_step_epochs": 2, "lr_step_factor": 0.5})
    agg.trace = []
    agg(x, updates)
    assert [(s, e) for s, e, *_ in agg.trace] == [("fedlaw", e) for e in range(5)]
    assert [lr for *_, lr in agg.trace] == pytest.approx([0.01, 0.01, 0.005, 0.005, 0.0025])
    _, _, theta, z, _ = agg.trace[-1]
    assert updates.info["gamma"] == pytest.approx(float(np.exp(theta)), rel=1e-12)
    torch.testing.assert_close(updates.info["weights"], torch.softmax(z, 0))
    assert len({t for _, _, t, _, _ in agg.trace}) == 5  # theta moved every epoch


@pytest.mark.parametrize("variant", ["fedlaw", "swa"])
def test_a_round_draws_its_proxy_batches_from_its_own_stream_not_torchs_global_one(variant):
    """Batches of 8 over the 20 proxy samples, shuffled by the round's generator: the same round gives the same
    model whatever torch's global generator holds, another round another one."""
    module, x, updates, px, py = mlp_proxy_problem()
    cfg = {**CFG, "variant": variant, "server_epochs": 4, "batch_size": 8, "swa_start": 0}
    results = []
    for global_seed, round_ in ((0, 3), (1, 3), (0, 4)):
        torch.manual_seed(global_seed)
        updates.round = round_
        results.append(LearnedAggregation(module, px, py, cfg, seed=2)(x, updates))
    assert torch.equal(results[0], results[1]) and not torch.equal(results[0], results[2])


def test_the_logged_proxy_loss_is_the_last_epochs_mean_over_samples():
    """Batches of 8, 8 and 4 (weighed by size); with a zero rate every batch is scored at the starting model."""
    module, x, updates, px, py = mlp_proxy_problem()
    LearnedAggregation(module, px, py, {**CFG, "server_lr": 0.0, "batch_size": 8})(x, updates)
    start = x - updates.weighted_mean()
    # the epoch's sum is kept in float32 (three additions: within 3 eps32 = 3.6e-7 relative)
    assert updates.info["proxy_loss"] == pytest.approx(loss_through_module(module, start, px, py), rel=4e-7)


def test_fedlaw_is_built_from_the_runs_setting():
    """The run's server lr reaches the client models (w_i = x - eta_g Delta_i), its seed the proxy batches, and the
    server step is the aggregator's own (unit rate); without the run's model it refuses with one line."""
    from fedrepro import algorithms
    from fedrepro.configure import settings

    setting = settings.resolve(
        {"algorithm": "fedlaw", "seed": 5, "server": {"lr": 0.5}, "evaluation": {"proxy_holdout": 20},
         "fedlaw": {"variant": "fixed_gamma", "gamma": 0.9}}
    )  # fmt: skip
    module, x, updates, px, py = mlp_proxy_problem()
    algo = algorithms.build(setting, 3, len(x), torch.device("cpu"), torch.ones(3), module=module)
    assert algo.name == "fedlaw" and algo.aggregator.seed == 5 and algo.aggregator.proxy_x is None
    torch.testing.assert_close(algo.server_step(x, updates), 0.9 * (x - 0.5 * updates.weighted_mean()))
    with pytest.raises(ValueError, match="^fedlaw needs the run's model"):
        algorithms.build(setting, 3, len(x), torch.device("cpu"), torch.ones(3))
    learned = settings.resolve(
        {"algorithm": "fedlaw", "evaluation": {"proxy_holdout": 20}, "fedlaw": {"proxy_size": 20}}
    )
    with pytest.raises(ValueError, match=r"^fedlaw\.proxy_size = 20 but the run holds out 0"):
        algorithms.build(learned, 3, len(x), torch.device("cpu"), torch.ones(3), module=module)
