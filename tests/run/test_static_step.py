"""The static-shape step (run/static_step.py, setting ``step_graph``) against the batched path and the sequential loop.

Every step computes all K rows of a group and masks the rows without a batch of that size; a masked row must keep
its parameters, momentum and BatchNorm statistics and add nothing, and a live row must compute what it computes
among fewer rows. So a static round's client updates agree with the sequential reference within the bound
tests/run/test_batched.py derives (``conftest.rounding_bound``), with unequal step counts and batch sizes, momentum,
weight decay, BatchNorm and dropout; what is drawn (step counts, masks, crops, the global generator afterwards)
agrees exactly. A masked row that moved would be off by a whole SGD step, far above the bound
(``assert_updates_equal`` checks the bound separates moving from not moving). ``torch.compile`` is exercised on
CPU through the "aot_eager" backend (dynamo's whole-graph capture and AOT autograd, no generated code); inductor,
which on a GPU also replays the graph as CUDA graphs, in one small slow test.
"""

from __future__ import annotations

import pytest
import torch

from conftest import (
    BATCHED_SIZES,
    PACKED_ROUNDS,
    assert_updates_equal,
    batched_trainer,
    bn_module,
    cifar_like,
    from_one_global_seed,
    local_round,
    packed_alone,
    packed_trainer,
    rounding_bound,
    small_cnn,
)
from fedrepro import identity
from fedrepro.configure.settings import resolve
from fedrepro.errors import FedreproError
from fedrepro.ops import gpucheck
from fedrepro.run.packed import PackedRuns
from fedrepro.run.static_step import StaticStepSGD

pytestmark = pytest.mark.floats


def _three(tmp_path, **kw):
    """The sequential loop, the batched path and the static-shape step, each in its own trainer from one start."""
    return (
        batched_trainer(tmp_path / "seq", "off", **kw),
        batched_trainer(tmp_path / "batched", "on", **kw),
        batched_trainer(tmp_path / "static", "auto", step_graph="static", **kw),  # auto: CPU takes it when asked for
    )


def _compiled(trainer, backend="aot_eager"):
    """The trainer's static step under torch.compile (a backend that runs on this CPU)."""
    old = trainer.batched.sgd
    trainer.batched.sgd = StaticStepSGD(old.module, old.rule, old.max_together, "compile", backend)
    return trainer.batched.sgd


def _check(plain, others, momentum=0.5, bn=False):
    """Each of ``others``' round against the sequential one ``plain``, within the derived bound."""
    a = plain
    bound = None
    for b in others:
        if bound is None:
            bound = rounding_bound(a.trainer, int(a.updates.steps.max()), 0.05, momentum)
        assert_updates_equal(a.updates, b.updates, bound)
        torch.testing.assert_close(b.updates.losses, a.updates.losses, rtol=0, atol=bound)
        if bn:
            torch.testing.assert_close(b.updates.buffers, a.updates.buffers, rtol=0, atol=10 * bound)
    return bound


class _Round:
    def __init__(self, trainer, updates):
        self.trainer, self.updates = trainer, updates


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_unequal_clients_static_equals_batched_and_sequential(tmp_path, model):
    """Step counts 6, 2, 4, 8, 6 and last batches of 8, 7, 7, 16, 5: rows finish at different steps and the short
    batches are other shapes; momentum 0.5 and weight decay on."""
    plain, batched, static = _three(tmp_path, model=model)
    rounds = [_Round(t, local_round(t)) for t in (plain, batched, static)]
    assert static.batched.rounds_trained and isinstance(static.batched.sgd, StaticStepSGD)
    assert static.batched.sgd.shapes_compiled == {(5, 16), (5, 8), (5, 7), (5, 5)}  # all K rows every call
    _check(rounds[0], rounds[1:])


