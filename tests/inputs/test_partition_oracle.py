"""Partitions against oracles written here from the recipes' descriptions, fed the same random draws, and the
Dirichlet split's label shares against the moments of Dir(alpha).

The oracles are written independently of ``fedrepro.partitions`` (other loops, other cutting arithmetic) from
the published recipes:
- NIID-Bench's label-Dirichlet ("noniid-labeldir", Li et al. 2022; FedLab's ``hetero_dir``): for each class
  in turn, shuffle its samples, draw p ~ Dir_J(alpha); with the balance cap, a client already holding N/J
  samples or more gets p_j = 0 (the rest renormalised); cut the class at floor(n_k * cumsum(p)); redraw the
  whole split until every client holds min_size samples.
- FedAvg's shards (McMahan et al. 2017): sort by label, cut into J * C equal shards, hand them out in a
  random order, C to a client.
- Pachinko allocation (Reddi et al. 2021, App. C; TFF's CIFAR-100): per client theta ~ Dir_C(alpha) over
  coarse labels and phi_c ~ Dir(beta) over each coarse label's fine labels; each sample draws c, then f,
  then an unused sample of f; a fine label that runs out leaves every phi_c, a coarse label with none left
  leaves theta.
Each oracle consumes a numpy Generator in the order the recipe draws: shuffles, then Dirichlet vectors, then
uniforms, so the same seed must give the same client lists.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedrepro.partitions import dirichlet, pachinko, shards
from fedrepro.partitions.base import class_counts


def _labels(n: int, classes: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    weights = np.linspace(1.0, 3.0, classes)  # uneven classes
    return rng.choice(classes, size=n, p=weights / weights.sum())


# --------------------------------------------------------------------------- NIID-Bench Dirichlet


def niid_bench_dirichlet(labels, clients, rng, alpha, min_size, balance):
    total = len(labels)
    while True:
        owner = {}  # sample -> client
        held = [0] * clients
        for k in sorted(set(labels.tolist())):
            members = np.array([i for i, y in enumerate(labels.tolist()) if y == k])
            rng.shuffle(members)
            p = rng.dirichlet([alpha] * clients)
            if balance:
                p = np.array([p[j] if held[j] < total / clients else 0.0 for j in range(clients)])
                p = p / p.sum()
            # the class's j-th piece runs from floor(n_k * P_{j-1}) to floor(n_k * P_j), P the running sum;
            # the last piece ends at n_k
            running, start = 0.0, 0
            for j in range(clients):
                running += p[j]
                end = len(members) if j == clients - 1 else int(running * len(members))
                for i in members[start:end]:
                    owner[int(i)] = j
                held[j] += end - start
                start = end
        if min(held) >= min_size:
            return [sorted(i for i, j in owner.items() if j == c) for c in range(clients)]


DIRICHLET_CASES = [  # (alpha, clients, min_size, balance): the cap binds at small alpha, redraws happen at 0.05
    (0.05, 12, 5, True),
    (0.1, 20, 10, True),
    (0.5, 10, 10, True),
    (0.5, 10, 0, False),
    (1.0, 7, 20, False),
    (10.0, 15, 10, True),
    (100.0, 5, 10, True),
]


@pytest.mark.parametrize("alpha,clients,min_size,balance", DIRICHLET_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_dirichlet_equals_the_niid_bench_recipe_on_the_same_draws(alpha, clients, min_size, balance, seed):
    labels = _labels(1500, 10, seed)
    got = dirichlet.split(labels, clients, np.random.default_rng(seed), alpha, min_size, balance)
    want = niid_bench_dirichlet(labels, clients, np.random.default_rng(seed), alpha, min_size, balance)
    assert [p.tolist() for p in got] == want


def test_the_balance_cap_changes_the_split_where_it_binds():
    """Where the oracle's cap binds (some client above N/J before the last class), dropping it gives other
    lists: the oracle comparison above sees a missing cap, not only a wrong alpha."""
    labels = _labels(1500, 10, 0)
    capped = niid_bench_dirichlet(labels, 20, np.random.default_rng(0), 0.1, 10, True)
    uncapped = niid_bench_dirichlet(labels, 20, np.random.default_rng(0), 0.1, 10, False)
    assert capped != uncapped
    # and with the cap, a client never grows past N/J by more than its last class's piece: no client that was
    # already above N/J gained anything afterwards (checked class by class on the real partition)
    parts = dirichlet.split(labels, 20, np.random.default_rng(0), 0.1, 10, True)
    counts = class_counts(labels, parts, 10)
    before = np.cumsum(counts, axis=1) - counts  # samples each client held before class k
    assert (counts[before >= len(labels) / 20] == 0).all()


def _shares(alpha, clients, seeds, per_class=4000, classes=5):
    """Client shares of each class, one row per (seed, class): n_kj / n_k. Without the cap and the redraw
    (balance off, min_size 0) the recipe's shares are Dir_J(alpha) draws, up to the floor cut (< 1 / n_k)."""
    labels = np.repeat(np.arange(classes), per_class)
    rows = []
    for seed in seeds:
        parts = dirichlet.split(labels, clients, np.random.default_rng(seed), alpha, 0, False)
        counts = class_counts(labels, parts, classes)  # (clients, classes)
        rows.append((counts / per_class).T)
    return np.concatenate(rows)


