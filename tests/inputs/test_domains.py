"""IMA's feature-skew datasets (Digit-Five, PACS) on tiny files written in the real on-disk formats (FedBN's
pickled parts, PACS's folder of images): loading and preprocessing, the per-domain partition, the
per-domain evaluation and one federated run through the engine."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import U32
from fedrepro import data, identity, models, partitions
from fedrepro.configure import schema, settings
from fedrepro.data import digit5, pacs
from fedrepro.data.base import DataError
from fedrepro.data.domains import DomainDataset
from fedrepro.evaluation import score
from fedrepro.parity.generated import DIGIT_SHAPES  # FedBN's image shapes per domain
from fedrepro.partitions import label_quantity, records as partition_records
from fedrepro.partitions.base import PartitionError
from fedrepro.run.trainer import Trainer

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats

PART, TEST = 12, 10


def write_digit5(root: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for d, name in enumerate(digit5.DOMAINS):
        base = root / name
        (base / "partitions").mkdir(parents=True)
        files = [base / "partitions" / f"train_part{i}.pkl" for i in range(10)] + [base / "test.pkl"]
        for i, path in enumerate(files):
            n = TEST if path.name == "test.pkl" else PART
            images = rng.integers(0, 256, (n, *DIGIT_SHAPES[name]), dtype=np.uint8)
            labels = (np.arange(n) + i + d) % 10
            with open(path, "wb") as fh:
                pickle.dump((images, labels.astype(np.float64)), fh)  # FedBN's labels are not always ints
    return root


@pytest.fixture
def digit_root(tmp_path) -> Path:
    return write_digit5(tmp_path / "data" / "digit5")


def test_digit5_loads_every_domain_resized_to_28_in_three_channels(digit_root):
    train, test = data.load("digit5", digit_root, True), data.load("digit5", digit_root, False)
    assert isinstance(train, DomainDataset) and train.domain_names == digit5.DOMAINS
    assert train.images.shape == (5 * 10 * PART, 3, 28, 28) and test.images.shape == (5 * TEST, 3, 28, 28)
    assert torch.equal(torch.bincount(train.domain), torch.full((5,), 10 * PART))
    with open(digit_root / "USPS" / "partitions" / "train_part3.pkl", "rb") as fh:
        images, labels = pickle.load(fh)
    at = 2 * 10 * PART + 3 * PART  # USPS is the third domain; part 3 of ten
    assert torch.equal(train.labels[at : at + PART], torch.as_tensor(labels, dtype=torch.int64))
    # the oracle: torchvision's own transform of IMA's code for USPS on the PIL image
    from PIL import Image
    from torchvision import transforms

    usps = transforms.Compose(
        [
            transforms.Resize([28, 28]),
            transforms.Grayscale(num_output_channels=3),
            transforms.ToTensor(),
            transforms.Normalize((0.5,) * 3, (0.5,) * 3),
        ]
    )
    x, y = train.batch(torch.tensor([at + 5]))
    assert torch.allclose(x[0], usps(Image.fromarray(images[5], mode="L")), rtol=0, atol=normalise_bound(0.5, 0.5))
    assert y.item() == labels[5]
    # MNIST (already 28 x 28, grey): no resize, the grey value in all three channels
    with open(digit_root / "MNIST" / "partitions" / "train_part0.pkl", "rb") as fh:
        mnist = pickle.load(fh)[0]
    x, _ = train.batch(torch.tensor([0]))
    assert torch.allclose(
        x[0],
        (torch.as_tensor(mnist[0], dtype=torch.float32) / 255 - 0.5).div(0.5).expand(3, 28, 28),
        rtol=0,
        atol=normalise_bound(0.5, 0.5),
    )


def normalise_bound(mean: float, std: float) -> float:
    """How far two float32 computations of (v / 255 - mean) / std for a pixel v can be: each takes at most 4
    roundings (the divisions and the subtraction, or a multiply-add with the constants folded and rounded), each
    within u of the largest term, (1 + mean) / std; two of them differ by at most twice that."""
    return 2 * 4 * U32 * (1 + mean) / std


def test_digit5_labels_and_domains_without_decoding_match_load(digit_root):
    train = data.load("digit5", digit_root, True)
    assert np.array_equal(data.train_labels("digit5", digit_root), train.labels.numpy())
    assert np.array_equal(data.train_domains("digit5", digit_root), train.domain.numpy())
    assert data.train_domains("fmnist", digit_root) is None


def test_digit5_download_checks_the_files_and_names_a_missing_one(digit_root):
    assert data.download("digit5", digit_root, log=lambda *_: None) == digit_root
    # the download rule's step: the check, then the list of what is there as its output
    data.prepare("digit5", digit_root, None, digit_root / "download.json")
    assert set(json.loads((digit_root / "download.json").read_text())["files"]) == set(digit5.DOMAINS)
    gone = digit_root / "SVHN" / "partitions" / "train_part7.pkl"
    gone.unlink()
    with pytest.raises(DataError, match=r"train_part7.pkl: missing; .*docs/datasets.md") as err:
        data.download("digit5", digit_root, log=lambda *_: None)
    assert "\n" not in str(err.value)
    with pytest.raises(DataError, match="train_part7.pkl"):
        data.load("digit5", digit_root, True)


def test_digit5_refuses_a_file_that_is_not_an_images_labels_pair(digit_root):
    path = digit_root / "MNIST" / "test.pkl"
    with open(path, "wb") as fh:
        pickle.dump({"images": 1}, fh)
    with pytest.raises(DataError, match="test.pkl: not a pickled"):
        data.load("digit5", digit_root, False)


# --------------------------------------------------------------------------- PACS


PACS_COUNTS = {"photo": 2, "art_painting": 3, "cartoon": 2, "sketch": 4}  # images per class (x 7 classes)


def write_pacs(root: Path) -> Path:
    from PIL import Image

    rng = np.random.default_rng(1)
    for name, per in PACS_COUNTS.items():
        for cls in pacs.CLASSES:
            where = root / name / cls
            where.mkdir(parents=True)
            for i in range(per):
                mode = "L" if name == "sketch" else "RGB"
                shape = (20, 30) if mode == "L" else (20, 30, 3)  # not square: Resize keeps the ratio
                suffix = ".png" if i % 2 else ".jpg"
                Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode=mode).save(where / f"{i:03d}{suffix}")
    return root


@pytest.fixture
def pacs_root(tmp_path) -> Path:
    return write_pacs(tmp_path / "data" / "pacs")


def test_pacs_test_split_is_the_codes_seeded_shuffle(pacs_root):
    """The oracle is IMA's code's recipe run here: np.random.seed(1) once, then per domain in order a shuffled
    index list whose first 10% are the test set."""
    sizes = [7 * PACS_COUNTS[name] for name in pacs.DOMAINS]
    np.random.seed(1)
    expected = []
    for n in sizes:
        order = list(range(n))
        np.random.shuffle(order)
        expected.append((sorted(order[int(0.1 * n) :]), sorted(order[: int(0.1 * n)])))
    got = pacs.test_split(sizes)
    assert [(sorted(a.tolist()), sorted(b.tolist())) for a, b in got] == expected
    assert [len(b) for _, b in got] == [int(0.1 * n) for n in sizes] == [1, 2, 1, 2]


def test_pacs_loads_224_crops_normalised_as_imagenet(pacs_root):
    train, test = data.load("pacs", pacs_root, True), data.load("pacs", pacs_root, False)
    assert train.images.shape[1:] == (3, 224, 224) and len(train) + len(test) == 7 * sum(PACS_COUNTS.values())
    assert torch.equal(torch.bincount(test.domain, minlength=4), torch.tensor([1, 2, 1, 2]))
    assert np.array_equal(data.train_labels("pacs", pacs_root), train.labels.numpy())
    assert np.array_equal(data.train_domains("pacs", pacs_root), train.domain.numpy())
    # the first training sample: photo's, at the position the code's split puts first
    paths, labels = pacs.domain_files(pacs_root, "photo")
    first = pacs.test_split([len(labels)])[0][0][0]
    from PIL import Image
    from torchvision import transforms

    code = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    x, y = train.batch(torch.tensor([0]))
    bound = max(normalise_bound(m, s) for m, s in zip((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)))
    assert torch.allclose(x[0], code(Image.open(paths[first]).convert("RGB")), rtol=0, atol=bound)
    assert y.item() == labels[first]


def test_pacs_download_names_a_missing_class_folder(pacs_root):
    assert data.download("pacs", pacs_root, log=lambda *_: None) == pacs_root
    import shutil

    shutil.rmtree(pacs_root / "cartoon" / "giraffe")
    with pytest.raises(DataError, match=r"cartoon/giraffe: missing; pacs cannot be downloaded here"):
        data.download("pacs", pacs_root, log=lambda *_: None)


# --------------------------------------------------------------------------- partition


def domain_labels(domains: int = 5, per_domain: int = 400, classes: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, classes, domains * per_domain), np.repeat(np.arange(domains), per_domain)


@pytest.mark.parametrize(
    "kind,extra",
    [
        ("label_quantity", {"classes_per_client": 2}),
        ("dirichlet", {"alpha": 0.1, "min_size": 2, "balance": True}),
        ("shards", {"classes_per_client": 2, "distinct": False}),
    ],
)
def test_each_domain_is_split_over_its_own_twenty_clients(kind, extra):
    labels, domains = domain_labels()
    setting = {"dataset": "digit5", "num_clients": 100, "kind": kind, "seed": 1, **extra}
    parts = partitions.make(labels, setting, domains=domains)
    assert len(parts) == 100
    for j, part in enumerate(parts):
        assert len(part) and set(domains[part]) == {j // 20}, "client j holds samples of domain j // 20 only"
    used = np.concatenate(parts)
    assert len(np.unique(used)) == len(used)
    # each domain alone is the kind's own partition of that domain's samples, with the same seed
    inner = {**setting, "num_clients": 20}
    for d in range(5):
        at = np.flatnonzero(domains == d)
        assert all(
            np.array_equal(a, at[b]) for a, b in zip(parts[20 * d : 20 * d + 20], partitions.make(labels[at], inner))
        )
    groups = partitions.groups(setting)
    assert list(groups) == [f"domain_{n}" for n in digit5.DOMAINS] and list(groups["domain_USPS"]) == list(
        range(40, 60)
    )


def test_label_quantity_gives_each_client_its_classes_split_evenly():
    labels = np.repeat(np.arange(10), 37)
    parts = label_quantity.split(labels, 20, np.random.default_rng(3), classes_per_client=2)
    held = [set(labels[p]) for p in parts]
    assert all(len(h) == 2 and j % 10 in h for j, h in enumerate(held))
    for k in range(10):  # class k's 37 samples, all given out, in near-equal pieces among its holders
        pieces = [int((labels[p] == k).sum()) for p, h in zip(parts, held) if k in h]
        assert sum(pieces) == 37 and max(pieces) - min(pieces) <= 1
    with pytest.raises(PartitionError, match="classes_per_client = 11"):
        label_quantity.split(labels, 20, np.random.default_rng(3), classes_per_client=11)


def test_config_refuses_clients_that_do_not_divide_over_the_domains():
    with pytest.raises(schema.ConfigError, match="multiple of 5"):
        settings.resolve(
            {
                "dataset": "digit5",
                "model": "digit_cnn_gn2",
                "num_clients": 98,
                "partition": {"kind": "label_quantity", "classes_per_client": 2},
            }
        )


# --------------------------------------------------------------------------- evaluation


class ReadsItsAnswer(torch.nn.Module):
    """Predicts the class written in pixel (0, 0, 0) of each image: accuracies known in advance."""

    def forward(self, x):
        cls = torch.round((x[:, 0, 0, 0] * 0.5 + 0.5) * 255).long()
        return torch.nn.functional.one_hot(cls, 10).float() * 10


def test_score_averages_the_domains_not_the_samples():
    answers = [[1, 2, 3, 4], [5, 6]]  # the model's predictions, domain by domain
    truth = [[1, 2, 3, 9], [5, 0]]  # domain 0: 3 of 4 right; domain 1: 1 of 2
    images = torch.zeros(6, 3, 2, 2, dtype=torch.uint8)
    images[:, 0, 0, 0] = torch.tensor(sum(answers, []), dtype=torch.uint8)
    test = DomainDataset(images, torch.tensor(sum(truth, [])), torch.tensor([0, 0, 0, 0, 1, 1]), ("a", "b"))
    row = score(ReadsItsAnswer(), test)
    assert row["test_acc_a"] == 0.75 and row["test_acc_b"] == 0.5
    assert row["test_acc"] == 0.625  # (0.75 + 0.5) / 2 is exact in binary; pooled over the samples it would be 4/6
    # a mean of two float64 numbers, summed and divided in either order: within two float64 roundings
    assert row["test_loss"] == pytest.approx((row["test_loss_a"] + row["test_loss_b"]) / 2, rel=2 * 2.0**-53, abs=0)


# --------------------------------------------------------------------------- end to end


def test_digit5_federated_rounds_through_the_engine(digit_root, tmp_path):
    s = settings.resolve(
        {
            "algorithm": "fedavg",
            "dataset": "digit5",
            "model": "digit_cnn_gn2",
            "device": "cpu",
            "num_clients": 10,
            "participation": 0.2,
            "rounds": 2,
            "batch_size": 16,
            "local_epochs": 1,
            "seed": 1,
            "partition": {"kind": "label_quantity", "classes_per_client": 2, "seed": 1},
        }
    )
    from fedrepro import cli

    part = identity.partition_setting(s)  # the partition step as Snakemake runs it: its clients stay in their domains
    cli.main(
        ["partition", "--setting", json.dumps(part), "--data-root", str(digit_root), "--out", str(tmp_path / "part")]
    )
    domains = data.train_domains("digit5", digit_root)
    assert [set(domains[p]) for p in partition_records.load(tmp_path / "part")] == [
        {d} for d in range(5) for _ in range(2)
    ]
    summary = Trainer(s, tmp_path / "run", tmp_path / "part", digit_root).run(progress=False)
    assert summary["status"] == "finished" and summary["rounds_done"] == 2
    import pandas as pd

    frame = pd.read_csv(tmp_path / "run" / "metrics.csv")
    # float64 means of five accuracies, in the run and here: within 5 float64 roundings each
    assert np.allclose(
        frame["test_acc"],
        frame[[f"test_acc_{name}" for name in digit5.DOMAINS]].mean(axis=1),
        rtol=2 * 5 * 2.0**-53,
        atol=0,
    )
    assert models.num_parameters(models.build("digit_cnn_gn2", "digit5")) == 806090


def test_a_dataset_is_served_by_the_one_family_whose_fragment_declares_it(tmp_path, monkeypatch):
    from fedrepro import catalog

    with pytest.raises(ValueError, match=r"unknown dataset 'mnist'; known: .*digit5.*pacs"):
        data.family("mnist")
    # a name declared by two fragments is refused, naming both
    for family in ("fmnist", "cifar"):
        (tmp_path / "data").mkdir(exist_ok=True)
        (tmp_path / "data" / f"{family}.py").write_text("")
        (tmp_path / "data" / f"{family}.yaml").write_text("datasets:\n  fmnist: {num_classes: 10}\n")
    monkeypatch.setattr(catalog, "PACKAGE", tmp_path)
    with pytest.raises(
        catalog.FragmentError, match=r"data/fmnist.yaml: dataset 'fmnist' is declared in data/cifar.yaml"
    ):
        catalog._members("data", "datasets")
    (tmp_path / "data" / "fmnist.py").unlink()
    with pytest.raises(catalog.FragmentError, match=r"fmnist.yaml: no fmnist.py beside it"):
        catalog._members("data", "datasets")
