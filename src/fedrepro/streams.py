"""Every random stream of a run, named in one place.

A stream draws from numpy's SeedSequence over (seed, keys..., salt): it depends only on the run's seed,
on where it is used (round, client) and on what it is for (its salt). So every method of a comparison
draws the same cohorts, batches and proxy samples; a resumed run draws what the uninterrupted one drew;
and no stream moves when another draws more. The salts are those the streams always had, so runs keep
their numbers.
"""

from __future__ import annotations

import numpy as np
import torch

SALTS = {
    "cohort": None,  # the clients of a round: (seed, round)
    "warmup": 0xC0407,  # FedAWARE's exploration permutation of all clients: (seed)
    "batches": 0xC11E,  # a client's shuffling in a round: (seed, round, client)
    "holdout": 0x401D,  # a client's trained / held-out split (client.holdout): (seed, client)
    "validation": 0x7A11D,  # a client's validation samples (evaluation.validation): (seed, client)
    "proxy": 0xFED1A,  # the proxy hold-out of the test set (seed) and the server's proxy batches (seed, round)
    "epochs": 0xE90C,  # +random_epochs' local epochs: (seed, round, client)
    "batch_size": 0xBA7C5,  # +random_batch's local batch size: (seed, round, client)
    "swag": 0xFEDBE,  # FedBE's SWAG-Gaussian sample: (seed, round)
}


def sequence(name: str, seed: int, *keys: int) -> np.random.SeedSequence:
    salt = SALTS[name]
    return np.random.SeedSequence([seed, *keys] + ([] if salt is None else [salt]))


def rng(name: str, seed: int, *keys: int) -> np.random.Generator:
    """The stream as a numpy generator."""
    return np.random.default_rng(sequence(name, seed, *keys))


def generator(name: str, seed: int, *keys: int) -> torch.Generator:
    """The stream as a (CPU) torch generator."""
    state = sequence(name, seed, *keys).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & ((1 << 63) - 1))
