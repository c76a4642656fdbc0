"""Plug-in +random_batch: heterogeneous local batch sizes (FedAWARE's code, `-agnostic 1`).

Each sampled client draws its batch size every round, uniformly from {low, ..., n_i - 1} where n_i is the
number of samples it trains on; a client with n_i <= low trains on all of them in one batch (the code's
`settings.get_heterogeneity`). The draw comes from a generator seeded by (seed, round, client): every
method sees the same draws and a resumed run redraws them exactly. With +random_epochs it is the code's
"agnostic" clients.
"""

from __future__ import annotations

from fedrepro import streams


class RandomBatch:
    def __init__(self, seed: int, low: int):
        self.seed, self.low = seed, low

    def __call__(self, round_: int, client: int, size: int) -> int:
        if size <= self.low:
            return size
        return int(streams.rng("batch_size", self.seed, round_, client).integers(self.low, size))


def apply(algorithm, setting, ctx) -> None:
    algorithm.client_plan.batch_size = RandomBatch(setting["seed"], setting["random_batch"]["low"])
