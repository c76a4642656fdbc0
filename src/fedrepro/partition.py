"""Splitting a training set over clients: IID, Dirichlet over labels, FedLAW's hybrid Dirichlet
(balanced and imbalanced client groups), label-sorted shards, CIFAR-100's Pachinko allocation
over coarse and fine labels, FedLab's balanced "inner" Dirichlet (a class prior per client), and client
index lists read from a file another program wrote, NIID-Bench's quantity-based label skew (#C classes a
client); IID and Dirichlet optionally over a long-tailed subset (FedLAW Table 7). A multi-domain dataset
(IMA's Digit-Five, PACS) is split domain by domain, each over its own share of the clients (``per_domain``).

Every partitioner takes the labels and a local ``numpy.random.Generator`` (never the global
RNG) and returns one sorted index array per client.
"""
from __future__ import annotations

import hashlib
import json
import textwrap
import time
from pathlib import Path

import numpy as np

from fedrepro.catalog import DATASETS
from fedrepro.errors import FedreproError


class PartitionError(FedreproError, RuntimeError):
    """A partition that cannot be made or read; the message names the setting or the file."""


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), num_clients)]


# Redrawing a Dirichlet partition until every client has min_size samples: a min_size that is
# reachable in principle but not in practice (alpha = 0.001 gives each class to one client) would
# redraw for minutes. The draws are seeded, so this cap decides only whether the partition is found
# in time, never which one it is.
DIRICHLET_SECONDS = 10.0


def dirichlet(labels: np.ndarray, num_clients: int, rng: np.random.Generator, alpha: float,
              min_size: int = 10, balance: bool = True, max_tries: int = 10000,
              max_seconds: float | None = None) -> list[np.ndarray]:
    """The NIID-Bench / FedLab ``hetero_dir`` recipe: per-class proportions over clients.

    For each class, p ~ Dir_J(alpha); with ``balance`` a client already above N/J gets no more;
    the class is cut at floor(cumsum(p) * n_k). Redraw until every client has ``min_size``, at most
    ``max_tries`` times and ``max_seconds`` long.
    """
    n, classes = len(labels), np.unique(labels)
    by_class = [np.flatnonzero(labels == k) for k in classes]
    max_seconds = DIRICHLET_SECONDS if max_seconds is None else max_seconds
    start, best, tries = time.monotonic(), 0, 0
    while tries < max_tries and (tries == 0 or time.monotonic() - start < max_seconds):
        tries += 1
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for idx_k in by_class:
            idx_k = rng.permutation(idx_k)
            p = rng.dirichlet(np.full(num_clients, alpha))
            if balance:
                p = p * np.array([len(c) < n / num_clients for c in parts])
                p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx_k)).astype(int)[:-1]
            for client, piece in zip(parts, np.split(idx_k, cuts)):
                client.extend(piece.tolist())
        smallest = min(len(c) for c in parts)
        if smallest >= min_size:
            return [np.sort(np.asarray(c, dtype=np.int64)) for c in parts]
        best = max(best, smallest)
    raise PartitionError(f"partition.min_size = {min_size}: no Dirichlet(alpha = {alpha}) draw over {num_clients} "
                         f"clients gave every client that many samples ({tries} draws in "
                         f"{time.monotonic() - start:.0f} s; the best draw's smallest client had {best}); "
                         f"lower partition.min_size or raise partition.alpha")


def inner_dirichlet(labels: np.ndarray, num_clients: int, rng: np.random.Generator, alpha: float) -> list[np.ndarray]:
    """FedLab's balanced "inner" Dirichlet (``client_inner_dirichlet_partition``, the default of its
    CIFAR10/100Partitioner with partition="dirichlet"; IMA's CIFAR-100 notebook): every client gets
    floor(N / J) samples and its own class prior q_j ~ Dir_C(alpha). Sample by sample, a random client that
    still has room takes one sample of a class drawn from q_j; a class that has run out is skipped by drawing
    from q_j renormalised over the classes left (FedLab's loop redraws until it hits one, which can hang)."""
    classes = np.unique(labels)
    pools = [rng.permutation(np.flatnonzero(labels == k)).tolist() for k in classes]
    left = np.array([len(p) for p in pools]) > 0
    priors = rng.dirichlet(np.full(len(classes), alpha), size=num_clients)
    size = len(labels) // num_clients
    taken: list[list[int]] = [[] for _ in range(num_clients)]
    open_clients = list(range(num_clients)) if size else []
    while open_clients:
        slot = int(rng.integers(len(open_clients)))
        j = open_clients[slot]
        c = _draw(priors[j], left, rng)
        taken[j].append(pools[c].pop())
        left[c] = bool(pools[c])
        if len(taken[j]) == size:
            open_clients[slot] = open_clients[-1]
            open_clients.pop()
    return [np.sort(np.asarray(t, dtype=np.int64)) for t in taken]


