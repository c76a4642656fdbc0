"""The batched path (run/batched.py) against the sequential client loop (run/client.py's LocalSGD), the reference.

Both start from the same Trainer state; each client draws its own batches, takes its own number of steps
and applies its method's terms in both, so the client updates agree up to float32 rounding
(``rounding_bound`` derives the tolerance), and what is elementwise or drawn (step counts, BatchNorm
statistics of the first step, dropout masks, crops, the global generator afterwards) agrees exactly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import (
    BATCHED_BATCH,
    BATCHED_SIZES,
    assert_updates_equal,
    batched_data,
    batched_trainer,
    bn_module,
    cifar_like,
    from_one_global_seed,
    local_round,
    rounding_bound,
    small_cnn,
)
from fedrepro.parts import ClientObjective
from fedrepro.run.batchable import unsupported

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

EPS32 = torch.finfo(torch.float32).eps


def _pair(tmp_path, **kw):
    return batched_trainer(tmp_path, "off", **kw), batched_trainer(tmp_path, "on", **kw)


# ------------------------------------------------------------------ masked steps


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_unequal_clients_train_together_as_one_after_another(tmp_path, model):
    plain, fast = _pair(tmp_path, model=model)
    a, b = local_round(plain), local_round(fast)
    assert fast.batched.rounds_trained, "the batched path was not taken"
    assert a.steps.tolist() == [2 * math.ceil(n / BATCHED_BATCH) for n in BATCHED_SIZES]  # unequal: 6, 2, 4, 8, 6
    bound = rounding_bound(plain, int(a.steps.max()), 0.05, 0.5)
    assert_updates_equal(a, b, bound)
    torch.testing.assert_close(b.losses, a.losses, rtol=0, atol=bound)


def test_per_client_epochs_train_together(tmp_path):
    """FedNova's random epochs: every client its own epoch count, drawn per round."""
    plain, fast = _pair(tmp_path, plugins=["random_epochs"], random_epochs={"low": 1, "high": 3})
    for t in range(2):
        a, b = local_round(plain, t), local_round(fast, t)
        assert len(set(a.steps.tolist())) > 2
        assert_updates_equal(a, b, rounding_bound(plain, int(a.steps.max()), 0.05, 0.5))


def test_per_client_batch_sizes_train_together(tmp_path):
    """+random_batch: every client its own batch size (one vmapped call per size at each step)."""
    plain, fast = _pair(tmp_path, plugins=["random_batch"], random_batch={"low": 3})
    a, b = local_round(plain), local_round(fast)
    assert_updates_equal(a, b, rounding_bound(plain, int(a.steps.max()), 0.05, 0.5))


def test_whole_runs_agree_metric_for_metric(tmp_path):
    rows = {}
    for mode in ("off", "on"):
        trainer = batched_trainer(tmp_path, mode, participation=0.6, local_epochs=1)
        rows[mode] = [trainer.round(t) for t in range(3)]
    bound = rounding_bound(batched_trainer(tmp_path, "x"), 3 * 4, 0.05, 0.5)
    for plain, fast in zip(rows["off"], rows["on"]):
        for key in ("train_loss", "global_norm", "step_norm", "update_norm_mean", "test_loss"):
            assert fast[key] == pytest.approx(plain[key], abs=10 * bound), key


def test_a_finished_client_gets_exactly_its_own_steps(tmp_path):
    """The client with 7 samples takes 2 steps while others take up to 8; trained alone (a cohort of one,
    sequential, with its own shuffling stream) it ends where its row of the batched round ends."""
    _, fast = _pair(tmp_path)
    b = local_round(fast)
    alone = batched_trainer(tmp_path, "off", sizes=[7], datasets=batched_data(BATCHED_SIZES))
    alone.inputs.client_index = [fast.inputs.client_index[1]]
    alone.shuffle_generator = lambda t, c: fast.shuffle_generator(t, 1)
    one = alone.train_cohort(alone.plan(0, np.array([0]), fast.x0.clone(), 0.05))
    assert one.steps.item() == b.steps[1].item() == 2
    torch.testing.assert_close(one.deltas[0], b.deltas[1], rtol=0, atol=rounding_bound(alone, 2, 0.05, 0.5))


def test_modes_and_fallbacks(tmp_path):
    auto = batched_trainer(tmp_path, "auto")
    assert not auto.train_together(np.arange(5))  # CPU: sequential unless asked
    fast = batched_trainer(tmp_path, "on")
    assert fast.train_together(np.arange(5))
    unbatched = batched_trainer(tmp_path, "on")
    unbatched.algorithm.corrections.append(type("Unbatched", (ClientObjective.__base__,), {})())
    assert not unbatched.train_together(np.arange(5))  # decided once, from the declared forms
    assert unbatched.batched.why_not == ["Unbatched has no batched form"]
    fast.inputs.train = type("Tokens", (), {"batched_cohort": False, "augment": False})()
    assert unsupported(fast.model.module, fast.inputs.train, [], None)


