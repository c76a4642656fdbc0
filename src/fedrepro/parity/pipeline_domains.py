"""IMA's feature-skew data sets, Digit-Five and PACS, through both programs' loaders (the data check, as
``pipeline`` does for the single-domain data sets). One set of generated files serves both programs, since IMA's
loaders and fedrepro's read the same layouts (``generated.write_digit5``, ``generated.write_pacs``): the code's
``mixed_digit_dataloader.get_mixed_digit_datasets()`` (percent 1, as its client loaders call it) and
``PACS_dataloader.get_PACS_datasets()``, unchanged, run in a scratch working directory whose ``data/`` holds the
files where they look (``data/mixed_digit_dataset/<domain>``, ``./data/PACS/<domain>``); fedrepro's
``data.load("digit5" | "pacs", ...)`` reads the same folders.

Compared, domain by domain and sample by sample, in both splits: the input tensor the model receives (the code's
transform's output against fedrepro's ``DomainDataset.batch``) and the label. Both sides compute ``x / 255`` then
``(x - mean) / std`` per channel in float32, one correctly rounded operation each in the same order, after the same
PIL operations (bilinear resize, grey to RGB, Resize(256) and CenterCrop(224)), so the bound is 0: bit for bit.
Recorded beside the gaps, so that the row says what was compared: the domains in order (position d of the code's
list against fedrepro's domain d; PACS's folder names read from the code's ImageFolders), the code's transform
steps per domain, the normalisation constants each side holds, the input shape, random transforms (none on either
side: IMA has no augmentation) and, for PACS, the classes (ImageFolder's sorted folders against ``pacs.CLASSES``).
The test split of PACS is the code's own draw (numpy's legacy generator seeded with 1): a wrong split would put
other images at a position, which the inputs show.

Shim (the code's files untouched): the package ``__init__`` of its partial FedLab copy a placeholder (it imports
four modules HEAD lacks; the dataloaders import partitioners from below it), pynvml a placeholder (that copy's
``functional`` imports it), ``numpy.compat.long`` (NumPy 2 removed ``numpy.compat``; ``DigitsDataset`` casts its
labels with it) and the working directory."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import torch

from fedrepro.parity import generated
from fedrepro.parity.shim import checkout_on_path, numpy_compat

DATASETS = ("digit5", "pacs")
IMA_STUBS = ("fedlab.utils", "pynvml")
# where IMA's loaders look, relative to the working directory; fedrepro's root for the same files
CODE_FOLDERS = {"digit5": Path("data") / "mixed_digit_dataset", "pacs": Path("data") / "PACS"}
WRITERS = {"digit5": generated.write_digit5, "pacs": generated.write_pacs}


def _transform(code_set):
    """The transform a code's data set applies (PACS: its Subset's ImageFolder's)."""
    return getattr(code_set, "transform", None) or code_set.dataset.transform


def _normalize(code_set) -> list[list[float]]:
    steps = [t for t in _transform(code_set).transforms if type(t).__name__ == "Normalize"]
    return [list(map(float, steps[0].mean)), list(map(float, steps[0].std))] if steps else []


def _random_steps(code_set) -> list[str]:
    return [type(t).__name__ for t in _transform(code_set).transforms if type(t).__name__.startswith("Random")]


def _compare_domain(code_set, ours, d: int) -> dict:
    index = torch.nonzero(ours.domain == d).flatten()
    x_ours, y_ours = ours.batch(index) if len(index) else (torch.empty(0), torch.empty(0))
    gap, labels_differ, shape = 0.0, 0, None
    for i in range(min(len(code_set), len(index))):
        x_code, y_code = code_set[i]
        x_code = torch.as_tensor(x_code)
        shape = list(x_code.shape)
        if x_code.shape != x_ours[i].shape:
            gap = float("inf")
            continue
        gap = max(gap, float((x_code - x_ours[i]).abs().max()))
        labels_differ += int(int(y_code) != int(y_ours[i]))
    if len(code_set) != len(index):
        gap = float("inf")  # a sample one side has and the other lacks
    return {
        "samples": len(index),
        "code_samples": len(code_set),
        "max_gap": gap,
        "labels_differing": labels_differ,
        "input_shape": shape,
    }