def hybrid(labels: np.ndarray, num_clients: int, rng: np.random.Generator, alpha_balanced: float, alpha: float,
           min_size: int = 10, balance: bool = True) -> list[np.ndarray]:
    """FedLAW's hybrid Dirichlet (App. D, Fig. 5): draw a ``num_clients`` partition with Dir(alpha_balanced)
    and keep its first half of the clients (the "balanced" group); split the samples left over among the
    other half with Dir(alpha) (the "imbalanced" group). ``groups`` names the two halves."""
    if num_clients < 2:
        raise PartitionError(f"partition.kind = hybrid needs num_clients >= 2, got {num_clients}")
    half = num_clients // 2
    first = dirichlet(labels, num_clients, rng, alpha_balanced, min_size, balance)[:half]
    rest = np.setdiff1d(np.arange(len(labels)), np.concatenate(first))
    second = dirichlet(labels[rest], num_clients - half, rng, alpha, min_size, balance)
    return first + [np.sort(rest[part]) for part in second]


def groups(setting: dict) -> dict[str, np.ndarray]:
    """Named client groups a partition defines (the engine logs each group's coherence): hybrid's two halves,
    a multi-domain dataset's domains; {} for the rest."""
    domains = DATASETS.get(setting.get("dataset"), {}).get("domains")
    if domains:
        per = setting["num_clients"] // len(domains)
        return {f"domain_{name}": np.arange(d * per, (d + 1) * per) for d, name in enumerate(domains)}
    if setting["kind"] != "hybrid":
        return {}
    half = setting["num_clients"] // 2
    return {"balanced": np.arange(half), "imbalanced": np.arange(half, setting["num_clients"])}


def label_quantity(labels: np.ndarray, num_clients: int, rng: np.random.Generator,
                   classes_per_client: int) -> list[np.ndarray]:
    """NIID-Bench's quantity-based label skew ("noniid-#label", FedLab's label_skew_quantity_based_partition;
    IMA's Digit-Five #C=2): client j holds class j mod C and classes_per_client - 1 other classes drawn
    uniformly without repeats; each class's samples, shuffled, are cut into near-equal pieces, one for each
    client holding it. A class no client holds is left out (only when num_clients < C)."""
    classes = int(labels.max()) + 1
    if classes_per_client > classes:
        raise PartitionError(f"partition.classes_per_client = {classes_per_client} exceeds the {classes} classes; "
                             f"choose at most {classes}")
    held = []
    for j in range(num_clients):
        others = rng.permutation(np.delete(np.arange(classes), j % classes))[:classes_per_client - 1]
        held.append({j % classes, *others.tolist()})
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k in range(classes):
        holders = [j for j in range(num_clients) if k in held[j]]
        if holders:
            pieces = np.array_split(rng.permutation(np.flatnonzero(labels == k)), len(holders))
            for j, piece in zip(holders, pieces):
                parts[j].append(piece)
    return [np.sort(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, dtype=np.int64) for p in parts]


def per_domain(labels: np.ndarray, setting: dict, domains: np.ndarray) -> list[np.ndarray]:
    """IMA's feature-skew split: each domain's samples over its own num_clients / D clients, drawn with the
    setting's kind and seed (the same seed in every domain, as IMA's code seeds each domain's partitioner);
    clients are numbered domain by domain (IMA's code assigns domains to client ids at random, which changes
    nothing when cohorts are drawn uniformly). Indices are the whole training set's."""
    names = np.unique(domains)
    per, rest = divmod(setting["num_clients"], len(names))
    if rest or not per:
        raise PartitionError(f"num_clients = {setting['num_clients']} must be a positive multiple of the "
                             f"{len(names)} domains of {setting.get('dataset')}")
    inner = {**setting, "num_clients": per}
    parts = []
    for d in names:
        at = np.flatnonzero(domains == d)
        parts += [at[p] for p in make(labels[at], inner)]
    return parts


