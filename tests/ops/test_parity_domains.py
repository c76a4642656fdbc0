"""The data check of IMA's feature-skew data sets (fedrepro.parity.pipeline_domains, docs/parity.md): Digit-Five
and PACS on generated files in the layouts both programs read. Without a checkout the code's side is IMA's
pipelines written out in this file from its loaders' transforms (torchvision calls, the seeded PACS split); with
FEDREPRO_IMA_CHECKOUT (TailinZhou/FedIMA) the code's own ``get_mixed_digit_datasets`` and ``get_PACS_datasets``.
Either must agree with fedrepro bit for bit, and a wrong term on fedrepro's side (a normalisation constant, the
resize, the domain order, the test split's seed, the class order) must turn the row to "differs"."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fedrepro.data import digit5, pacs
from fedrepro.parity import generated, matrix, pipeline_domains, shim

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

IMA = os.environ.get("FEDREPRO_IMA_CHECKOUT")


def _digit_steps():
    """IMA's Digit-Five steps before ToTensor, per domain: MNIST and MNIST-M are not resized (FedBN's files are
    28 x 28), USPS is resized, then made 3-channel grey."""
    from torchvision import transforms as T

    grey, to28 = T.Grayscale(num_output_channels=3), T.Resize([28, 28])
    return {"MNIST": [grey], "SVHN": [to28], "USPS": [to28, grey], "SynthDigits": [to28], "MNIST_M": []}


class _Digits(torch.utils.data.Dataset):
    """A Digit-Five domain as IMA's loader reads it: the ten training parts in order, or test.pkl."""

    def __init__(self, folder: Path, train: bool, transform):
        names = [f"partitions/train_part{i}.pkl" for i in range(10)] if train else ["test.pkl"]
        pairs = [pickle.loads((folder / n).read_bytes()) for n in names]
        self.images = np.concatenate([x for x, _ in pairs])
        self.targets = np.concatenate([y for _, y in pairs]).astype(np.int64)
        self.transform = transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        from PIL import Image

        image = self.images[i]
        return self.transform(Image.fromarray(image, mode="L" if image.ndim == 2 else "RGB")), self.targets[i]


def _ima_written_out(dataset: str, root: Path) -> dict:
    from torchvision import datasets, transforms as T

    if dataset == "digit5":
        tail = [T.ToTensor(), T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))]
        steps = _digit_steps()
        return {
            split: [_Digits(root / name, split == "train", T.Compose(steps[name] + tail)) for name in steps]
            for split in ("train", "test")
        }
    imagenet = T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    transform = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), imagenet])
    np.random.seed(1)  # once, then one shuffle per domain in the code's order: its 10% test split
    out = {"train": [], "test": []}
    for name in ("photo", "art_painting", "cartoon", "sketch"):
        folder = datasets.ImageFolder(str(root / name), transform=transform)
        order = list(range(len(folder)))
        np.random.shuffle(order)
        cut = int(0.1 * len(order))
        out["train"].append(torch.utils.data.Subset(folder, order[cut:]))
        out["test"].append(torch.utils.data.Subset(folder, order[:cut]))
    return out


def _check(dataset: str, tmp_path: Path) -> dict:
    root = pipeline_domains.WRITERS[dataset](tmp_path / dataset)
    return pipeline_domains.compare_sets(dataset, root, _ima_written_out(dataset, root))


@pytest.mark.parametrize("dataset", ["digit5", "pacs"])
def test_imas_pipelines_written_out_give_our_inputs_bit_for_bit(dataset, tmp_path):
    row = _check(dataset, tmp_path)
    assert row["status"] == "equal", row
    assert [d["domain"] for d in row["domains"]] == list((digit5 if dataset == "digit5" else pacs).DOMAINS)
    for d in row["domains"]:  # a few dozen samples a domain, every one compared
        assert d["train"]["samples"] == d["train"]["code_samples"] >= 30 and d["test"]["samples"] >= 3
        assert d["train"]["input_shape"] == ([3, 28, 28] if dataset == "digit5" else [3, 224, 224])
    assert row["normalize"]["equal"] and row["augment"] == {"code": [], "ours": False}
    steps = {
        "digit5": "MNIST Grayscale(3); SVHN, SynthDigits Resize([28, 28], bilinear); USPS Resize([28, 28], bilinear), "
        "Grayscale(3); MNIST_M none;",
        "pacs": "every domain Resize(256, bilinear), CenterCrop(224);",
    }
    text = matrix._domains_text(row)
    assert text.startswith("equal (") and steps[dataset] in text