@pytest.mark.parametrize("alpha", [0.1, 0.5, 1.0, 10.0])
def test_dirichlet_label_shares_have_the_moments_of_dir_alpha(alpha):
    """p ~ Dir_J(alpha): E p_j = 1/J, Var p_j = (1/J)(1 - 1/J) / (J alpha + 1). 1000 share vectors (200 seeds x
    5 classes, each class an independent draw). Each moment is a z-test whose standard error is estimated from
    the same draws; |z| < 4.5 (two-sided p ~ 7e-6 per test, so a correct split fails about once in 10^5 runs
    whatever the machine, the seeds being fixed anyway) while alpha ten times too large or too small moves the
    variance by far more (z in the tens)."""
    clients = 8
    shares = _shares(alpha, clients, range(200))
    m = len(shares)
    assert np.allclose(shares.sum(1), 1.0)
    # every client's mean share is 1/J (the Dirichlet is symmetric: no client is favoured)
    mean, se = shares.mean(0), shares.std(0, ddof=1) / np.sqrt(m)
    assert np.all(np.abs(mean - 1 / clients) < 4.5 * se), (mean, se)
    # the variance: per vector s = sum_j (p_j - 1/J)^2 has E s = J Var p_j; vectors are independent
    var = (1 / clients) * (1 - 1 / clients) / (clients * alpha + 1)
    s = ((shares - 1 / clients) ** 2).sum(1)
    z = (s.mean() - clients * var) / (s.std(ddof=1) / np.sqrt(m))
    assert abs(z) < 4.5, (
        f"alpha {alpha}: mean sum of squared deviations {s.mean():.5f}, Dir(alpha) gives "
        f"{clients * var:.5f} (z = {z:.1f})"
    )


def test_the_moment_test_tells_alpha_from_ten_alpha():
    """The variance test above has the power to see a factor ten: shares drawn at 10 alpha fail it at alpha."""
    clients, alpha = 8, 0.5
    shares = _shares(10 * alpha, clients, range(200))
    var = (1 / clients) * (1 - 1 / clients) / (clients * alpha + 1)
    s = ((shares - 1 / clients) ** 2).sum(1)
    assert abs(s.mean() - clients * var) > 10 * s.std(ddof=1) / np.sqrt(len(s))


# --------------------------------------------------------------------------- FedAvg's shards


