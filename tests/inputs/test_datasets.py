"""CIFAR-10/100 and Synthetic: real download, extraction and loading code on generated files in the
real formats (python-pickle batches in a .tar.gz, served over loopback HTTP), no internet."""

from __future__ import annotations

import hashlib
import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fedrepro import catalog, data, identity, partitions
from fedrepro.configure.schema import ConfigError
from fedrepro.configure.settings import resolve
from fedrepro.data import cifar, synthetic
from fedrepro.partitions.base import PartitionError

# compares floating-point results: rerun under a lower kernel ISA (tests/README.md, "Floating point")
pytestmark = pytest.mark.floats


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _pickle_batch(folder: Path, name: str, images: np.ndarray, labels: np.ndarray, label_key: str) -> None:
    # The real format: latin1-decodable pickle of a dict with 'data' (N x 3072, channel-major) and labels.
    entry = {"data": images.reshape(len(images), -1), label_key: labels.tolist()}
    (folder / name).write_bytes(pickle.dumps(entry))


def make_fake_cifar(
    tmp: Path, dataset: str, monkeypatch, n_train: int = 20, n_test: int = 10
) -> tuple[Path, np.ndarray]:
    """Write a small archive in torchvision's layout; point the torchvision class at its checksums."""
    cls = cifar._cifar_class(dataset)
    rng = np.random.default_rng(0)
    build = tmp / "build"
    folder = build / cls.base_folder
    folder.mkdir(parents=True)
    label_key = "labels" if dataset == "cifar10" else "fine_labels"
    classes = catalog.DATASETS[dataset]["num_classes"]
    train_list, first_images = [], None
    for name, _ in cls.train_list:
        images = rng.integers(0, 256, (n_train // len(cls.train_list), 3, 32, 32), dtype=np.uint8)
        first_images = images if first_images is None else first_images
        _pickle_batch(folder, name, images, rng.integers(0, classes, len(images)), label_key)
        train_list.append([name, _md5(folder / name)])
    test_list = []
    for name, _ in cls.test_list:
        images = rng.integers(0, 256, (n_test, 3, 32, 32), dtype=np.uint8)
        _pickle_batch(folder, name, images, rng.integers(0, classes, n_test), label_key)
        test_list.append([name, _md5(folder / name)])
    meta_key = cls.meta["key"]
    (folder / cls.meta["filename"]).write_bytes(pickle.dumps({meta_key: [f"c{i}" for i in range(classes)]}))
    meta = {**cls.meta, "md5": _md5(folder / cls.meta["filename"])}
    served = tmp / "served"
    served.mkdir()
    with tarfile.open(served / cls.filename, "w:gz") as tar:
        tar.add(folder, arcname=cls.base_folder)
    for attr, value in (
        ("train_list", train_list),
        ("test_list", test_list),
        ("meta", meta),
        ("tgz_md5", _md5(served / cls.filename)),
    ):
        monkeypatch.setattr(cls, attr, value)
    return served, first_images


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_cifar_download_over_http_then_load(tmp_path, monkeypatch, serve, dataset):
    served, first_images = make_fake_cifar(tmp_path, dataset, monkeypatch)
    dead = "http://127.0.0.1:9/"  # refused: the next mirror must be tried
    root = tmp_path / "data"
    data.download(dataset, root, [dead, serve(served)], timeout=5, log=lambda *_: None)
    train = data.load(dataset, root, train=True)
    test = data.load(dataset, root, train=False)
    assert train.images.dtype == torch.uint8 and train.images.shape == (20, 3, 32, 32)
    assert len(test) == 10 and test.labels.dtype == torch.int64
    # channel-major pickle rows come back as the same NCHW images
    assert torch.equal(train.images[: len(first_images)], torch.from_numpy(first_images))
    # idempotent: a second call with no reachable mirror succeeds from the verified files
    data.download(dataset, root, [dead], timeout=1, log=lambda *_: None)


def test_cifar_local_folder_mirror_and_corrupt_mirror(tmp_path, monkeypatch):
    served, first_images = make_fake_cifar(tmp_path, "cifar10", monkeypatch)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    name = cifar._cifar_class("cifar10").filename
    (corrupt / name).write_bytes(b"not an archive")
    root = tmp_path / "data"
    cifar.download("cifar10", root, [str(corrupt), str(served)], log=lambda *_: None)
    assert not list(root.glob(".*part")), "temporary files must not stay behind"
    train = data.load("cifar10", root, train=True)
    assert len(train) == 20
    # the good mirror's archive, not a leftover of the corrupt one: its images as written
    assert torch.equal(train.images[: len(first_images)], torch.from_numpy(first_images))


def test_cifar_no_mirror_names_each_failure(tmp_path, monkeypatch):
    make_fake_cifar(tmp_path, "cifar10", monkeypatch)
    with pytest.raises(cifar.DownloadError, match="checksum mismatch|No such file"):
        cifar.download("cifar10", tmp_path / "data", [str(tmp_path / "nowhere")], log=lambda *_: None)


def test_extract_refuses_members_outside_the_folder(tmp_path):
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(cifar.DownloadError, match="outside"):
        cifar.safe_extract(archive, dest)
    assert not (tmp_path / "escaped.txt").exists()


def test_extract_refuses_links(tmp_path):
    archive = tmp_path / "link.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("inside")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(cifar.DownloadError, match="link"):
        cifar.safe_extract(archive, tmp_path)


def test_normalisation_per_channel_and_augmentation_only_on_train(tmp_path, monkeypatch):
    served, _ = make_fake_cifar(tmp_path, "cifar10", monkeypatch)
    root = tmp_path / "data"
    cifar.download("cifar10", root, [str(served)], log=lambda *_: None)
    plain = data.load("cifar10", root, train=True, preprocess={"normalize": "ima"})
    x, _ = plain.batch(torch.arange(4))
    mean, std = cifar.NORMALIZE["ima"]
    expected = (plain.images[:4].float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(
        1, 3, 1, 1
    )
    # two float32 computations of (v / 255 - mean) / std: each at most 4 roundings (divisions and subtraction,
    # or a multiply-add with folded constants) within u of the largest term (1 + mean) / std
    bound = max(2 * 4 * 2.0**-24 * (1 + m) / s for m, s in zip(mean, std))
    assert torch.allclose(x, expected, rtol=0, atol=bound)
    aug = data.load("cifar10", root, train=True, preprocess={"augment": "crop_flip"})
    assert aug.augment
    assert not data.load("cifar10", root, train=False, preprocess={"augment": "crop_flip"}).augment
    static = data.load("cifar10", root, train=True, preprocess={"augment": "crop_flip_static"})
    assert not static.augment and not torch.equal(static.images, plain.images)


def test_random_crop_flip_is_a_shifted_window_of_the_padded_image():
    x = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).reshape(2, 3, 32, 32)
    gen = torch.Generator().manual_seed(3)
    out = cifar.random_crop_flip(x, 4, gen)
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(2):
        hits = [
            (dy, dx, f)
            for dy in range(9)
            for dx in range(9)
            for f in (False, True)
            if torch.equal(out[i], (lambda w: w.flip(-1) if f else w)(padded[i, :, dy : dy + 32, dx : dx + 32]))
        ]
        assert hits, "each output must be a 32x32 window of the padded image, flipped or not"


def test_synthetic_is_seeded_and_matches_the_registry(tmp_path):
    root = synthetic.download("synthetic_1_1", tmp_path / "a", log=lambda *_: None)
    train = data.load("synthetic_1_1", root, train=True)
    test = data.load("synthetic_1_1", root, train=False)
    spec = catalog.DATASETS["synthetic_1_1"]
    assert len(train) == spec["train_size"] and len(test) == spec["test_size"]
    assert train.features.shape[1] == 60 and int(train.labels.max()) < 10
    again = data.load("synthetic_1_1", synthetic.download("synthetic_1_1", tmp_path / "b", log=lambda *_: None), True)
    assert torch.equal(train.features, again.features)
    # power-law sizes: the largest user is much larger than the smallest
    sizes = np.bincount(synthetic.train_groups("synthetic_1_1", root))
    assert len(sizes) == 30 and sizes.max() > 10 * sizes.min()
    x, y = train.batch(torch.arange(5))
    assert x.dtype == torch.float32 and y.dtype == torch.int64


def test_synthetic_alpha_beta_change_the_data():
    a = synthetic.generate_synthetic(1.0, 1.0, 0)
    b = synthetic.generate_synthetic(0.0, 0.0, 0)
    assert not np.array_equal(a[0][1], b[0][1])


def test_natural_partition_gives_each_user_its_samples(tmp_path):
    root = synthetic.download("synthetic_1_1", tmp_path, log=lambda *_: None)
    groups = synthetic.train_groups("synthetic_1_1", root)
    labels = data.train_labels("synthetic_1_1", root)
    parts = partitions.make(labels, {"kind": "natural", "num_clients": 30, "dataset": "synthetic_1_1"}, groups)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))
    assert all((groups[p] == i).all() for i, p in enumerate(parts))
    with pytest.raises(PartitionError):
        partitions.make(labels, {"kind": "natural", "num_clients": 30})


