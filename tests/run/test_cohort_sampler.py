"""The cohort sampler against its documented recipe and against uniformity.

The recipe (``cohort_draw``, ``streams``): the k clients of round t are
``numpy.random.default_rng(SeedSequence([seed, t])).choice(N, k, replace=False)`` in numpy's draw order;
``sample_cohort`` sorts them. With ``cohort.warmup: permutation`` the first ceil(N/k) rounds are FedAWARE's
exploration of a permutation drawn from ``SeedSequence([seed, 0xC0407])`` (a last partial chunk topped up from
the round's uniform stream), and the rounds after it are the uniform ones. The expected draws below are
computed in the test from that recipe with numpy alone, never through ``fedrepro.streams``.

Statistical tests: fixed seeds, so each is deterministic; the threshold p > 1e-3 is what a correct sampler
passes with probability 0.999 for any choice of seeds (and so under any change of numpy's streams), while the
defects they are written for (a client never sampled, a sorted pairing, cohorts of neighbouring ids) give
p-values below 1e-50 at these sizes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fedrepro.run.cohorts import code_pairing, cohort_draw, sample_cohort

WARMUP_SALT = 0xC0407


def recipe_draw(seed: int, t: int, n: int, k: int) -> np.ndarray:
    return np.random.default_rng(np.random.SeedSequence([seed, t])).choice(n, size=k, replace=False)


def recipe_permutation(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(np.random.SeedSequence([seed, WARMUP_SALT])).permutation(n)


# --------------------------------------------------------------------------- pinned draws


def test_a_few_draws_pinned_by_hand():
    """Integer draws of numpy's PCG64 (pinned in pyproject) do not depend on the machine. These were read off
    the recipe above; a change of seeding, salt or draw call moves them (and every run's cohorts)."""
    assert cohort_draw(1998, 0, 100, 10).tolist() == [69, 10, 80, 43, 91, 24, 20, 27, 13, 49]
    assert cohort_draw(1, 3, 10, 4).tolist() == [3, 1, 0, 7]
    assert sample_cohort(1, 3, 10, 4).tolist() == [0, 1, 3, 7]
    # FedAWARE's exploration: round 0 is the head of the seeded permutation, in its order
    assert cohort_draw(1998, 0, 100, 10, "permutation").tolist() == [17, 64, 53, 9, 87, 28, 56, 32, 83, 57]


@pytest.mark.parametrize("seed", [0, 7, 1998])
@pytest.mark.parametrize("n,k", [(100, 10), (10, 4), (5, 5), (30, 1)])
def test_uniform_rounds_follow_the_recipe(seed, n, k):
    for t in [0, 1, 2, 17, 499]:
        want = recipe_draw(seed, t, n, k)
        assert cohort_draw(seed, t, n, k).tolist() == want.tolist()
        assert code_pairing(seed, t, n, k).tolist() == want.tolist()  # the credited order: the draw's
        assert sample_cohort(seed, t, n, k).tolist() == sorted(want.tolist())


@pytest.mark.parametrize("n,k", [(100, 10), (10, 4), (7, 3)])
def test_warmup_rounds_follow_the_recipe_and_then_the_uniform_ones(n, k):
    seed, explore = 5, math.ceil(n / k)
    perm = recipe_permutation(seed, n)
    assert cohort_draw(seed, 0, n, k, "permutation").tolist() == perm[:k].tolist()
    chunks = [set(sample_cohort(seed, t, n, k, "permutation").tolist()) for t in range(explore)]
    # the exploration's chunks: the permutation's head, then k of the rest each round, disjoint
    assert chunks[0] == set(perm[:k].tolist())
    full = n // k
    assert all(not (chunks[i] & chunks[j]) for i in range(full) for j in range(i + 1, full))
    assert set().union(*chunks) == set(range(n))
    if n % k:  # a last partial chunk is topped up from that round's uniform stream, among the others
        left = sorted(set(range(n)) - set().union(*chunks[:full]))
        others = np.setdiff1d(np.arange(n), left)
        top = np.random.default_rng(np.random.SeedSequence([seed, full])).choice(
            others, size=k - len(left), replace=False
        )
        assert chunks[full] == set(left) | set(top.tolist())
    for t in range(explore, explore + 20):
        want = recipe_draw(seed, t, n, k)
        assert code_pairing(seed, t, n, k, "permutation").tolist() == want.tolist()
        assert sample_cohort(seed, t, n, k, "permutation").tolist() == sorted(want.tolist())


# --------------------------------------------------------------------------- uniformity


def inclusion_p_value(counts: np.ndarray, rounds: int, n: int, k: int) -> float:
    """Chi-square test of the clients' inclusion counts against uniform k-of-N sampling. A round's indicator
    vector has variance q(1-q), q = k/N, and covariance -q(1-q)/(N-1) between clients: its covariance is
    q(1-q) N/(N-1) times the projection off the all-ones vector, so sum_i (O_i - E)^2 / (R q (1-q) N/(N-1))
    is chi-square with N-1 degrees of freedom. Pearson's statistic (scipy's ``chisquare``, built for a
    multinomial) is that times (N-k)/(N-1); it is rescaled here, else the test would be conservative."""
    q = k / n
    pearson = stats.chisquare(counts).statistic  # sum (O - E)^2 / E, E = R q
    statistic = pearson * (n - 1) / (n - k)
    assert math.isclose(statistic, ((counts - rounds * q) ** 2).sum() / (rounds * q * (1 - q) * n / (n - 1)))
    return float(stats.chi2.sf(statistic, n - 1))


def _inclusions(seed, n, k, rounds, warmup="none", start=0):
    counts = np.zeros(n, dtype=np.int64)
    for t in range(start, start + rounds):
        cohort = sample_cohort(seed, t, n, k, warmup)
        assert len(set(cohort.tolist())) == k and cohort.min() >= 0 and cohort.max() < n
        counts[cohort] += 1
    return counts


@pytest.mark.parametrize("n,k,rounds", [(20, 5, 3000), (7, 3, 2000), (100, 10, 2000)])
def test_inclusion_frequencies_are_uniform(n, k, rounds):
    counts = _inclusions(11, n, k, rounds)
    assert counts.sum() == rounds * k
    p = inclusion_p_value(counts, rounds, n, k)
    assert p > 1e-3, f"inclusion counts {counts.tolist()} are not uniform (p = {p:.2g})"


@pytest.mark.parametrize("n,k", [(20, 5), (10, 4)])
def test_inclusion_frequencies_after_fedawares_warmup_are_uniform(n, k):
    rounds, start = 2000, math.ceil(n / k)
    counts = _inclusions(1998, n, k, rounds, "permutation", start)
    p = inclusion_p_value(counts, rounds, n, k)
    assert p > 1e-3, f"after the warm-up, inclusion counts {counts.tolist()} are not uniform (p = {p:.2g})"


def test_pairs_are_drawn_together_uniformly():
    """Uniform k-subsets put every pair together with probability k(k-1)/(N(N-1)): a sampler that draws
    neighbouring ids, or favours some pairs, has uniform single inclusions and fails here. Pearson's statistic
    over the pairs is used as it is (pair counts are not multinomial; the test is conservative, yet a block
    sampler gives p far below 1e-50)."""
    n, k, rounds = 10, 3, 3000
    together = np.zeros((n, n), dtype=np.int64)
    for t in range(rounds):
        c = sample_cohort(3, t, n, k)
        together[np.ix_(c, c)] += 1
    pairs = together[np.triu_indices(n, 1)]
    assert pairs.sum() == rounds * k * (k - 1) // 2
    p = stats.chisquare(pairs).pvalue
    assert p > 1e-3, f"pair counts are not uniform (p = {p:.2g})"


def test_code_assignment_credits_a_uniformly_drawn_order():
    """Under ``cohort.assignment: code`` the j-th upload (ascending ids) is credited to the j-th id of the draw.
    That id must be uniform over the clients for every j (a draw returned sorted would credit small ids to
    the first slot): each slot's client is one multinomial draw a round, so scipy's chi-square applies as is;
    the slots are tested separately (p > 1e-3 / k each)."""
    n, k, rounds = 10, 4, 3000
    for warmup, start in (("none", 0), ("permutation", math.ceil(n / k))):
        slots = np.zeros((k, n), dtype=np.int64)
        for t in range(start, start + rounds):
            pairing = code_pairing(21, t, n, k, warmup)
            assert sorted(pairing.tolist()) == sample_cohort(21, t, n, k, warmup).tolist()
            slots[np.arange(k), pairing] += 1
        for j in range(k):
            p = stats.chisquare(slots[j]).pvalue
            assert p > 1e-3 / k, f"{warmup}: slot {j} credits {slots[j].tolist()} (p = {p:.2g})"
        counts = slots.sum(0)
        assert inclusion_p_value(counts, rounds, n, k) > 1e-3