def fedavg_shards(labels, clients, rng, per_client):
    count = clients * per_client
    size = len(labels) // count
    by_label = sorted(range(len(labels)), key=lambda i: (labels[i], i))[: count * size]
    shards = [by_label[s * size : (s + 1) * size] for s in range(count)]
    order = rng.permutation(count)
    return [sorted(i for s in order[c * per_client : (c + 1) * per_client] for i in shards[s]) for c in range(clients)]


@pytest.mark.parametrize("clients,per_client", [(20, 2), (10, 3), (7, 5)])
@pytest.mark.parametrize("seed", [0, 3])
def test_shards_equal_fedavgs_recipe_on_the_same_draws(clients, per_client, seed):
    """``distinct: false`` is the plain recipe; ``distinct: true`` repairs it by swaps, so it is checked as a
    reshuffle of the same shards with no client holding two of one majority label."""
    labels = _labels(1003, 10, seed)
    got = shards.split(labels, clients, np.random.default_rng(seed), per_client, distinct=False)
    assert [p.tolist() for p in got] == fedavg_shards(labels, clients, np.random.default_rng(seed), per_client)
    repaired = shards.split(labels, clients, np.random.default_rng(seed), per_client, distinct=True)
    assert sorted(np.concatenate(repaired).tolist()) == sorted(np.concatenate(got).tolist())
    size = len(labels) // (clients * per_client)
    assert all(len(p) == per_client * size for p in repaired)


# --------------------------------------------------------------------------- Pachinko


def tff_pachinko(labels, coarse, clients, rng, alpha, beta, per):
    fines = sorted(set(labels.tolist()))
    parent = {f: int(coarse[labels == f][0]) for f in fines}
    tops = sorted(set(parent.values()))
    under = {c: [f for f in fines if parent[f] == c] for c in tops}
    pool = {}
    for f in fines:
        pool[f] = list(rng.permutation(np.flatnonzero(labels == f)))

    def pick(weights, alive):
        w = np.array([wi if ok else 0.0 for wi, ok in zip(weights, alive)])
        total = w.sum()
        if not total > 0:  # all the mass sits on exhausted labels: the live ones are equally likely
            w, total = np.array([1.0 if ok else 0.0 for ok in alive]), float(sum(alive))
        u, acc = rng.random() * total, 0.0
        for i, wi in enumerate(w):
            acc += wi
            if u < acc:
                return i
        return max(i for i, wi in enumerate(w) if wi > 0)

    out = []
    for _ in range(clients):
        theta = rng.dirichlet([alpha] * len(tops))
        phi = {c: rng.dirichlet([beta] * len(under[c])) for c in tops}
        mine = []
        for _ in range(per):
            ci = pick(theta, [any(pool[f] for f in under[c]) for c in tops])
            c = tops[ci]
            f = under[c][pick(phi[c], [bool(pool[f]) for f in under[c]])]
            mine.append(int(pool[f].pop()))  # the shuffled pool's last: uniform among those left
        out.append(sorted(mine))
    return out


@pytest.mark.parametrize("alpha,beta,clients,per", [(0.1, 10.0, 10, 200), (1.0, 0.1, 8, 150), (0.5, 1.0, 10, 200)])
def test_pachinko_equals_the_tff_recipe_on_the_same_draws(alpha, beta, clients, per):
    """CIFAR-100's coarse map over 100 fine labels of 20 samples each: clients of 150-200 exhaust fine labels and
    whole coarse labels, so the renormalisation paths run."""
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(100), 20))
    coarse = pachinko.CIFAR100_COARSE[labels]
    got = pachinko.split(labels, coarse, clients, np.random.default_rng(7), alpha, beta, per)
    want = tff_pachinko(labels, coarse, clients, np.random.default_rng(7), alpha, beta, per)
    assert [p.tolist() for p in got] == want