def test_natural_partition_settings_are_checked():
    ok = resolve(
        {
            "dataset": "synthetic_1_1",
            "model": "logreg",
            "num_clients": 30,
            "participation": 0.3,
            "partition": {"kind": "natural"},
        }
    )
    assert ok["partition"] == {"kind": "natural"} and "preprocess" not in identity.identity_setting(ok)
    with pytest.raises(ConfigError, match="dataset_info.natural_clients = 30"):
        resolve({"dataset": "synthetic_1_1", "model": "logreg", "num_clients": 20, "partition": {"kind": "natural"}})
    with pytest.raises(ConfigError, match="natural"):
        resolve({"dataset": "fmnist", "model": "mlp", "partition": {"kind": "natural"}})


# --------------------------------------------------------------------------- the data package's shape


def _every_dataset_class():
    from fedrepro.data.agnews import TextDataset

    labels = torch.arange(6) % 3
    images = torch.zeros(6, 3, 4, 4, dtype=torch.uint8)
    return {
        "TensorDataset": data.TensorDataset(images[:, :1], labels, 0.0, 1.0),
        "ImageDataset": cifar.ImageDataset(images, labels),
        "ImageDataset+augment": cifar.ImageDataset(images, labels, augment=True),
        "FeatureDataset": synthetic.FeatureDataset(torch.zeros(6, 5), labels),
        "TextDataset": TextDataset(torch.zeros(6, 7, dtype=torch.int64), torch.ones(6, 7, dtype=torch.int64), labels),
    }