def test_per_client_batch_sizes(tmp_path):
    """+random_batch: every client its own batch size, so most rows are masked in most calls."""
    plain, batched, static = _three(tmp_path, plugins=["random_batch"], random_batch={"low": 3})
    rounds = [_Round(t, local_round(t)) for t in (plain, batched, static)]
    assert len({b for _, b in static.batched.sgd.shapes_compiled}) > 3
    _check(rounds[0], rounds[1:])


def test_kept_momentum_of_masked_rows_stays(tmp_path):
    """client.keep_momentum 0.9: a finished client's momentum row is written back as its last step left it."""
    trainers = _three(tmp_path, client={"keep_momentum": True, "momentum": 0.9})
    for t in trainers:  # round 0 sequential in every trainer: non-zero buffers to continue from
        mode, t.cohort_mode = t.cohort_mode, "off"
        t.round(0)
        t.cohort_mode = mode
    x = trainers[0].model.flat.clone()
    rounds = [_Round(t, local_round(t, 1, x)) for t in trainers]
    bound = _check(rounds[0], rounds[1:], momentum=0.9)
    for t in trainers[1:]:
        torch.testing.assert_close(t.client_momentum, trainers[0].client_momentum, rtol=0, atol=bound / 0.05)


def test_batchnorm_statistics_of_masked_rows_stay(tmp_path):
    plain, batched, static = _three(tmp_path, module=bn_module)
    rounds = [_Round(t, local_round(t)) for t in (plain, batched, static)]
    _check(rounds[0], rounds[1:], bn=True)
    counters = [dict(t.model.module.named_buffers())["1.num_batches_tracked"].item() for t in (plain, static)]
    assert counters[0] == counters[1] == int(rounds[0].updates.steps.sum())  # masked rows count no batch


def test_dropout_and_crops_are_drawn_as_the_sequential_path_draws_them(tmp_path):
    """Crops, flips and a dropout mask per step, drawn ahead in the sequential order; the global generator ends
    where the sequential loop leaves it, the masked rows drawing nothing."""
    datasets = cifar_like(BATCHED_SIZES)
    trainers = _three(tmp_path, module=small_cnn, datasets=datasets, dataset="cifar10", model="cnn")
    results, states = from_one_global_seed(trainers, 12)
    _check(_Round(trainers[0], results[0]), [_Round(t, r) for t, r in zip(trainers[1:], results[1:])])
    assert torch.equal(states[0], states[2]) and torch.equal(states[0], states[1])


def _bn_dropout():
    """BatchNorm, then two dropout layers: every kind of per-row state and draw in one model."""
    nn = torch.nn
    return nn.Sequential(
        *bn_module()[:-1], nn.Dropout(0.4), nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 10)
    )


def _seeded(trainers, seed: int, t: int, x):
    """Each trainer's round t from ``x`` with the global generator at one state, and the state it leaves."""
    results, states = [], []
    for trainer in trainers:
        torch.manual_seed(seed)
        results.append(local_round(trainer, t, x))
        states.append(torch.get_rng_state())
    return results, states


def test_compiled_step_captures_one_graph_and_equals_sequential(tmp_path):
    """torch.compile(fullgraph=True: a graph break fails) through dynamo and AOT autograd ("aot_eager": no C++
    compile on this CPU): BatchNorm, two dropout layers, momentum, weight decay; two rounds, the second reusing
    the first's graphs at another learning rate (a 0-dim tensor, not a constant)."""
    plain = batched_trainer(tmp_path / "seq", "off", module=_bn_dropout, client={"lr_decay": 0.5})
    static = batched_trainer(
        tmp_path / "compiled", "auto", module=_bn_dropout, step_graph="compile", client={"lr_decay": 0.5}
    )
    engine = _compiled(static)
    x = plain.model.flat.clone()
    for t in (0, 1):
        (a, b), states = _seeded((plain, static), 20 + t, t, x)
        _check(_Round(plain, a), [_Round(static, b)], bn=True)
        assert torch.equal(states[0], states[1])
    assert plain.client_lr(1) != plain.client_lr(0)
    assert static.batched.rounds_trained == 2 and {b for _, b in engine.shapes_compiled} == {16, 8, 7, 5}