def _torch_bilinear(images: np.ndarray) -> np.ndarray:
    """A plausible wrong resize: torch's bilinear interpolation without PIL's antialiasing."""
    x = torch.from_numpy(images if images.ndim == 4 else np.repeat(images[..., None], 3, axis=3)).permute(0, 3, 1, 2)
    if x.shape[-1] != digit5.SIDE:
        x = torch.nn.functional.interpolate(x.float(), size=(28, 28), mode="bilinear").round().clamp(0, 255)
    return x.to(torch.uint8).permute(0, 2, 3, 1).numpy()


def _wrong_mean(concatenate):
    return lambda splits, names, mean, std: concatenate(splits, names, (0.49, 0.5, 0.5), std)


WRONG = {
    "digit5 mean 0.49": ("digit5", lambda mp: mp.setattr(digit5, "concatenate", _wrong_mean(digit5.concatenate))),
    "digit5 resized by torch": ("digit5", lambda mp: mp.setattr(digit5, "to_rgb28", _torch_bilinear)),
    "digit5 domains reversed": ("digit5", lambda mp: mp.setattr(digit5, "DOMAINS", digit5.DOMAINS[::-1])),
    "pacs std 0.226": ("pacs", lambda mp: mp.setattr(pacs, "IMAGENET", (pacs.IMAGENET[0], (0.229, 0.224, 0.226)))),
    "pacs split seed 2": ("pacs", lambda mp: mp.setattr(pacs, "SPLIT_SEED", 2)),
    "pacs classes swapped": ("pacs", lambda mp: mp.setattr(pacs, "CLASSES", ("elephant", "dog", *pacs.CLASSES[2:]))),
}


@pytest.mark.parametrize("wrong", list(WRONG))
def test_a_wrong_term_on_our_side_turns_the_row_to_differs(wrong, tmp_path, monkeypatch):
    dataset, apply = WRONG[wrong]
    root = pipeline_domains.WRITERS[dataset](tmp_path / dataset)  # the files as the right order writes them
    code = _ima_written_out(dataset, root)
    apply(monkeypatch)
    row = pipeline_domains.compare_sets(dataset, root, code)
    assert row["status"] == "differs", wrong
    assert row["train"]["max_gap"] > 0 or row["train"]["labels_differing"] > 0 or not row["normalize"]["equal"]
    assert matrix._domains_text(row).startswith("differs (")


def test_generated_files_are_in_fedbns_shapes_and_pacs_layout(tmp_path):
    root = generated.write_digit5(tmp_path / "digit5")
    for name, shape in generated.DIGIT_SHAPES.items():
        images, labels = pickle.loads((root / name / "partitions" / "train_part9.pkl").read_bytes())
        assert images.dtype == np.uint8 and images.shape[1:] == shape and len(labels) == generated.DIGIT_PART
    root = generated.write_pacs(tmp_path / "pacs")
    for name, per in generated.PACS_PER_CLASS.items():
        assert sorted(p.name for p in (root / name).iterdir()) == sorted(pacs.CLASSES)
        assert all(len(list((root / name / c).iterdir())) == per for c in pacs.CLASSES)


def test_numpy_compat_gives_numpy_1s_long_and_leaves_numpy_as_it_was():
    had = hasattr(np, "compat")
    with shim.numpy_compat():
        assert np.compat.long is int
        assert np.array([3.0]).astype(np.compat.long).dtype == np.int64
    assert hasattr(np, "compat") == had


@pytest.mark.skipif(not IMA, reason="FEDREPRO_IMA_CHECKOUT (a checkout of TailinZhou/FedIMA) is not set")
def test_imas_own_loaders_give_our_inputs_and_see_a_wrong_constant(monkeypatch):
    rows = pipeline_domains.compare_ima(IMA, {"digit5": [{}], "pacs": [{}]})
    assert [(r["dataset"], r["status"]) for r in rows] == [("digit5", "equal"), ("pacs", "equal")], rows
    assert [d["code_folder"] for d in rows[1]["domains"]] == list(pacs.DOMAINS)
    monkeypatch.setattr(digit5, "concatenate", _wrong_mean(digit5.concatenate))
    (row,) = pipeline_domains.compare_ima(IMA, {"digit5": [{}]})
    assert row["status"] == "differs" and row["train"]["max_gap"] > 0


def test_every_data_cell_of_the_page_is_compared_or_says_why_not():
    """No data cell waits for generated files; FedNova's Synthetic row is not comparable, with the reason."""
    from fedrepro.parity import records

    rows = [line.split(" | ") for line in matrix.render(records.FOLDER).splitlines() if line.startswith("| ")][1:]
    data = {(r[0].strip("| "), r[1]): r[4] for r in rows}
    assert not [k for k, cell in data.items() if cell.startswith("not compared")], data
    assert data["fednova", "synthetic_1_1"].startswith("not comparable (the FedNova code has no Synthetic data set")
    assert data["ima", "digit5"].startswith("equal (5 domains") and data["ima", "pacs"].startswith("equal (4 domains")