def test_every_dataset_class_declares_the_capabilities_the_engine_reads():
    """The engine reads ``augment`` and ``batched_cohort`` as attributes (no getattr default): every
    class implements the protocol, keeps the capabilities through subset/to, and says the truth."""
    declared = {}
    for name, ds in _every_dataset_class().items():
        assert isinstance(ds, data.Dataset), name
        for derived in (ds.subset(torch.arange(3)), ds.to("cpu")):
            assert (derived.augment, derived.batched_cohort) == (ds.augment, ds.batched_cohort), name
        declared[name] = (ds.augment, ds.batched_cohort)
    assert declared == {
        "TensorDataset": (False, True),
        "ImageDataset": (False, True),
        "ImageDataset+augment": (True, True),
        "FeatureDataset": (False, True),
        # a (K, B) batch of token sequences cannot be vmapped through the HF model
        "TextDataset": (False, False),
    }


def test_no_dataset_family_imports_the_dispatcher():
    """The families (and base) import base only: the package __init__ imports them, never the reverse."""
    import ast

    folder = Path(data.__file__).parent
    for path in sorted(folder.glob("*.py")):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("fedrepro.data", "fedrepro") and not node.level:
                names = {alias.name for alias in node.names}
                assert node.module != "fedrepro.data" and "data" not in names, f"{path.name} imports the dispatcher"
            if isinstance(node, ast.ImportFrom) and node.level == 1 and not node.module:
                raise AssertionError(f"{path.name} imports the dispatcher (from . import ...)")
