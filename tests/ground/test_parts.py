"""Parts declare their state; one save and load serves them all."""

import pytest
import torch

from fedrepro.parts import (
    Aggregator,
    Algorithm,
    ClientObjective,
    ClientPlan,
    GradientCorrection,
    Part,
    PostStep,
    RoundUpdates,
    ServerOptimizer,
)


class Inner(Part):
    state = ("seen",)

    def __init__(self):
        self.seen = torch.zeros(3)


class Outer(Part):
    state = ("velocity", "window", "opt")
    subparts = ("inner",)

    def __init__(self):
        self.velocity = None  # created on first use
        self.window: list = []
        self.opt: dict = {}
        self.inner = Inner()


def test_round_trip_restores_every_declared_attribute_as_a_copy():
    a = Outer()
    a.velocity, a.window, a.opt = torch.randn(4), [torch.randn(2), torch.randn(2)], {"m": torch.randn(2)}
    a.inner.seen += torch.tensor([1.0, 0.0, 1.0])
    saved = a.state_dict()
    assert set(saved) == {"velocity", "window", "opt", "inner"}
    b = Outer()
    held = b.inner.seen  # another part may hold this tensor: it is filled in place
    b.load_state_dict(saved)
    assert torch.equal(b.velocity, a.velocity) and b.velocity is not a.velocity
    assert all(torch.equal(x, y) for x, y in zip(b.window, a.window)) and len(b.window) == 2
    assert torch.equal(b.opt["m"], a.opt["m"]) and b.opt["m"] is not a.opt["m"]
    assert b.inner.seen is held and torch.equal(held, torch.tensor([1.0, 0.0, 1.0]))


def test_unset_state_is_not_saved_and_a_missing_key_keeps_the_initial_value():
    fresh = Outer()
    assert "velocity" not in fresh.state_dict()
    fresh.load_state_dict({})
    assert fresh.velocity is None and fresh.window == [] and torch.equal(fresh.inner.seen, torch.zeros(3))


class History(Part):
    state = ("models",)

    def __init__(self, models=None):
        self.models = models  # None until the first round, as a window of models starts


def test_a_list_state_unset_before_loading_comes_back_as_copies_and_a_tuple_stays_a_tuple():
    saved = [torch.randn(2), torch.randn(2)]
    fresh = History()
    fresh.load_state_dict({"models": saved})
    assert isinstance(fresh.models, list) and len(fresh.models) == 2
    assert all(torch.equal(a, b) and a is not b for a, b in zip(fresh.models, saved))
    held = History((torch.zeros(2), torch.zeros(2)))
    held.load_state_dict({"models": saved})
    assert isinstance(held.models, tuple) and all(torch.equal(a, b) for a, b in zip(held.models, saved))


class Recorder:
    """What each part of a server step was given, in order."""

    def __init__(self):
        self.calls = []


class Agg(Aggregator):
    state = ("count",)

    def __init__(self, log):
        self.log, self.count = log, torch.zeros(1)

    def __call__(self, x, updates):
        self.log.calls.append(("aggregator", x.clone(), updates))
        return x + updates.weighted_mean()  # depends on x, so a wrong x changes d


class Opt(ServerOptimizer):
    state = ("velocity",)

    def __init__(self, log):
        self.log, self.velocity = log, torch.ones(1)

    def __call__(self, x, d, updates):
        self.log.calls.append(("optimizer", d.clone(), updates))
        return x - 0.5 * d


class Post(PostStep):
    state = ("seen",)

    def __init__(self, log, shift, name=""):
        self.log, self.shift, self.name, self.seen = log, shift, name, torch.zeros(1)

    def __call__(self, x, updates):
        self.log.calls.append(("post_step", x.clone(), updates))
        return x + self.shift


class Correction(GradientCorrection):
    state = ("c",)

    def __init__(self, log, name=""):
        self.log, self.name, self.c = log, name, torch.zeros(1)

    def end_round(self, updates):
        self.log.calls.append(("correction", None, updates))


class Objective(ClientObjective):
    state = ("h",)

    def __init__(self, log):
        self.log, self.h = log, torch.zeros(1)

    def end_round(self, updates):
        self.log.calls.append(("objective", None, updates))


def _updates():
    return RoundUpdates(
        round=0,
        clients=torch.tensor([0, 1]),
        deltas=torch.tensor([[1.0, 2.0], [3.0, -2.0]]),
        sizes=torch.tensor([1.0, 3.0]),
        steps=torch.tensor([1.0, 3.0]),
        losses=torch.tensor([0.1, 0.2]),
        lr=0.1,
    )


def _method(log, post_names=("", ""), correction_names=("", "prox")):
    return Algorithm(
        "m",
        Agg(log),
        Opt(log),
        corrections=[Correction(log, n) for n in correction_names],
        post_steps=[Post(log, torch.tensor([1.0, 1.0]) * (i + 1), n) for i, n in enumerate(post_names)],
        objective=Objective(log),
    )


def test_the_server_step_hands_each_part_what_the_chain_says():
    log, updates = Recorder(), _updates()
    x = torch.tensor([1.0, -1.0])
    out = _method(log).server_step(x, updates)
    d = x + torch.tensor([0.25, 0.75]) @ updates.deltas  # the aggregator's direction, by hand
    x_opt = x - 0.5 * d
    assert torch.equal(out, x_opt + 1.0 + 2.0)  # both post-steps, in order, each on the last one's output
    kinds = [c[0] for c in log.calls]
    assert kinds == ["aggregator", "optimizer", "post_step", "post_step", "correction", "correction", "objective"]
    assert torch.equal(log.calls[0][1], x) and torch.equal(log.calls[1][1], d)
    assert torch.equal(log.calls[2][1], x_opt) and torch.equal(log.calls[3][1], x_opt + 1.0)
    assert all(c[2] is updates for c in log.calls)  # every part sees the round's updates
    assert updates.info["pseudo_grad_norm"] == pytest.approx(float(d.norm()), rel=1e-6)


def test_every_part_is_checkpointed_under_its_name_and_two_parts_of_one_name_are_refused():
    log = Recorder()
    method = _method(log, post_names=("", "window"))
    assert set(method.state_dict()) == {
        "aggregator",
        "optimizer",
        "objective",
        "correction0",  # unnamed: by its position in its list
        "prox",
        "post_step0",
        "window",
    }
    with pytest.raises(ValueError, match="method 'm': two parts are named 'prox'"):
        _method(log, correction_names=("prox", "prox")).state_dict()


def test_a_checkpoint_without_a_parts_entry_leaves_that_part_at_its_initial_state():
    log = Recorder()
    method = _method(log)
    method.optimizer.velocity = torch.full((1,), 7.0)
    method.load_state_dict({"aggregator": {"count": torch.full((1,), 3.0)}})
    assert torch.equal(method.aggregator.count, torch.full((1,), 3.0))
    assert torch.equal(method.optimizer.velocity, torch.full((1,), 7.0))


def test_a_declared_lr_schedule_is_the_one_a_run_uses():
    declared = lambda t: 0.5**t  # noqa: E731
    assert ClientPlan(lr_schedule=declared).lr_of({}) is declared
