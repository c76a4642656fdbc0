"""Who trains in a round: drawn from (seed, round) alone, the same clients for every method of a comparison."""

from __future__ import annotations

import functools
import math

import numpy as np

from fedrepro import streams


def cohort_draw(seed: int, round_: int, num_clients: int, k: int, warmup: str = "none") -> np.ndarray:
    """The k clients of a round in the order they were drawn, from (seed, round) alone: the same for every
    method of a comparison, and on resume. Uniform without replacement (numpy's ``choice`` order, uniformly
    random), or, with ``warmup: permutation``, FedAWARE's exploration in rounds 0 .. ceil(N/k) - 1
    (``exploration_draws``) and uniform afterwards."""
    rng = streams.rng("cohort", seed, round_)
    if warmup == "permutation" and round_ < math.ceil(num_clients / k):
        chunk = exploration_draws(seed, num_clients, k)[round_]
        others = np.setdiff1d(np.arange(num_clients), chunk)
        return np.concatenate([chunk, rng.choice(others, size=k - len(chunk), replace=False)])
    return rng.choice(num_clients, size=k, replace=False)


@functools.lru_cache(maxsize=8)
def exploration_draws(seed: int, num_clients: int, k: int) -> tuple[np.ndarray, ...]:
    """FedAWARE's FeedbackSampler exploration, step for step: a shuffled list of all N clients (our
    permutation, seeded by the run's seed, where the code calls ``random.shuffle``); each round takes the
    list's first k and keeps ``list(set(rest) - set(taken))``. That list comes in CPython's set order, which
    is ascending for ids below the set's table size and wraps around it otherwise (the code's seed-1998 run
    draws [96, 97, 98, 99, 89, ...] in its tenth round), so the order is computed with a Python set, as the
    code computes it. A last partial chunk is topped up by ``cohort_draw`` (the code samples fewer)."""
    remaining = [int(i) for i in streams.rng("warmup", seed).permutation(num_clients)]
    draws = []
    while remaining:
        taken = remaining[:k]
        draws.append(np.asarray(taken, dtype=np.int64))
        remaining = list(set(remaining) - set(taken))
    return tuple(draws)


def sample_cohort(seed: int, round_: int, num_clients: int, k: int, warmup: str = "none") -> np.ndarray:
    """The round's clients in ascending id order, the order in which they train (as FedLab's trainers do)."""
    return np.sort(cohort_draw(seed, round_, num_clients, k, warmup))


def code_pairing(seed: int, round_: int, num_clients: int, k: int, warmup: str = "none") -> np.ndarray:
    """``cohort.assignment: code``: the ids FedAWARE's code credits the round's uploads to, the j-th upload
    (clients train in ascending id order) to the j-th id of the sampler's draw (``sampler.last_sampled``,
    unsorted). Round 0 (the head of a shuffled list), every uniform round (numpy's ``choice`` order) and the
    exploration rounds whose set order wraps are permuted; exploration rounds in ascending order are not."""
    return cohort_draw(seed, round_, num_clients, k, warmup)