# ------------------------------------------------------------------ methods' client terms

# name: (setting, passes per step, the client state its end hooks keep (part, attribute) or None, and that
# state's size per unit of update: Delta / (lr tau) for SCAFFOLD and FedNova-VR (tau, ||a||_1 >= 1), alpha Delta for
# FedDyn)
METHODS = {
    "fedprox": ({"algorithm": "fedprox", "fedprox": {"mu": 0.5}}, 1, None, 0),
    "scaffold": ({"algorithm": "scaffold"}, 1, ("correction0", "c_clients"), 1 / 0.05),
    "feddyn": ({"algorithm": "feddyn", "feddyn": {"alpha": 0.1}}, 1, ("correction0", "grad_state"), 0.1),
    "feddyn_norm": (
        {"algorithm": "feddyn", "feddyn": {"alpha": 0.1, "form": "fedlaw_code"}},
        1,
        ("correction0", "grad_state"),
        0.1,
    ),
    "fedcm": ({"algorithm": "fedcm", "fedcm": {"alpha": 0.5}}, 1, None, 0),
    "fednova_prox": ({"algorithm": "fednova", "fednova": {"mu": 0.5}}, 1, None, 0),
    "fednova_vr": (
        {"algorithm": "fednova", "fednova": {"vr": True}, "client": {"momentum": 0.0}},
        1,
        ("correction0", "d_clients"),
        1 / 0.05,
    ),
    # momentum or a proximal term (never both with VR) make ||a_i||_1 depend on rho or mu: the end hook reads each
    "fednova_vr_momentum": (
        {"algorithm": "fednova", "fednova": {"vr": True}, "client": {"momentum": 0.5}},
        1,
        ("correction0", "d_clients"),
        1 / 0.05,
    ),
    "fednova_vr_prox": (
        {"algorithm": "fednova", "fednova": {"vr": True, "mu": 0.5}, "client": {"momentum": 0.0}},
        1,
        ("correction1", "d_clients"),
        1 / 0.05,
    ),
    "fedasam": ({"algorithm": "fedasam", "fedasam": {"rho": 0.7, "eta": 0.2}}, 2, None, 0),
}


def _parts(trainer):
    return trainer.algorithm.parts()


@pytest.mark.parametrize("name", list(METHODS))
def test_methods_client_terms_train_together(tmp_path, name):
    """Round 0 sequentially in both trainers gives the methods' state (c_i, l_i, G, d_i) something to act with;
    round 1's local training is then batched in one of them and compared, with the client state its
    ``end`` hooks leave."""
    setting, passes, kept, scale = METHODS[name]
    plain, fast = _pair(tmp_path, **setting)
    fast.cohort_mode = "off"
    x0 = plain.model.flat.clone()
    for trainer in (plain, fast):
        trainer.round(0)
    assert torch.equal(plain.model.flat, fast.model.flat)
    fast.cohort_mode = "on"
    x = plain.model.flat.clone()
    a, b = local_round(plain, 1, x), local_round(fast, 1, x)
    assert fast.batched.rounds_trained, "the batched path was not taken"
    bound = rounding_bound(plain, int(a.steps.max()), 0.05, plain.setting["client"]["momentum"], passes)
    assert_updates_equal(a, b, bound)
    if kept is not None:
        part, attribute = kept
        before = getattr(_parts(plain)[part], attribute)
        after = getattr(_parts(fast)[part], attribute)
        torch.testing.assert_close(after, before, rtol=0, atol=scale * bound)
        assert before.abs().max() > 100 * scale * bound
    assert not torch.equal(x0, x)


# ------------------------------------------------------------------ optimiser state, BatchNorm, randomness


def test_kept_client_momentum_trains_together(tmp_path):
    """client.keep_momentum: each client's buffer continues from its last round (round 0 sequential in both
    leaves them non-zero) and is written back after the batched round."""
    plain, fast = _pair(tmp_path, client={"keep_momentum": True, "momentum": 0.9})
    fast.cohort_mode = "off"
    for trainer in (plain, fast):
        trainer.round(0)
    fast.cohort_mode = "on"
    assert torch.equal(plain.client_momentum, fast.client_momentum) and plain.client_momentum.abs().max() > 0
    x = plain.model.flat.clone()
    a, b = local_round(plain, 1, x), local_round(fast, 1, x)
    bound = rounding_bound(plain, int(a.steps.max()), 0.05, 0.9)
    assert_updates_equal(a, b, bound)
    # a buffer is a sum of gradients with weights mu^k: its rounding gap is the update's divided by lr
    torch.testing.assert_close(fast.client_momentum, plain.client_momentum, rtol=0, atol=bound / 0.05)
    assert (fast.client_momentum - plain.client_momentum).abs().max() < 1e-3 * plain.client_momentum.abs().max()


