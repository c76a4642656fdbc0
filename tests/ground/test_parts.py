"""Parts declare their state; one save and load serves them all."""

import torch

from fedrepro.parts import Part


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