def compare_sets(dataset: str, root, code: dict) -> dict:
    """One row: the code's per-domain data sets (``code``: {"train": [...], "test": [...]}, the code's domain
    order) against fedrepro's loader of ``dataset`` reading ``root``."""
    from fedrepro import data

    row: dict = {"dataset": dataset, "domains": []}
    splits = {split: data.load(dataset, root, train=split == "train") for split in ("train", "test")}
    names = splits["train"].domain_names
    if len(code["train"]) != len(names):
        row["domain_count"] = {"code": len(code["train"]), "ours": len(names)}
    for d, name in enumerate(names[: len(code["train"])]):
        entry = {"domain": name, "code_transform": [repr(t) for t in _transform(code["train"][d]).transforms]}
        folder = getattr(getattr(code["train"][d], "dataset", None), "root", None)
        if folder is not None:  # PACS: the ImageFolder's own folder names the code's domain at this position
            entry["code_folder"] = Path(folder).name
        for split, ours in splits.items():
            entry[split] = _compare_domain(code[split][d], ours, d)
        row["domains"].append(entry)
    ours = splits["train"]
    code_constants = [_normalize(s) for s in code["train"] + code["test"]]
    row["normalize"] = {
        "code": code_constants[0],
        "ours": [[float(f"{v:.7g}") for v in t.tolist()] for t in (ours.mean, ours.std)],  # float32, 7 digits
        "equal": all(
            c and torch.equal(torch.tensor(c[0]), ours.mean) and torch.equal(torch.tensor(c[1]), ours.std)
            for c in code_constants
        ),
    }
    row["augment"] = {
        "code": sorted({s for c in code["train"] for s in _random_steps(c)}),
        "ours": bool(ours.augment),
    }
    code_classes = getattr(getattr(code["train"][0], "dataset", None), "classes", None)
    if code_classes is not None:  # PACS: ImageFolder's classes, its sorted folder names
        from fedrepro.data import pacs

        row["classes"] = {"code": list(code_classes), "ours": list(pacs.CLASSES)}
    for split in ("train", "test"):
        parts = [e[split] for e in row["domains"]]
        row[split] = {
            "samples": sum(p["samples"] for p in parts),
            "max_gap": max((p["max_gap"] for p in parts), default=float("inf")),
            "labels_differing": sum(p["labels_differing"] for p in parts),
            "pinned_draws": 0,
        }
    exact = all(row[s]["max_gap"] == 0.0 and not row[s]["labels_differing"] for s in ("train", "test"))
    classes = row.get("classes", {})
    agree = [
        row["normalize"]["equal"],
        not row["augment"]["code"] and not row["augment"]["ours"],
        "domain_count" not in row and all(e.get("code_folder", e["domain"]) == e["domain"] for e in row["domains"]),
        classes.get("code") == classes.get("ours"),
    ]
    row["status"] = "equal" if exact and all(agree) else "differs"
    return row


def _ima_sets(checkout, datasets: list[str]) -> dict:
    """The code's data sets, per dataset: its loaders' own functions, unchanged, in the working directory."""
    with checkout_on_path(checkout, stubs=IMA_STUBS), numpy_compat():
        import mixed_digit_dataloader
        import PACS_dataloader

        loaders = {
            "digit5": mixed_digit_dataloader.get_mixed_digit_datasets,
            "pacs": PACS_dataloader.get_PACS_datasets,
        }
        return {d: dict(zip(("train", "test"), loaders[d]())) for d in datasets}


def compare_ima(checkout, wanted: dict) -> list[dict]:
    """A row per feature-skew dataset of IMA's params file (``wanted``: dataset -> fedrepro's preprocessing
    entries, which these families do not read: their preprocessing is fixed, as the code's)."""
    datasets = [d for d in DATASETS if d in wanted]
    with tempfile.TemporaryDirectory(prefix="fedrepro-parity-domains-") as tmp, contextlib.chdir(tmp):
        for dataset in datasets:
            WRITERS[dataset](Path(tmp) / CODE_FOLDERS[dataset])
        code = _ima_sets(checkout, datasets)  # PACS's ImageFolders open files by relative paths: compared in tmp
        return [compare_sets(d, Path(tmp) / CODE_FOLDERS[d], code[d]) for d in datasets]
