"""The named random streams draw what the run's streams always drew (run numbers are kept), and apart."""

import numpy as np
import torch

from fedrepro import streams


def test_each_stream_is_the_seed_sequence_it_always_was():
    # the draws before the streams had one owner, spelled out: a run's numbers must not move
    old_batches = np.random.SeedSequence([7, 3, 5, 0xC11E]).generate_state(1, dtype=np.uint64)[0]
    assert torch.equal(
        torch.randperm(50, generator=streams.generator("batches", 7, 3, 5)),
        torch.randperm(50, generator=torch.Generator().manual_seed(int(old_batches) & ((1 << 63) - 1))),
    )
    assert np.array_equal(streams.rng("cohort", 7, 3).permutation(20), np.random.default_rng([7, 3]).permutation(20))
    assert np.array_equal(streams.rng("proxy", 7).permutation(20), np.random.default_rng([7, 0xFED1A]).permutation(20))
    assert np.array_equal(
        streams.rng("holdout", 7, 5).permutation(20),
        np.random.default_rng(np.random.SeedSequence([7, 5, 0x401D])).permutation(20),
    )


def test_streams_of_different_purposes_or_places_differ():
    draws = {
        (name, keys): tuple(streams.rng(name, 1, *keys).integers(0, 2**31, 4))
        for name in streams.SALTS
        for keys in [(0,), (1,), (0, 1)]
    }
    assert len(set(draws.values())) == len(draws)