def shards(labels: np.ndarray, num_clients: int, rng: np.random.Generator, classes_per_client: int,
           distinct: bool = True) -> list[np.ndarray]:
    """FedAvg's pathological split: sort by label (stably), cut into num_clients*C equal shards,
    give each client C random shards; the remainder is dropped, as FedLab does.

    With ``distinct`` each client's shards carry different majority labels, so a client holds
    exactly C classes when shards align with classes ("#C = 2" as IMA's text describes it);
    FedLab's random assignment can hand a client two shards of one class (``distinct: false``).
    """
    total = num_clients * classes_per_client
    size = len(labels) // total
    order = np.argsort(labels, kind="stable")[: total * size].reshape(total, size)
    shard_label = np.array([np.bincount(labels[s]).argmax() for s in order])
    assign = rng.permutation(total).reshape(num_clients, classes_per_client)
    if distinct:
        assign = _make_distinct(assign, shard_label, rng)
    return [np.sort(order[row].reshape(-1)) for row in assign]


def _make_distinct(assign: np.ndarray, shard_label: np.ndarray, rng: np.random.Generator,
                   max_sweeps: int = 1000) -> np.ndarray:
    """Repair a random assignment by swaps until no client holds two shards of one label."""
    assign = assign.copy()
    n_clients, per = assign.shape
    classes = len(np.unique(shard_label))
    if per > classes:
        raise PartitionError(f"partition.classes_per_client = {per} exceeds the {classes} classes; choose at most {classes}")
    for _ in range(max_sweeps):
        bad = list(_repeated_labels(assign, shard_label))
        if not bad:
            return assign
        for c, j in bad:
            for d in rng.permutation(n_clients):
                if d == c:
                    continue
                for k in rng.permutation(per):
                    mine, theirs = shard_label[assign[c, j]], shard_label[assign[d, k]]
                    keep_c = np.delete(shard_label[assign[c]], j)
                    keep_d = np.delete(shard_label[assign[d]], k)
                    if theirs not in keep_c and mine not in keep_d:
                        assign[c, j], assign[d, k] = assign[d, k], assign[c, j]
                        break
                else:
                    continue
                break
    raise PartitionError("could not give every client shards of distinct classes; set partition.distinct: false")


def _repeated_labels(assign: np.ndarray, shard_label: np.ndarray):
    """(client, slot) pairs whose shard repeats a label the client already holds."""
    for client, row in enumerate(shard_label[assign]):
        seen = set()
        for slot, label in enumerate(row):
            if label in seen:
                yield client, slot
            seen.add(label)


# CIFAR-100's superclass of each fine label (fine labels in torchvision's order, i.e. the archive's
# alphabetical ``fine_label_names``; superclasses in the order of its ``coarse_label_names``). It is
# the fine->coarse map that the archive's per-sample ``coarse_labels`` encode, and agrees with the
# superclass table of https://www.cs.toronto.edu/~kriz/cifar.html (tests/test_pachinko.py checks it
# name by name). torchvision's CIFAR100 loader keeps the fine labels only, so the map lives here.
CIFAR100_COARSE = np.array([
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
    6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
    5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13], dtype=np.int64)


