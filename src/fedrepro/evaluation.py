"""What every run of a comparison is scored on, and how: the test set minus the comparison's proxy
hold-out, with the model in eval mode; or, for the tuning stage (fedrepro.configure.tuning), a validation split
carved from the clients' training data, so that choosing a hyperparameter never looks at the test set.
Below the engine and the methods, which both use it.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch

from fedrepro import streams


def proxy_class_counts(size: int, classes: int, rho: float = 1.0) -> np.ndarray:
    """Samples per class of a proxy set of ``size``: size / C each, or with ``rho`` > 1 long-tailed (FedLAW
    Table 6): class c in proportion to rho^(-c/(C-1)), the total kept at ``size`` by largest remainders.
    (FedLAW's code takes floor(size/C rho^(-c/(C-1))), a smaller set as well as a skewed one; keeping the size
    compares the class skew alone with the balanced proxy.)"""
    if rho == 1:
        return np.full(classes, size // classes)
    share = size * rho ** (-np.arange(classes) / max(classes - 1, 1))
    share = share / share.sum() * size
    counts = np.floor(share).astype(int)
    counts[np.argsort(-(share - counts), kind="stable")[: size - counts.sum()]] += 1
    return counts


def proxy_indices(labels: torch.Tensor, size: int, seed: int, rho: float = 1.0) -> torch.Tensor:
    """proxy_class_counts test samples of each class (size / C each unless long-tailed), drawn by the run's
    seed: the server's proxy set, held out of the evaluation of every run of a comparison
    (``evaluation.proxy_holdout``)."""
    labels = labels.cpu().numpy()
    classes = np.unique(labels)
    rng = streams.rng("proxy", seed)
    counts = proxy_class_counts(size, len(classes), rho)
    picked = [rng.choice(np.flatnonzero(labels == c), k, replace=False) for c, k in zip(classes, counts)]
    return torch.from_numpy(np.sort(np.concatenate(picked)))


def split_test(test, holdout: int, seed: int, rho: float = 1.0):
    """(evaluation set, proxy set or None): the test set minus the class-balanced (or, ``rho`` > 1,
    long-tailed) hold-out, and the hold-out. The split belongs to the comparison, so every method of it is
    scored on the same samples."""
    if not holdout:
        return test, None
    index = proxy_indices(test.labels, holdout, seed, rho).to(test.labels.device)
    keep = torch.ones(len(test), dtype=torch.bool, device=test.labels.device)
    keep[index] = False
    return test.subset(keep.nonzero().squeeze(1)), test.subset(index)


def validation_split(parts: list[np.ndarray], fraction: float, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """(each client's trained samples, the pooled validation samples): every client keeps floor(fraction * n_i)
    of its training samples apart (at most n_i - 1, so it still trains), drawn by (seed, client); the union of
    the kept-apart samples is the validation set. Carved per client, it follows the clients' label skew: the
    validation set has the federation's label mix, as the test set of these papers has the global one. The
    run's seed draws it, so every candidate of a tuning grid is scored on the same samples at each seed."""
    trained, held = [], []
    for client, part in enumerate(parts):
        part = np.asarray(part)
        order = part[streams.rng("validation", seed, client).permutation(len(part))]
        k = min(int(fraction * len(part)), max(len(part) - 1, 0))
        trained.append(np.sort(order[k:]))
        held.append(order[:k])
    return trained, np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)


def validation_set(train, held: np.ndarray):
    """The validation samples of the training split, scored as a test set is: without the training
    split's random augmentation (a dataset that augments is a dataclass with that flag)."""
    valid = train.subset(torch.as_tensor(held, device=train.labels.device))
    return dataclasses.replace(valid, augment=False) if valid.augment else valid


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module):
    """Score with dropout off (and BatchNorm on its running statistics); the previous mode comes back."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, test, batch_size: int = 4096, index: torch.Tensor | None = None
) -> tuple[float, float]:
    """Accuracy and mean loss with the model in eval mode (dropout off), its mode restored after;
    over the samples at ``index`` (repeats count as often as they occur) or the whole split."""
    device = test.labels.device
    index = torch.arange(len(test), device=device) if index is None else index.to(device)
    correct = torch.zeros((), device=device)
    loss = torch.zeros((), device=device)
    with eval_mode(model):
        for start in range(0, len(index), batch_size):
            x, y = test.batch(index[start : start + batch_size])
            logits = model(x)
            loss += torch.nn.functional.cross_entropy(logits, y, reduction="sum")
            correct += (logits.argmax(1) == y).sum()
    return float(correct) / len(index), float(loss) / len(index)


def score(model: torch.nn.Module, test, batch_size: int = 4096) -> dict[str, float]:
    """The round's test columns: ``test_acc`` and ``test_loss`` over the split; for a multi-domain split
    (a ``domain`` per sample: IMA's Digit-Five, PACS) each domain's accuracy and loss on its own samples
    (``test_acc_<domain>``) and, as the paper reports, their unweighted mean over the domains as test_acc and
    test_loss (a domain with no sample in the split is left out of the mean)."""
    names = getattr(test, "domain_names", None)
    if not names:
        acc, loss = evaluate(model, test, batch_size)
        return {"test_acc": acc, "test_loss": loss}
    row, accs, losses = {}, [], []
    for d, name in enumerate(names):
        index = (test.domain == d).nonzero().squeeze(1)
        if len(index):
            acc, loss = evaluate(model, test, batch_size, index)
            accs.append(acc)
            losses.append(loss)
        else:
            acc = loss = float("nan")
        row[f"test_acc_{name}"], row[f"test_loss_{name}"] = acc, loss
    row["test_acc"], row["test_loss"] = float(np.mean(accs)), float(np.mean(losses))
    return row


def unaugmented(dataset):
    """The split as the objective sees it: no random augmentation (which would also draw from the
    training RNG stream and change the run). Shares the tensors, copies nothing."""
    if not dataset.augment:
        return dataset
    return dataclasses.replace(dataset, augment=False)


def global_train_loss(model: torch.nn.Module, train, parts: list[torch.Tensor], batch_size: int = 4096) -> float:
    """The global objective F(x) = sum_i (n_i / n) F_i(x): the model's mean loss over every client's
    training samples, i.e. the size-weighted mean of the clients' mean losses (FedNova Fig. 5)."""
    return evaluate(model, unaugmented(train), batch_size, torch.cat(parts))[1]