# Each kind's `make` hands every key of its setting to its `split` (which the oracles above check): the same
# lists as `split` called with those values by name, and a change of any one key changes the lists, so a key
# dropped, swapped with its neighbour or read as another's cannot pass.
WIRING = [
    (
        "dirichlet",
        {"alpha": 0.1, "min_size": 2, "balance": True},
        {"alpha": 0.5, "min_size": 25, "balance": False},
        lambda labels, rng, s: dirichlet.split(
            labels, s["num_clients"], rng, alpha=s["alpha"], min_size=s["min_size"], balance=s["balance"]
        ),
    ),
    (
        "hybrid",
        {"alpha_balanced": 100.0, "alpha": 0.1, "min_size": 2, "balance": True},
        {"alpha_balanced": 0.5, "alpha": 1.0, "min_size": 25, "balance": False},
        lambda labels, rng, s: __import__("fedrepro.partitions.hybrid", fromlist=["split"]).split(
            labels,
            s["num_clients"],
            rng,
            alpha_balanced=s["alpha_balanced"],
            alpha=s["alpha"],
            min_size=s["min_size"],
            balance=s["balance"],
        ),  # fmt: skip
    ),
    (
        "shards",
        {"classes_per_client": 2, "distinct": True},
        {"classes_per_client": 3, "distinct": False},
        lambda labels, rng, s: shards.split(
            labels, s["num_clients"], rng, classes_per_client=s["classes_per_client"], distinct=s["distinct"]
        ),
    ),
]


@pytest.mark.parametrize("kind, setting, changed, by_name", WIRING, ids=[w[0] for w in WIRING])
def test_make_hands_every_key_to_its_split(kind, setting, changed, by_name):
    from fedrepro import partitions

    labels = _labels(600, 10, seed=5)
    full = {"kind": kind, "num_clients": 10, "seed": 1, **setting}
    made = partitions.make(labels, full)
    expected = by_name(labels, np.random.default_rng(1), full)
    assert len(made) == len(expected) and all(np.array_equal(a, b) for a, b in zip(made, expected))
    for key, value in changed.items():
        other = partitions.make(labels, {**full, key: value})
        assert not all(np.array_equal(a, b) for a, b in zip(made, other)), f"{kind}: {key} changes nothing"


def test_pachinko_make_hands_alpha_beta_and_the_client_size_to_its_split():
    from fedrepro import partitions

    labels = np.random.default_rng(4).permutation(np.repeat(np.arange(100), 30))
    full = {"kind": "pachinko", "num_clients": 10, "seed": 2, "alpha": 0.1, "beta": 10.0, "samples_per_client": 200}
    made = partitions.make(labels, full)
    expected = pachinko.split(labels, pachinko.CIFAR100_COARSE[labels], 10, np.random.default_rng(2), alpha=0.1,
                              beta=10.0, samples_per_client=200)  # fmt: skip
    assert all(np.array_equal(a, b) for a, b in zip(made, expected)) and {len(p) for p in made} == {200}
    for key, value in {"alpha": 10.0, "beta": 0.1, "samples_per_client": 150}.items():
        other = partitions.make(labels, {**full, key: value})
        assert not all(np.array_equal(a, b) for a, b in zip(made, other)), f"pachinko: {key} changes nothing"


def test_the_legacy_dirichlet_hands_min_size_and_balance_to_the_recipe():
    from fedrepro import partitions

    labels = _labels(600, 10, seed=5)
    full = {"kind": "dirichlet_legacy", "num_clients": 10, "seed": 1, "alpha": 0.1, "min_size": 2, "balance": True}
    made = partitions.make(labels, full)
    expected = dirichlet.split(labels, 10, np.random.RandomState(1), alpha=0.1, min_size=2, balance=True)
    assert all(np.array_equal(a, b) for a, b in zip(made, expected))
    for key, value in {"min_size": 25, "balance": False}.items():
        other = partitions.make(labels, {**full, key: value})
        assert not all(np.array_equal(a, b) for a, b in zip(made, other)), f"dirichlet_legacy: {key} changes nothing"