def test_batchnorm_statistics_per_client(tmp_path):
    """Every client starts from the global running statistics and moves its own; the engine's average of the
    final ones is the next global statistics, as after the sequential loop; the batch counter too."""
    plain, fast = _pair(tmp_path, module=bn_module)
    assert len(plain.model.buffers)
    a, b = local_round(plain), local_round(fast)
    bound = rounding_bound(plain, int(a.steps.max()), 0.05, 0.5)
    assert_updates_equal(a, b, bound)
    assert a.buffers is not None and b.buffers is not None
    # the statistics are means of activations the parameters' rounding gap moves by at most ~ bound times
    # the activations' size per unit of weight (the inputs are normalised, of order 1)
    assert not torch.equal(a.buffers[0], a.buffers[1])  # each client its own
    torch.testing.assert_close(b.buffers, a.buffers, rtol=0, atol=10 * bound)
    torch.testing.assert_close(fast.model.buffers, plain.model.buffers, rtol=0, atol=10 * bound)
    counters = [dict(t.model.module.named_buffers())["1.num_batches_tracked"] for t in (plain, fast)]
    assert counters[0].item() == counters[1].item() == int(a.steps.sum())


def test_the_first_step_s_batchnorm_statistics_are_the_same_numbers(tmp_path):
    """One step from the same start: each client's statistics are its own batch's, up to the rounding of
    the sums they are made of.

    The vmapped convolution may add a conv output's 9 products and bias in another order than the plain one,
    and a channel's mean and variance add R = batch x 13 x 13 outputs (or squares) in another order. As in
    ``rounding_bound``, two orders of n roundings differ by about sqrt(n) eps32 (random walk) times the
    terms' size; with s = |w| * |x| + |b| (each output's terms' sizes, measured on the sequential path here),
    a mean is off by about sqrt(R + 10) eps32 mean(s), a variance by 2 sqrt(R + 10) eps32 mean(s^2); the
    running statistics take 0.1 of that (BatchNorm's momentum), and a factor 2 covers the two sums'
    roundings added. Bit-equality holds on some CPUs' kernels only (not on every x86-64 one)."""
    plain, fast = _pair(tmp_path, module=bn_module, sizes=[16, 16, 9], local_epochs=1)
    sizes = []

    def measure(conv, inputs, _):
        s = F.conv2d(inputs[0].abs(), conv.weight.abs(), conv.bias.abs(), conv.stride)
        sizes.append(max(float(s.mean((0, 2, 3)).max()), float((s * s).mean((0, 2, 3)).max())))

    hook = plain.model.module[0].register_forward_hook(measure)
    a = local_round(plain)
    hook.remove()
    b = local_round(fast)
    assert a.steps.tolist() == b.steps.tolist() == [1, 1, 1]
    bound = 2 * 0.1 * 2 * math.sqrt(16 * 13 * 13 + 10) * EPS32 * max(sizes)
    gap = float((a.buffers - b.buffers).abs().max())
    assert gap <= bound, f"the statistics differ by {gap:.3e} > {bound:.3e}"
    # the bound separates one client's statistics from another's
    assert float((a.buffers[0] - a.buffers[1]).abs().max()) > 10 * bound


def _dropout_mlp():
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 64),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(64, 32),
        nn.ReLU(),
        nn.Dropout(0.3),
        nn.Linear(32, 10),
    )


@pytest.mark.parametrize("method", ["fedavg", "fedasam"])
def test_dropout_masks_are_each_clients_own(tmp_path, method):
    """Each client sees the masks it draws when trained alone (FedASAM: two a step), and the global generator
    ends where the sequential loop leaves it."""
    extra = {"algorithm": method, **({"fedasam": {"rho": 0.7, "eta": 0.2}} if method == "fedasam" else {})}
    plain, fast = _pair(tmp_path, module=_dropout_mlp, **extra)
    (a, b), states = from_one_global_seed((plain, fast), 11)
    assert_updates_equal(a, b, rounding_bound(plain, int(a.steps.max()), 0.05, 0.5, 2 if method == "fedasam" else 1))
    assert torch.equal(states[0], states[1])