def pachinko(labels: np.ndarray, coarse: np.ndarray, num_clients: int, rng: np.random.Generator,
             alpha: float, beta: float, samples_per_client: int | None = None) -> list[np.ndarray]:
    """Pachinko allocation (Reddi et al. 2021, App. C; TFF's federated CIFAR-100), as IMA's "+PA".

    Client by client: theta ~ Dir_C(alpha) over the C coarse labels and, for every coarse label c,
    phi_c ~ Dir(beta) over its fine labels. Each of the client's samples draws c ~ theta, then a fine
    label f ~ phi_c, then an unused sample of label f uniformly at random (without replacement).
    When f runs out it is dropped from every client's phi_c and phi_c is renormalised (TFF); when all
    fine labels of c have run out, c is dropped from theta and theta renormalised (nothing is left to
    draw under it). Clients are filled in order, so the last ones see the most exhausted labels, as in
    TFF's generation. ``samples_per_client`` defaults to len(labels) // num_clients (IMA: K = 100
    clients on 50,000 images, so 500 each; TFF: 500 clients of 100).
    """
    labels, coarse = np.asarray(labels), np.asarray(coarse)
    n = len(labels)
    per = n // num_clients if samples_per_client is None else samples_per_client
    if per < 1 or per * num_clients > n:
        raise PartitionError(f"pachinko: {num_clients} clients x {per} samples need {num_clients * per} samples, "
                             f"the dataset has {n}")
    fine_ids = np.unique(labels)
    parent = {}
    for f in fine_ids:
        cs = np.unique(coarse[labels == f])
        if len(cs) != 1:
            raise PartitionError(f"pachinko: fine label {f} falls under coarse labels {cs.tolist()}; "
                                 "each fine label needs exactly one coarse label")
        parent[int(f)] = int(cs[0])
    coarse_ids = sorted(set(parent.values()))
    children = [np.array([f for f in fine_ids if parent[int(f)] == c]) for c in coarse_ids]
    # One shuffled pool per fine label; popping from its end draws uniformly without replacement.
    pools = {int(f): rng.permutation(np.flatnonzero(labels == f)).tolist() for f in fine_ids}
    fine_alive = [np.ones(len(ch), dtype=bool) for ch in children]
    coarse_alive = np.ones(len(coarse_ids), dtype=bool)
    parts = []
    for _ in range(num_clients):
        theta = rng.dirichlet(np.full(len(coarse_ids), alpha))
        phi = [rng.dirichlet(np.full(len(ch), beta)) for ch in children]
        taken = []
        for _ in range(per):
            c = _draw(theta, coarse_alive, rng)
            j = _draw(phi[c], fine_alive[c], rng)
            pool = pools[int(children[c][j])]
            taken.append(pool.pop())
            if not pool:
                fine_alive[c][j] = False
                coarse_alive[c] = fine_alive[c].any()
        parts.append(np.sort(np.asarray(taken, dtype=np.int64)))
    return parts


