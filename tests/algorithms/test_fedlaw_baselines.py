"""FedLAW's server-side baselines (FedDF, FedBE, Server-FT) and FedLAW (SWA): hand-computed server
steps on a linear model, the SWAG sample on constructed deltas, the SWA average against recorded
iterates, the proxy set left out of evaluation, determinism and exact resume."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conftest import make_partition, mlp_proxy_problem
from fedrepro.algorithms.fedbe import BayesianEnsembleDistillation, swag_sample
from fedrepro.algorithms.feddf import EnsembleDistillation
from fedrepro.algorithms.fedlaw import LearnedAggregation
from fedrepro.algorithms.proxy import optimizer_settings, round_generator
from fedrepro.algorithms.serverft import ProxyFineTune
from fedrepro.configure import schema, settings
from fedrepro.evaluation import proxy_indices
from fedrepro.functional import FunctionalModel
from fedrepro.parts import RoundUpdates
from fedrepro.run import checkpoint

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

from conftest import method_section  # noqa: E402

CFG = {
    **method_section("fedbe"),
    "proxy_size": 20,
    "server_epochs": 1,
    "optimizer": "sgd",
    "lr": None,
    "momentum": None,
    "weight_decay": None,
    "betas": [0.5, 0.999],
    "keep_state": True,
    "batch_size": 128,
    "swag_scale": 0.1,
}
OPTIM = {"optimizer": "sgd", "lr": 0.3, "momentum": 0.9, "weight_decay": 0.01, "betas": (0.5, 0.999)}
FEDLAW = {
    **method_section("fedlaw"),
    "variant": "swa",
    "gamma": 1.0,
    "proxy_size": 20,
    "server_epochs": 20,
    "server_lr": 0.01,
    "betas": [0.5, 0.999],
    "lr_step_epochs": 20,
    "lr_step_factor": 0.5,
    "batch_size": 128,
    "swa_order": "lambda_first",
    "swa_start": 5,
    "swa_lr": 0.05,
    "swa_anneal_epochs": 10,
    "swa_cosine_epochs": 100,
}


def problem(k=3, seed=0, round_=0):
    """A 3-input, 2-class linear model (parameters: weight 2x3, then bias 2) in float64."""
    g = torch.Generator().manual_seed(seed)
    module = nn.Linear(3, 2).double()
    x = torch.randn(8, generator=g, dtype=torch.float64)
    deltas = 0.5 * torch.randn(k, 8, generator=g, dtype=torch.float64)
    sizes = torch.tensor([10.0, 30.0, 60.0][:k], dtype=torch.float64)
    updates = RoundUpdates(round_, torch.arange(k), deltas, sizes, torch.ones(k), torch.zeros(k), 0.1)
    proxy_x = torch.randn(4, 3, generator=g, dtype=torch.float64)
    proxy_y = torch.tensor([0, 1, 1, 0])
    return module, x, updates, proxy_x, proxy_y


def linear_logits(w, inputs):
    return inputs @ w[:6].view(2, 3).T + w[6:]


def linear_grad(w, inputs, dlogits):
    """d loss / d w for the linear model given d loss / d logits (B, 2)."""
    return torch.cat([(dlogits.T @ inputs).reshape(-1), dlogits.sum(0)])


def make(cls, module, px, py, cfg=None, optim=None, server_lr=1.0, seed=0):
    return cls(FunctionalModel(module), px, py, {**CFG, **(cfg or {})}, {**OPTIM, **(optim or {})}, server_lr, seed)


# --------------------------------------------------------------------------- reductions to FedAvg


@pytest.mark.parametrize("cls", [ProxyFineTune, EnsembleDistillation, BayesianEnsembleDistillation])
@pytest.mark.parametrize("server_lr", [1.0, 0.5])
def test_no_server_epochs_is_fedavg(cls, server_lr):
    module, x, updates, px, py = problem()
    d = make(cls, module, px, py, {"server_epochs": 0}, server_lr=server_lr)(x, updates)
    # unit server step on d = x - (x - eta_g sum p_i Delta_i)
    assert torch.allclose(x - d, x - server_lr * updates.weighted_mean(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("cls,cfg", [(EnsembleDistillation, {}), (BayesianEnsembleDistillation, {"swag_scale": 0.0})])
def test_distillation_from_identical_clients_changes_nothing(cls, cfg):
    """Every teacher is the FedAvg model (FedBE's SWAG sample too, with swag_scale 0): KL = 0, no gradient."""
    module, x, updates, px, py = problem()
    updates.deltas[:] = updates.deltas[0]
    agg = make(cls, module, px, py, {**cfg, "server_epochs": 3}, {"weight_decay": 0.0})
    d = agg(x, updates)
    assert updates.info["proxy_loss"] == pytest.approx(0.0, abs=1e-12)
    assert torch.allclose(d, updates.deltas[0], rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- one step by hand


def test_serverft_sgd_steps_by_hand_and_momentum_carries_over():
    module, x, updates, px, py = problem()
    agg = make(ProxyFineTune, module, px, py)
    lr, mu, wd = OPTIM["lr"], OPTIM["momentum"], OPTIM["weight_decay"]

    def ce_grad(w):
        probs = torch.softmax(linear_logits(w, px), 1)
        return linear_grad(w, px, (probs - nn.functional.one_hot(py, 2)) / len(py))

    w0 = x - updates.weighted_mean()
    g0 = ce_grad(w0) + wd * w0
    w1 = w0 - lr * g0  # first step: the buffer is the gradient
    x1 = x - agg(x, updates)
    assert torch.allclose(x1, w1, rtol=0, atol=1e-12)
    assert updates.info["proxy_loss"] == pytest.approx(float(nn.functional.cross_entropy(linear_logits(w0, px), py)))
    # the next round starts from its own FedAvg model with the momentum buffer of the last step
    _, _, nxt, _, _ = problem(seed=1, round_=1)
    v0 = x1 - nxt.weighted_mean()
    expected = v0 - lr * (mu * g0 + ce_grad(v0) + wd * v0)
    assert torch.allclose(x1 - agg(x1, nxt), expected, rtol=0, atol=1e-12)
    fresh = make(ProxyFineTune, module, px, py, {"keep_state": False})
    fresh(x, problem()[2])
    assert torch.allclose(x1 - fresh(x1, nxt), v0 - lr * (ce_grad(v0) + wd * v0), rtol=0, atol=1e-12)


def test_serverft_adam_first_step_is_lr_times_sign():
    module, x, updates, px, py = problem()
    agg = make(ProxyFineTune, module, px, py, optim={"optimizer": "adam", "lr": 0.01, "weight_decay": 0.0})
    w0 = x - updates.weighted_mean()
    probs = torch.softmax(linear_logits(w0, px), 1)
    g = linear_grad(w0, px, (probs - nn.functional.one_hot(py, 2)) / len(py))
    assert torch.allclose(x - agg(x, updates), w0 - 0.01 * g / (g.abs() + 1e-8), rtol=0, atol=1e-12)


def test_feddf_step_by_hand_with_the_unweighted_teacher_mean():
    module, x, updates, px, py = problem()
    agg = make(EnsembleDistillation, module, px, py)
    lr, wd = OPTIM["lr"], OPTIM["weight_decay"]
    w0 = x - updates.weighted_mean()  # student: data-size weighted FedAvg
    # the logits are linear in the parameters: the mean of the clients' logits is the logits of their
    # unweighted mean model
    teacher = linear_logits((x - updates.deltas).mean(0), px)
    student = linear_logits(w0, px)
    p_t, log_p_s = torch.softmax(teacher, 1), torch.log_softmax(student, 1)
    kl = float((p_t * (p_t.log() - log_p_s)).sum() / len(px))
    g = linear_grad(w0, px, (log_p_s.exp() - p_t) / len(px)) + wd * w0
    assert torch.allclose(x - agg(x, updates), w0 - lr * g, rtol=0, atol=1e-12)
    assert updates.info["proxy_loss"] == pytest.approx(kl, rel=1e-12)
    assert kl > 1e-3


def test_fedbe_teachers_are_fedavg_clients_and_one_swag_sample():
    module, x, updates, px, py = problem()
    agg = make(BayesianEnsembleDistillation, module, px, py, seed=4)
    models = x - updates.deltas
    x_avg = x - updates.weighted_mean()
    agg.prepare(x, x_avg, models, updates)
    eps = torch.randn(8, generator=round_generator(4, 0, "swag"), dtype=torch.float64)
    swag = swag_sample(x, models, FunctionalModel(module).slices(), 0.1, eps)
    teachers = torch.stack([x_avg, *models, swag])  # K + 2 = 5 nets, uniform
    expected = torch.stack([linear_logits(w, px) for w in teachers]).mean(0)
    assert torch.allclose(agg.teacher, expected, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- the SWAG sample


def test_swag_sample_on_constructed_deltas():
    """Per parameter tensor: normalised deltas u_i, m = mean u, v = max(mean u^2 - m^2, 1e-5), and
    x + (m + 0.1 sqrt(v) eps) * mean ||g_i||."""
    module = nn.Linear(2, 1).double()  # weight (1x2), bias (1)
    slices = list(FunctionalModel(module).slices())
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    models = x + torch.tensor([[2.0, 0.0, -1.0], [0.0, 4.0, 3.0]], dtype=torch.float64)
    eps = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    # weight: norms 2, 4 -> u = e1, e2; m = (.5, .5), v = .25, mean norm 3
    # bias:   norms 1, 3 -> u = -1, 1;  m = 0, v = 1, mean norm 2
    expected = torch.tensor(
        [1 + 3 * (0.5 + 0.1 * 0.5 * 1.0), 2 + 3 * (0.5 + 0.1 * 0.5 * -2.0), 3 + 2 * (0.0 + 0.1 * 1.0 * 0.5)],
        dtype=torch.float64,
    )
    assert torch.allclose(swag_sample(x, models, slices, 0.1, eps), expected, rtol=0, atol=1e-12)
    # identical directions: the variance is clamped at 1e-5; an untouched layer stays at x (no 0/0)
    same = x + torch.tensor([[1.0, 1.0, 0.0], [2.0, 2.0, 0.0]], dtype=torch.float64)
    out = swag_sample(x, same, slices, 0.1, eps)
    u = 1 / math.sqrt(2)
    assert torch.allclose(out[:2], x[:2] + (u + 0.1 * math.sqrt(1e-5) * eps[:2]) * 1.5 * math.sqrt(2), atol=1e-12)
    assert out[2] == x[2]


# --------------------------------------------------------------------------- FedLAW (SWA)


def test_swa_averages_the_lambda_iterates_after_swa_start_then_learns_gamma():
    module, x, updates, px, py = mlp_proxy_problem()
    agg = LearnedAggregation(module, px, py, FEDLAW)
    agg.trace = []
    x_new = x - agg(x, updates)
    lam_stage = [t for t in agg.trace if t[0] == "lambda"]
    gamma_stage = [t for t in agg.trace if t[0] == "gamma"]
    assert [t[0] for t in agg.trace] == ["lambda"] * 10 + ["gamma"] * 10  # code order, 20 // 2 each
    assert all(t[2] == 0.0 for t in lam_stage)  # gamma = 1 while lambda learns
    averaged = torch.stack([t[3] for t in lam_stage if t[1] > 5]).mean(0)  # epochs 6..9
    assert updates.info["swa_averaged"] == 4
    lam = torch.softmax(averaged, 0)
    assert torch.allclose(updates.info["weights"], lam, atol=1e-12)
    assert all(torch.equal(t[3], gamma_stage[0][3]) for t in gamma_stage)  # lambda fixed while gamma learns
    assert torch.allclose(torch.softmax(gamma_stage[0][3], 0), lam, atol=1e-12)
    gamma = math.exp(gamma_stage[-1][2])
    assert updates.info["gamma"] == pytest.approx(gamma, rel=1e-12) and gamma != 1.0
    assert torch.allclose(x_new, gamma * (lam @ (x - updates.deltas)), atol=1e-12)
    # the lr in effect during each lambda epoch: cosine (T_max 100) through epoch swa_start + 1, then
    # SWALR's cosine anneal towards 0.05 over 10 epochs; the gamma stage halves every 20 epochs
    lr0 = FEDLAW["server_lr"]
    cos = [lr0 * (1 + math.cos(math.pi * e / 100)) / 2 for e in range(7)]
    swa = [0.05 * a + cos[6] * (1 - a) for a in ((1 - math.cos(math.pi * j / 10)) / 2 for j in range(1, 4))]
    assert [t[4] for t in lam_stage] == pytest.approx(cos + swa, rel=1e-9)
    assert [t[4] for t in gamma_stage] == [lr0] * 10


def test_swa_in_the_papers_order_and_with_too_few_epochs():
    module, x, updates, px, py = mlp_proxy_problem()
    agg = LearnedAggregation(module, px, py, {**FEDLAW, "swa_order": "gamma_first"})
    agg.trace = []
    agg(x, updates)
    assert [t[0] for t in agg.trace] == ["gamma"] * 10 + ["lambda"] * 10
    gamma = agg.trace[9][2]
    assert gamma != 0.0 and all(t[2] == gamma for t in agg.trace[10:])  # learned gamma, then fixed
    # no epoch beyond swa_start: nothing is averaged and lambda stays at the data sizes (the code's
    # AveragedModel keeps its initial copy)
    short = LearnedAggregation(module, px, py, {**FEDLAW, "server_epochs": 12})
    short(x, updates)
    assert updates.info["swa_averaged"] == 0
    assert torch.allclose(updates.info["weights"], updates.weights, atol=1e-12)


# --------------------------------------------------------------------------- settings


def test_null_optimizer_settings_take_the_clients():
    setting = settings.resolve(
        {
            "algorithm": "feddf",
            "client": {"lr": 0.08, "momentum": 0.9, "weight_decay": 5e-4},
            "evaluation": {"proxy_holdout": 100},
        }
    )
    # resolved before the run is named: the setting says what the optimiser gets (and the id hashes it)
    assert {k: setting["feddf"][k] for k in ("lr", "momentum", "weight_decay")} == {
        "lr": 0.08,
        "momentum": 0.9,
        "weight_decay": 5e-4,
    }
    assert optimizer_settings(setting["feddf"]) == {
        "optimizer": "sgd",
        "betas": (0.5, 0.999),
        "lr": 0.08,
        "momentum": 0.9,
        "weight_decay": 5e-4,
    }
    setting = settings.resolve(
        {"algorithm": "serverft", "serverft": {"lr": 0.01, "optimizer": "adam"}, "evaluation": {"proxy_holdout": 100}}
    )
    assert optimizer_settings(setting["serverft"])["lr"] == 0.01
    assert setting["serverft"]["server_epochs"] == 2 and setting["serverft"]["keep_state"]


@pytest.mark.parametrize("name", ["feddf", "fedbe", "serverft"])
def test_proxy_size_is_checked(name):
    with pytest.raises(schema.ConfigError, match=rf"{name}\.proxy_size = 15"):
        settings.resolve({"algorithm": name, name: {"proxy_size": 15}, "evaluation": {"proxy_holdout": 15}})


@pytest.mark.parametrize("name", ["fedlaw", "feddf", "fedbe", "serverft"])
def test_a_proxy_size_other_than_the_comparisons_holdout_is_refused(name):
    with pytest.raises(
        schema.ConfigError, match=rf"{name}\.proxy_size = 20, evaluation\.proxy_holdout = 30\).*test hold-out"
    ):
        settings.resolve({"algorithm": name, name: {"proxy_size": 20}, "evaluation": {"proxy_holdout": 30}})
    with pytest.raises(schema.ConfigError, match=r"evaluation\.proxy_holdout = 15 must be a multiple"):
        settings.resolve({"algorithm": "fedavg", "evaluation": {"proxy_holdout": 15}})


def test_fixed_gamma_needs_no_holdout():
    """fixed_gamma learns nothing on a proxy set, so the proxy_size = proxy_holdout check that refuses
    the learned variants (the same setting otherwise) lets it through, holding nothing out."""
    fixed = settings.resolve({"algorithm": "fedlaw", "fedlaw": {"variant": "fixed_gamma", "proxy_size": 20}})
    assert fixed["fedlaw"]["variant"] == "fixed_gamma" and fixed["evaluation"]["proxy_holdout"] == 0
    with pytest.raises(schema.ConfigError, match=r"fedlaw\.proxy_size = 20, evaluation\.proxy_holdout = 0"):
        settings.resolve({"algorithm": "fedlaw", "fedlaw": {"variant": "fedlaw", "proxy_size": 20}})


def test_every_method_of_a_fedlaw_experiment_is_scored_on_the_same_test_samples():
    """FedLAW evaluates every compared method on the test set minus the proxy samples."""
    from fedrepro.configure.expansion import expand
    from fedrepro.configure.paramsfile import ROOT, load_params

    runs = [
        r
        for r in expand(load_params(ROOT / "params" / "fedlaw.yaml"))
        if r.experiment == "fedlaw_table3_fmnist" and r.setting["seed"] == 8
    ]
    methods = {r.setting["algorithm"] for r in runs}
    assert {"fedavg", "fedprox", "feddyn", "fedlaw", "feddf"} <= methods
    assert {r.setting["evaluation"]["proxy_holdout"] for r in runs} == {100}


# --------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def partition_dir(tiny_data_root, tmp_path_factory):
    return make_partition(tiny_data_root, tmp_path_factory.mktemp("part"), num_clients=4, kind="iid")


METHODS = {
    "feddf": {},
    "fedbe": {},
    "serverft": {},
    "fedlaw": {"fedlaw": {"variant": "swa", "proxy_size": 20, "server_epochs": 16, "swa_start": 2}},
}


def tiny(method: str, seed: int = 1) -> dict:
    extra = METHODS.get(method) or ({method: {"proxy_size": 20, "server_epochs": 2}} if method in METHODS else {})
    return settings.resolve(
        {
            "algorithm": method,
            "num_clients": 4,
            "participation": 0.5,
            "rounds": 3,
            "seed": seed,
            "batch_size": 50,
            "device": "cpu",
            "partition": {"kind": "iid"},
            "client": {"lr": 0.05, "momentum": 0.5},
            "evaluation": {"proxy_holdout": 20},
            **extra,
        }
    )


@pytest.mark.parametrize("method", [*METHODS, "fedavg", "fedprox", "feddyn"])
def test_proxy_samples_are_not_evaluated(method, tiny_data_root, partition_dir, tmp_path):
    """Every method of the comparison, with a proxy or not, is scored on the test set minus the hold-out."""
    from fedrepro import data
    from fedrepro.run.trainer import Trainer

    s = tiny(method)
    trainer = Trainer(s, tmp_path, partition_dir, tiny_data_root)
    full = data.load("fmnist", tiny_data_root, train=False)
    index = proxy_indices(full.labels, 20, s["seed"])
    keep = torch.ones(len(full), dtype=torch.bool)
    keep[index] = False
    assert len(trainer.inputs.test) == len(full) - 20
    assert torch.equal(trainer.inputs.test.images, full.images[keep]) and torch.equal(
        trainer.inputs.test.labels, full.labels[keep]
    )
    if method in METHODS:  # the aggregator trains on exactly the held-out samples
        assert torch.equal(trainer.algorithm.aggregator.proxy_y, full.labels[index])


@pytest.mark.parametrize("method", list(METHODS))
def test_runs_are_deterministic_and_resume_exactly(method, tiny_data_root, partition_dir, tmp_path):
    from fedrepro.run.trainer import Trainer

    s = tiny(method)
    straight = Trainer(s, tmp_path / "a", partition_dir, tiny_data_root).run(progress=False)
    assert straight["status"] == "finished"
    Trainer(s, tmp_path / "b", partition_dir, tiny_data_root).run(progress=False)
    Trainer(s, tmp_path / "c", partition_dir, tiny_data_root).run(progress=False, stop_after=1)
    resumed = Trainer(s, tmp_path / "c", partition_dir, tiny_data_root).run(progress=False)
    assert resumed["resumed"]
    a, b, c = (checkpoint.load(tmp_path / r / "model.pt")["x"] for r in "abc")
    assert torch.isfinite(a).all()
    assert torch.equal(a, b) and torch.equal(a, c)


def test_fedbe_sample_depends_on_seed_and_round():
    module, x, updates, px, py = problem()
    models = x - updates.deltas

    def teachers(seed, round_):
        agg = make(BayesianEnsembleDistillation, module, px, py, seed=seed)
        updates.round = round_
        return agg.teachers(x, x, models, updates)[-1][0]

    assert torch.equal(teachers(1, 0), teachers(1, 0))
    assert not torch.equal(teachers(1, 0), teachers(2, 0)) and not torch.equal(teachers(1, 0), teachers(1, 1))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_server_optimiser_state_survives_a_weights_only_checkpoint(optimizer, tmp_path):
    """Round 2 after a save/load of the aggregator's state equals round 2 of the same object."""
    module, x, updates, px, py = problem()
    _, _, nxt, _, _ = problem(seed=1, round_=1)
    optim = {"optimizer": optimizer, "lr": 0.05}
    agg = make(ProxyFineTune, module, px, py, {"server_epochs": 2}, optim)
    x1 = x - agg(x, updates)
    checkpoint.save(agg.state_dict(), tmp_path / "state.pt")
    again = make(ProxyFineTune, module, px, py, {"server_epochs": 2}, optim)
    again.load_state_dict(checkpoint.load(tmp_path / "state.pt"))
    expected = x1 - agg(x1, nxt)
    assert torch.equal(x1 - again(x1, nxt), expected)
    fresh = make(ProxyFineTune, module, px, py, {"server_epochs": 2}, optim)
    assert not torch.equal(x1 - fresh(x1, nxt), expected), "the state matters"


@pytest.mark.parametrize("name", ["feddf", "fedlaw"])
def test_a_method_built_without_the_engines_holdout_is_refused(name):
    """Proxy methods get their samples from the engine (BuildContext.proxy), never from the test set themselves."""
    from fedrepro import algorithms

    setting = settings.resolve({"algorithm": name, name: {"proxy_size": 20}, "evaluation": {"proxy_holdout": 20}})
    module = nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"evaluation\.proxy_holdout"):
        algorithms.build(setting, 20, 8, torch.device("cpu"), torch.ones(20), module=module, proxy=None)


# --------------------------------------------------------------------------- the teachers' BatchNorm statistics


def bn_problem(k=3):
    """A BatchNorm MLP, k client models, each client's own running statistics, and the cohort's average."""
    import copy

    g = torch.Generator().manual_seed(3)
    module = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).double()
    n = sum(p.numel() for p in module.parameters())
    x = torch.randn(n, generator=g, dtype=torch.float64)
    deltas = 0.3 * torch.randn(k, n, generator=g, dtype=torch.float64)
    own = torch.cat(
        [
            torch.randn(k, 4, generator=g, dtype=torch.float64),  # running means
            0.5 + torch.rand(k, 4, generator=g, dtype=torch.float64),
        ],
        1,
    )  # running variances
    averaged = own.mean(0)
    module[1].running_mean.copy_(averaged[:4])
    module[1].running_var.copy_(averaged[4:])
    updates = RoundUpdates(
        0,
        torch.arange(k),
        deltas,
        torch.tensor([10.0, 30.0, 60.0][:k], dtype=torch.float64),
        torch.ones(k),
        torch.zeros(k),
        0.1,
        buffers=own,
    )
    proxy_x = torch.randn(6, 3, generator=g, dtype=torch.float64)

    def scored(w, buffers=None, train=False):
        """The oracle: a fresh copy of the module holding w (and buffers), in eval or train mode."""
        net = copy.deepcopy(module)
        torch.nn.utils.vector_to_parameters(w, net.parameters())
        if buffers is not None:
            net[1].running_mean.copy_(buffers[:4])
            net[1].running_var.copy_(buffers[4:])
        net.train(train)
        with torch.no_grad():
            return net(proxy_x)

    return module, x, updates, proxy_x, torch.tensor([0, 1, 1, 0, 1, 0]), scored


@pytest.mark.parametrize("statistics", ["global", "code"])
def test_feddf_teachers_score_with_their_own_or_the_averaged_statistics(statistics):
    module, x, updates, px, py, scored = bn_problem()
    agg = make(EnsembleDistillation, module, px, py, cfg={"teacher_statistics": statistics})
    models = x - updates.deltas
    before = [b.clone() for b in module.buffers()]
    agg.prepare(x, x - updates.weighted_mean(), models, updates)
    own = statistics == "code"
    expected = torch.stack([scored(w, updates.buffers[i] if own else None) for i, w in enumerate(models)]).mean(0)
    torch.testing.assert_close(agg.teacher, expected, rtol=0, atol=1e-12)
    other = torch.stack([scored(w, None if own else updates.buffers[i]) for i, w in enumerate(models)]).mean(0)
    assert not torch.allclose(agg.teacher, other)  # the two readings differ on this problem
    assert all(torch.equal(a, b) for a, b in zip(before, module.buffers()))  # the global statistics stay


def test_fedbe_codes_fedavg_and_swag_teachers_use_batch_statistics():
    module, x, updates, px, py, scored = bn_problem()
    agg = make(BayesianEnsembleDistillation, module, px, py, cfg={"teacher_statistics": "code"}, seed=4)
    models = x - updates.deltas
    x_avg = x - updates.weighted_mean()
    before = [b.clone() for b in module.buffers()]
    agg.prepare(x, x_avg, models, updates)
    eps = torch.randn(len(x), generator=round_generator(4, 0, "swag"), dtype=torch.float64)
    swag = swag_sample(x, models, FunctionalModel(module).slices(), 0.1, eps)
    expected = torch.stack(
        [
            scored(x_avg, train=True),
            *(scored(w, updates.buffers[i]) for i, w in enumerate(models)),
            scored(swag, train=True),
        ]
    ).mean(0)
    torch.testing.assert_close(agg.teacher, expected, rtol=0, atol=1e-12)
    assert all(torch.equal(a, b) for a, b in zip(before, module.buffers()))
    assert module.training  # the module's mode is left as it was


# --------------------------------------------------------------------------- the proxy set's sampling and the wiring


def test_balanced_sampling_draws_every_class_equally_often_with_replacement():
    """FedLAW Table 6's "BS": each draw picks a class uniformly, then a sample of it uniformly (a class-balanced
    sampler with replacement), on the generator it is given."""
    from fedrepro.algorithms.proxy import epoch_batches

    labels = torch.tensor([0] * 90 + [1] * 9 + [2])  # 90 : 9 : 1
    draws = torch.cat(
        [torch.cat(epoch_batches(100, 32, torch.Generator().manual_seed(s), "cpu", labels)) for s in range(60)]
    )
    counts = torch.bincount(labels[draws], minlength=3).double()
    expected = len(draws) / 3
    assert ((counts - expected).abs() < 5 * math.sqrt(expected)).all(), counts  # 5 standard errors
    assert (draws == 99).sum() > 0.2 * expected  # the single sample of class 2 is drawn again and again
    one = epoch_batches(100, 32, torch.Generator().manual_seed(3), "cpu", labels)
    again = epoch_batches(100, 32, torch.Generator().manual_seed(3), "cpu", labels)
    other = epoch_batches(100, 32, torch.Generator().manual_seed(4), "cpu", labels)
    assert all(torch.equal(a, b) for a, b in zip(one, again)) and not torch.equal(torch.cat(one), torch.cat(other))
    assert [len(b) for b in one] == [32, 32, 32, 4]


@pytest.mark.parametrize("cls", [ProxyFineTune, EnsembleDistillation, BayesianEnsembleDistillation, LearnedAggregation])
@pytest.mark.parametrize("balanced", [False, True])
def test_proxy_batches_come_from_the_rounds_stream_and_balance_only_when_asked(cls, balanced, monkeypatch):
    """Every server epoch draws its batches from the round's generator of the method's stream, balanced by the
    proxy labels only with balanced_sampling (the batches a resumed run repeats)."""
    from fedrepro.algorithms import fedlaw, proxy

    calls = []
    original = proxy.epoch_batches

    def recorded(n, batch_size, generator, device, balance=None):
        calls.append((generator.initial_seed(), balance))
        return original(n, batch_size, generator, device, balance)

    monkeypatch.setattr(proxy, "epoch_batches", recorded)
    monkeypatch.setattr(fedlaw, "epoch_batches", recorded)
    module, x, updates, px, py = problem(round_=2)
    if cls is LearnedAggregation:
        agg = LearnedAggregation(module, px, py, {**FEDLAW, "variant": "fedlaw", "balanced_sampling": balanced}, 1.0, 7)
        stream = "proxy"
    else:
        agg = make(cls, module, px, py, {"balanced_sampling": balanced, "server_epochs": 2}, seed=7)
        stream = agg.stream
    agg(x, updates)
    assert calls and all(seed == round_generator(7, 2, stream).initial_seed() for seed, _ in calls)
    assert all((balance is py) if balanced else balance is None for _, balance in calls)


def test_the_proxy_loss_and_the_server_step_are_logged_as_defined():
    """proxy_loss: the mean loss over the last server epoch's samples (batches of 3, 3 and 2 weigh by their size);
    server_step_norm: ||w - x_avg||; weights: the data-size weights of the FedAvg start."""
    module, x, updates, px, py = problem()
    px, py = torch.cat([px, px[:4]]), torch.cat([py, py.flip(0)])  # 8 samples
    agg = make(ProxyFineTune, module, px, py, {"batch_size": 3, "server_epochs": 1}, {"lr": 0.0, "momentum": 0.0})
    x_avg = x - updates.weighted_mean()
    d = agg(x, updates)
    loss = torch.nn.functional.cross_entropy(linear_logits(x_avg, px), py)  # lr 0: every batch at x_avg
    assert updates.info["proxy_loss"] == pytest.approx(float(loss), rel=1e-12)
    assert updates.info["server_step_norm"] == pytest.approx(float((x - d - x_avg).norm()), abs=1e-15)
    torch.testing.assert_close(updates.info["weights"], updates.weights)
    moving = make(ProxyFineTune, module, px, py, {"batch_size": 3, "server_epochs": 1})
    updates.info = {}
    w = x - moving(x, updates)
    assert (
        updates.info["server_step_norm"] == pytest.approx(float((w - x_avg).norm()), rel=1e-12)
        and float((w - x_avg).norm()) > 1e-3
    )


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_server_optimiser_is_built_with_every_setting(optimizer, monkeypatch):
    """The server optimiser gets the section's lr, momentum or betas, and weight decay (the paper's and codes'
    non-default values), and keeps its state across rounds only with keep_state."""
    built = []
    for name in ("SGD", "Adam"):
        original = getattr(torch.optim, name)

        def recorder(params, _original=original, **kwargs):
            built.append(kwargs)
            return _original(params, **kwargs)

        monkeypatch.setattr(torch.optim, name, recorder)
    module, x, updates, px, py = problem()
    optim = {"optimizer": optimizer, "lr": 0.02, "momentum": 0.7, "weight_decay": 0.003, "betas": (0.5, 0.99)}
    agg = make(ProxyFineTune, module, px, py, {"keep_state": False}, optim)
    agg(x, updates)
    expected = {
        "lr": 0.02,
        "weight_decay": 0.003,
        **({"momentum": 0.7} if optimizer == "sgd" else {"betas": (0.5, 0.99)}),
    }
    assert built == [expected]
    assert agg.opt_state == {}  # nothing kept without keep_state


class _Held:
    """The engine's held-out proxy set, as algorithms.build reads it."""

    def __init__(self, inputs, labels):
        self.inputs, self.labels = inputs, labels

    def __len__(self):
        return len(self.labels)

    def batch(self, index):
        return self.inputs[index], self.labels[index]


@pytest.mark.parametrize("name", ["feddf", "fedbe", "serverft"])
def test_a_proxy_method_is_built_with_the_runs_server_lr_seed_and_name(name):
    from fedrepro import algorithms

    setting = settings.resolve(
        {"algorithm": name, "seed": 5, "server": {"lr": 0.5}, "evaluation": {"proxy_holdout": 20},
         name: {"proxy_size": 20}}
    )  # fmt: skip
    module, x, updates, px, py = problem()
    proxy = _Held(px.repeat(5, 1), py.repeat(5))  # the 20-sample hold-out the engine hands a proxy method
    algo = algorithms.build(setting, 3, 8, torch.device("cpu"), torch.ones(3), module=module, proxy=proxy)
    assert algo.name == name and algo.aggregator.server_lr == 0.5 and algo.aggregator.seed == 5
    x_new = algo.server_step(x, updates)
    torch.testing.assert_close(x_new, x - algo.aggregator(x, updates))  # a unit server step: w is the new model


def test_swags_variance_is_per_coordinate():
    """Two unit directions (1, 0) and (0.6, 0.8): mean (0.8, 0.4), E[u^2] (0.68, 0.32), variance (0.04, 0.16),
    per coordinate (their mean over all coordinates would give 0.5 - m^2 instead)."""
    module = nn.Linear(2, 1, bias=False).double()
    slices = list(FunctionalModel(module).slices())
    x = torch.zeros(2, dtype=torch.float64)
    models = torch.tensor([[1.0, 0.0], [0.6, 0.8]], dtype=torch.float64)  # both of norm 1
    eps = torch.tensor([1.0, 1.0], dtype=torch.float64)
    expected = torch.tensor([0.8 + 0.1 * 0.2, 0.4 + 0.1 * 0.4], dtype=torch.float64)
    torch.testing.assert_close(swag_sample(x, models, slices, 0.1, eps), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["feddf", "fedbe", "serverft"])
def test_a_proxy_method_without_the_runs_model_or_holdout_says_what_it_holds(name):
    from fedrepro.algorithms import BuildContext
    from fedrepro.algorithms.proxy import build_proxy_algorithm, proxy_samples

    module, _, _, px, py = problem()
    held = BuildContext(3, 8, torch.device("cpu"), torch.ones(3), module, (px, py))
    with pytest.raises(ValueError, match=rf"^{name}\.proxy_size = 30 but the run holds out 4 proxy samples"):
        proxy_samples(held, name, 30)
    with pytest.raises(ValueError, match=rf"^{name}\.proxy_size = 30 but the run holds out 0 proxy samples"):
        proxy_samples(BuildContext(3, 8, torch.device("cpu"), torch.ones(3), module, None), name, 30)
    setting = settings.resolve({"algorithm": name, "evaluation": {"proxy_holdout": 20}, name: {"proxy_size": 20}})
    no_model = BuildContext(3, 8, torch.device("cpu"), torch.ones(3), None, (px, py))
    with pytest.raises(ValueError, match=rf"^{name} needs the run's model"):
        build_proxy_algorithm(name, ProxyFineTune, setting, no_model)
    four = BuildContext(3, 8, torch.device("cpu"), torch.ones(3), module, (px, py))  # 4 held out, 20 asked
    with pytest.raises(ValueError, match=rf"^{name}\.proxy_size = 20 but the run holds out 4"):
        build_proxy_algorithm(name, ProxyFineTune, setting, four)