def test_augmentation_draws_are_each_clients_own(tmp_path):
    """Crops and flips (and a dropout layer after them) as when each client trains alone; the global
    generator ends where the sequential loop leaves it."""
    datasets = cifar_like(BATCHED_SIZES)
    plain, fast = _pair(tmp_path, module=small_cnn, datasets=datasets, dataset="cifar10", model="cnn")
    assert fast.inputs.train.augment and fast.train_together(np.arange(5))
    (a, b), states = from_one_global_seed((plain, fast), 12)
    assert_updates_equal(a, b, rounding_bound(plain, int(a.steps.max()), 0.05, 0.5))
    assert torch.equal(states[0], states[1])


def test_drawn_ahead_crops_are_the_crops_batch_draws():
    train, _ = cifar_like([20])
    index = torch.tensor([[3, 1, 4], [15, 9, 2]])
    torch.manual_seed(5)
    expected = [train.batch(row) for row in index]
    torch.manual_seed(5)
    draws = [train.augment_draws(3) for _ in index]
    x, y = train.batch_drawn(index, draws)
    for k, (ex, ey) in enumerate(expected):
        assert torch.equal(x[k], ex) and torch.equal(y[k], ey)


# ------------------------------------------------------------------ FedFA: a feature loss, calibration, anchors


def _feature_gain(trainer) -> float:
    """How far the features (the classifier's input) move per unit of parameter gap, in the random-walk
    reading ``rounding_bound`` takes of rounding gaps (independent signs add like sqrt of their count): through
    a layer whose output sums R inputs (a Linear's fan-in, a convolution's patch), a gap delta in every weight
    moves an output by sqrt(R) delta max|input| (+ delta, its bias), and an input gap g by sqrt(R) max|w| g;
    ReLU and pooling do not enlarge a gap. Measured on the sequential path's first batch, in this process."""
    module, index = trainer.model.module, trainer.inputs.client_index[0][:BATCHED_BATCH]
    x, _ = trainer.inputs.train.batch(index)
    layers = [m for m in module.modules() if isinstance(m, (nn.Linear, nn.Conv2d))][:-1]  # up to the features
    largest = []
    hooks = [m.register_forward_hook(lambda m, i, o: largest.append(float(i[0].abs().max()))) for m in layers]
    with torch.no_grad():
        module(x)
    for h in hooks:
        h.remove()
    gain = 0.0
    for layer, biggest in zip(layers, largest):
        root = math.sqrt(layer.weight[0].numel())  # R: the terms one output sums
        gain = root * float(layer.weight.detach().abs().max()) * gain + root * biggest + 1
    return gain


@pytest.mark.parametrize(
    "calibration_start, sizes",
    [
        (0.25, BATCHED_SIZES),
        (0.0, BATCHED_SIZES),
        (0.25, [24] * 5),
    ],
)
def test_fedfa_trains_together(tmp_path, calibration_start, sizes):
    """Round 0 (cross-entropy alone) and round 1 (the anchor loss, and with calibration_start 0 the classifier's
    Adam calibration after every step): the updates, each client's anchors and the averaged anchors. Equal
    sizes: every step holds every row (the step's view names no rows)."""
    setting = {"algorithm": "fedfa", "model": "cnn", "fedfa": {"calibration_start": calibration_start}}
    plain, fast = _pair(tmp_path, sizes=sizes, **setting)
    for t in range(2):
        x = plain.model.flat.clone()
        a, b = local_round(plain, t, x), local_round(fast, t, x)
        assert fast.batched.rounds_trained, "the batched path was not taken"
        # calibration's Adam moves each classifier entry by at most its lr a step, in both paths alike
        bound = rounding_bound(plain, int(a.steps.max()), 0.05, 0.5)
        assert_updates_equal(a, b, bound)
        mine, theirs = plain.algorithm.objective, fast.algorithm.objective
        # an anchor is a mean of features, each moved by at most the feature gain times the parameter gap
        anchor_bound = _feature_gain(plain) * bound
        for c in mine.client_anchors:
            torch.testing.assert_close(theirs.client_anchors[c], mine.client_anchors[c], rtol=0, atol=anchor_bound)
        assert (
            max(float((mine.client_anchors[c] - mine.anchors).abs().max()) for c in mine.client_anchors)
            > 100 * anchor_bound
        ), "the anchor bound does not separate moving from not moving"
        for trainer, updates in ((plain, a), (fast, b)):
            trainer.algorithm.objective.end_round(updates)
            trainer.model.flat.copy_(x - updates.weighted_mean())
        fast.model.flat.copy_(plain.model.flat)


def test_a_declared_form_must_be_defined(tmp_path):
    """A part that declares a batched form it does not define is refused when the run's batched path is built."""
    trainer = batched_trainer(tmp_path, "on")
    trainer.algorithm.corrections.append(type("Claims", (ClientObjective.__base__,), {"batched_forms": {"step"}})())
    with pytest.raises(TypeError, match="Claims declares batched forms it does not define: batched"):
        trainer.train_together(np.arange(5))