def _draw(p: np.ndarray, alive: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from p restricted to ``alive`` and renormalised. Dir(0.1) can put all of a client's
    mass (to float precision) on labels that have run out; then the remaining labels are equally likely."""
    w = np.where(alive, p, 0.0)
    total = w.sum()
    if not total > 0:
        w, total = alive.astype(float), float(alive.sum())
    i = int(np.searchsorted(np.cumsum(w), rng.random() * total, side="right"))
    # side="right" never lands on a zero weight; only rounding can push past the end.
    return i if i < len(w) else int(np.flatnonzero(w > 0)[-1])


def natural(groups: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """The dataset's own clients (Synthetic's users): client i holds the samples of group i."""
    found = int(groups.max()) + 1 if len(groups) else 0
    if found != num_clients:
        raise PartitionError(f"the dataset has {found} natural clients, the setting asks for {num_clients}")
    return [np.flatnonzero(groups == i) for i in range(num_clients)]


def read_file(path: str | Path, num_clients: int, train_size: int, sha256: str | None = None) -> list[np.ndarray]:
    """Kind ``file``: the client index lists of an .npz (int arrays ``client_0`` .. ``client_{n-1}``) or a JSON
    (``{"clients": [[...], ...]}``), checked: num_clients lists, none empty, every index an integer in
    [0, train_size), none twice; each list is kept in the file's order. With ``sha256`` the file must have
    that content hash. One-line errors name the file and the first bad client."""
    path = Path(path)
    if not path.is_file():
        raise PartitionError(f"partition file {path}: no such file")
    raw = path.read_bytes()
    if sha256 is not None and hashlib.sha256(raw).hexdigest() != sha256:
        raise PartitionError(f"partition file {path}: its content changed (SHA-256 {hashlib.sha256(raw).hexdigest()}, "
                             f"the setting pins {sha256})")
    try:
        if path.suffix == ".npz":
            import io
            with np.load(io.BytesIO(raw), allow_pickle=False) as data:
                keys = set(data.files)
                lists = [data[f"client_{i}"] if f"client_{i}" in keys else None for i in range(len(keys))]
                extra = sorted(k for k in keys if k not in {f"client_{i}" for i in range(len(keys))})
        elif path.suffix == ".json":
            doc = json.loads(raw)
            if not isinstance(doc, dict) or not isinstance(doc.get("clients"), list):
                raise PartitionError(f'partition file {path}: a JSON partition is an object {{"clients": [[...], ...]}}')
            lists, extra = [np.asarray(c) if isinstance(c, list) else None for c in doc["clients"]], []
        else:
            raise PartitionError(f"partition file {path}: must end in .npz or .json, not '{path.suffix}'")
    except PartitionError:
        raise
    except Exception as err:  # noqa: BLE001 - BadZipFile, JSONDecodeError, ValueError (pickled arrays)
        raise PartitionError(f"partition file {path}: cannot be read ({type(err).__name__}: {err})") from None
    if extra:
        raise PartitionError(f"partition file {path}: keys must be client_0 .. client_{len(lists) - 1}; found {extra[0]}")
    if len(lists) != num_clients:
        raise PartitionError(f"partition file {path}: holds {len(lists)} clients, the setting asks for num_clients = "
                             f"{num_clients}")
    seen = np.zeros(train_size, dtype=bool)
    parts = []
    for i, part in enumerate(lists):
        bad = None
        if part is None or part.ndim != 1:
            bad = "is not a list of indices"
        elif not len(part):
            bad = "is empty"
        elif part.dtype.kind not in "iu":
            bad = f"holds non-integer indices ({part.dtype})"
        elif part.min() < 0 or part.max() >= train_size:
            off = part[(part < 0) | (part >= train_size)][0]
            bad = f"holds index {off}, outside the training set's 0..{train_size - 1}"
        elif len(np.unique(part)) != len(part) or seen[part].any():
            ordered = np.sort(part)
            twice = part[seen[part]] if seen[part].any() else ordered[np.flatnonzero(np.diff(ordered) == 0)]
            bad = f"holds index {twice[0]} a second time"
        if bad:
            raise PartitionError(f"partition file {path}: client {i} {bad}")
        seen[part] = True
        parts.append(part.astype(np.int64))  # in the file's order: the order the other program kept them in
    return parts


def make(labels: np.ndarray, setting: dict, groups: np.ndarray | None = None,
         domains: np.ndarray | None = None) -> list[np.ndarray]:
    """Partition from a resolved partition setting (see ``config.partition_setting``);
    ``groups`` (each sample's natural client) is needed by kind ``natural`` only; with ``domains`` (each
    sample's domain: a multi-domain dataset) every domain is split on its own (``per_domain``)."""
    if domains is not None and setting["kind"] != "file":  # a file lists the whole training set's indices
        return per_domain(labels, setting, domains)
    kind, n = setting["kind"], setting["num_clients"]
    if kind == "natural":
        if groups is None:
            raise PartitionError("partition kind 'natural' needs the dataset's client of each sample")
        return natural(groups, n)
    if kind == "file":
        return read_file(setting["path"], n, len(labels), setting.get("sha256"))
    rng = np.random.default_rng(setting["seed"])
    if setting.get("long_tail_rho", 1) != 1:
        return long_tailed(labels, setting, rng)
    if kind == "iid":
        return iid(labels, n, rng)
    if kind == "dirichlet":
        return dirichlet(labels, n, rng, setting["alpha"], setting["min_size"], setting["balance"])
    if kind == "inner_dirichlet":
        return inner_dirichlet(labels, n, rng, setting["alpha"])
    if kind == "hybrid":
        return hybrid(labels, n, rng, setting["alpha_balanced"], setting["alpha"], setting["min_size"],
                      setting["balance"])
    if kind == "shards":
        return shards(labels, n, rng, setting["classes_per_client"], setting["distinct"])
    if kind == "label_quantity":
        return label_quantity(labels, n, rng, setting["classes_per_client"])
    if kind == "pachinko":
        # CIFAR-100 only (config.check_compatible refuses other datasets): coarse labels from the fixed map.
        return pachinko(labels, CIFAR100_COARSE[labels], n, rng, setting["alpha"], setting["beta"],
                        setting.get("samples_per_client"))
    raise PartitionError(f"unknown partition kind '{kind}'")


# --------------------------------------------------------------------------- long-tailed client data (FedLAW Table 7)


def long_tail_counts(class_sizes: np.ndarray, rho: float) -> np.ndarray:
    """Class c of C keeps floor(N_c rho^(-c/(C-1))) samples: class 0 all of them, the last a rho-th
    (FedLAW's code's long-tailed CIFAR; Cao et al. 2019's exponential profile)."""
    c = len(class_sizes)
    keep = class_sizes * rho ** (-np.arange(c) / max(c - 1, 1))
    return np.floor(keep + 1e-9).astype(int)


def long_tailed(labels: np.ndarray, setting: dict, rng: np.random.Generator) -> list[np.ndarray]:
    """Keep a long-tailed subset of the training set (drawn by the partition seed), then split only it
    with the setting's kind; the indices returned are the training set's."""
    classes = int(labels.max()) + 1
    keep = long_tail_counts(np.bincount(labels, minlength=classes), setting["long_tail_rho"])
    kept = np.sort(np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:keep[c]] for c in range(classes)]))
    inner = {k: v for k, v in setting.items() if k != "long_tail_rho"}
    return [kept[part] for part in make(labels[kept], inner)]