@pytest.mark.slow
def test_inductor_compiles_the_step_on_cpu(tmp_path):
    """The default backend (inductor, mode reduce-overhead: CUDA graphs on a GPU, generated C++ here), one
    shape: three equal clients of 16 samples, one epoch (tens of seconds of compiling on a 2-core machine)."""
    kw = {"sizes": [16, 16, 16], "local_epochs": 1}
    plain = batched_trainer(tmp_path / "seq", "off", **kw)
    static = batched_trainer(tmp_path / "compiled", "auto", step_graph="compile", **kw)
    assert static.batched.sgd.graph == "compile"
    rounds = [_Round(t, local_round(t)) for t in (plain, static)]
    assert static.batched.sgd.shapes_compiled == {(3, 16)}
    _check(rounds[0], rounds[1:])


# ------------------------------------------------------------------ the setting


def test_a_bad_value_is_one_line_naming_the_setting_and_its_values():
    with pytest.raises(FedreproError) as err:
        resolve({"step_graph": "cuda_graphs"})
    message = str(err.value)
    assert "\n" not in message and "'step_graph'" in message and "none, static, compile" in message


def test_a_method_with_client_terms_is_refused_before_training(tmp_path):
    with pytest.raises(FedreproError) as err:
        batched_trainer(tmp_path, "auto", algorithm="fedprox", fedprox={"mu": 0.1}, step_graph="static")
    message = str(err.value)
    assert "\n" not in message and message.startswith("step_graph: static needs the batched path")
    assert "client terms" in message and "step_graph: none" in message
    assert not list((tmp_path / "run-auto").glob("*.csv"))  # nothing trained


def test_the_setting_renames_a_run_only_when_set():
    base = {"dataset": "fmnist", "model": "cnn", "device": "cpu"}
    default = resolve(base)
    assert default["step_graph"] == "none"
    assert "step_graph" not in identity.identity_setting(default)  # the ids of default runs stay
    assert identity.run_id(default) == identity.run_id(resolve({**base, "step_graph": "none"}))
    ids = {g: identity.run_id(resolve({**base, "step_graph": g})) for g in ("none", "static", "compile")}
    assert len(set(ids.values())) == 3
    # the static step's module hashes into the runs that execute it, and only those; on a CPU it brings the
    # batched path's modules with it
    for graph, device in (("none", "cpu"), ("none", "cuda"), ("static", "cpu"), ("compile", "cuda")):
        code = identity.run_code(resolve({**base, "device": device, "step_graph": graph}))
        assert ("run/static_step.py" in code) == (graph != "none")
        assert ("run/batched.py" in code) == (graph != "none" or device == "cuda")


def test_a_pack_stacks_runs_of_one_step_graph_and_each_equals_itself_alone(tmp_path):
    """Two static-step runs stack into one static computation (runs x clients rows, all of them every step); a
    run of the other step trains its own round. Each ends where it ends trained alone: on CPU a vmapped kernel
    computes a row as among fewer rows (tests/run/test_packed.py), masked rows included."""
    datasets = gpucheck.tiny_fmnist()
    graphs = {1: "static", 2: "static", 3: "none"}
    pack = PackedRuns(
        [packed_trainer("fedavg", s, tmp_path / f"pack-{s}", datasets, step_graph=g) for s, g in graphs.items()]
    )
    outcomes = pack.run(checkpoint_every=0)
    assert all(o["status"] == "finished" for o in outcomes) and pack.stacked_rounds == PACKED_ROUNDS
    assert [type(e).__name__ for e in pack._engines.values()] == ["StaticStepSGD"]
    for seed, m in zip(graphs, pack.members):
        alone, _ = packed_alone("fedavg", seed, tmp_path / f"alone-{seed}", datasets, step_graph=graphs[seed])
        assert torch.equal(m.trainer.model.flat, alone.model.flat), f"seed {seed}: packed != alone"
