"""Plug-in +random_epochs: heterogeneous, time-varying local work (FedNova's E_i(t) ~ U(low, high)).

Each sampled client draws its epoch count every round, uniformly from {low, ..., high} (both ends
included, as the paper's "U(2,5)" and its 16 <= tau_i <= 1020 range read), from a generator seeded
by (seed, round, client): every method sees the same draws and a resumed run redraws them exactly.
"""

from __future__ import annotations

from fedrepro import streams


class RandomEpochs:
    def __init__(self, seed: int, low: int, high: int):
        self.seed, self.low, self.high = seed, low, high

    def __call__(self, round_: int, client: int) -> int:
        rng = streams.rng("epochs", self.seed, round_, client)
        return int(rng.integers(self.low, self.high + 1))


def apply(algorithm, setting, ctx) -> None:
    c = setting["random_epochs"]
    algorithm.client_plan.local_epochs = RandomEpochs(setting["seed"], c["low"], c["high"])