def class_counts(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


def content_hash(parts: list[np.ndarray]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(np.asarray(part, dtype=np.int64).tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:16]


# --------------------------------------------------------------------------- artifact


def save(out_dir: str | Path, setting: dict, labels: np.ndarray, parts: list[np.ndarray],
         num_classes: int) -> dict:
    """Write the partition artifact: indices, class counts (csv), heatmap, and its description."""
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "clients.npz", **{f"client_{i}": p for i, p in enumerate(parts)})
    counts = class_counts(labels, parts, num_classes)
    frame = pd.DataFrame(counts, columns=[f"class_{k}" for k in range(num_classes)])
    frame.index.name = "client"
    frame.to_csv(out / "counts.csv")
    info = {"setting": setting, "content_hash": content_hash(parts), "num_samples": int(sum(map(len, parts))),
            "sizes": {"min": int(counts.sum(1).min()), "max": int(counts.sum(1).max()),
                      "mean": float(counts.sum(1).mean())}}
    _heatmap(counts, out / "heatmap.png", setting)
    (out / "partition.json").write_text(json.dumps(info, indent=2))
    return info


def _heatmap(counts: np.ndarray, path: Path, setting: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    width = min(14, max(4.0, 2 + 0.12 * counts.shape[0]))
    fig, ax = plt.subplots(figsize=(width, 3.2))
    sns.heatmap(counts.T, cmap="viridis", ax=ax, cbar_kws={"label": "samples"})
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    title = f"{setting['dataset']}, {setting['num_clients']} clients: " + ", ".join(
        f"{k}={v}" for k, v in setting.items() if k not in ("dataset", "num_clients"))
    # about 13 characters of 8-point text per inch of the axes: the title wraps instead of running off
    ax.set_title(textwrap.fill(title, int(13 * (width - 1.2))), fontsize=8, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def load(out_dir: str | Path, setting: dict | None = None) -> list[np.ndarray]:
    """The clients' index arrays; with ``setting``, checked to be that partition: partition.json must
    describe ``setting`` and record the content hash of the arrays read (a file copied over another
    partition's, or altered, is refused)."""
    from fedrepro.records import read_json

    out = Path(out_dir)
    path = out / "clients.npz"
    try:
        with np.load(path) as data:
            parts = [data[f"client_{i}"] for i in range(len(data.files))]
    except Exception as err:  # noqa: BLE001 - BadZipFile, zlib.error, OSError, KeyError, ValueError
        raise PartitionError(f"{path}: cannot be read ({type(err).__name__}: {err}); delete {out} and rerun "
                             f"to make it again") from None
    if setting is not None:
        from fedrepro.identity import without_path
        info = read_json(out / "partition.json")
        if without_path(info.get("setting") or {}) != without_path(setting):
            raise PartitionError(f"{out / 'partition.json'} describes {json.dumps(info.get('setting'), sort_keys=True)}, "
                                 f"not this run's partition {json.dumps(setting, sort_keys=True)}")
        if info.get("content_hash") != content_hash(parts):
            raise PartitionError(f"{path} holds other indices (content hash {content_hash(parts)}) than "
                                 f"{out / 'partition.json'} records ({info.get('content_hash')}); delete {out} and "
                                 f"rerun to make it again")
    return parts
