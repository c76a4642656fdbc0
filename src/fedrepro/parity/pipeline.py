"""Does a model see the same numbers in both programs? For every (paper, dataset) the harness has generated files
for (``generated``: CIFAR-10/100 pickles, Fashion-MNIST idx), the authors' code builds its data sets with its own
functions, unchanged (FedLAW's ``datasets.Data``, FedAWARE's ``settings.get_settings``, FedNova's
``util_v4.partition_dataset``, IMA's notebook cell that loads the data, run by a driver), and fedrepro loads the same
files with the preprocessing its params file gives that paper's runs (``preprocess``). Per split, every sample is
compared: the label, and the image tensor the model receives.

* **Without augmentation** both sides compute ``x / 255``, then ``(x - mean) / std`` per channel, in float32, one
  correctly rounded operation each in the same order, so the tensors must be bit for bit equal; the bound is 0.
* **With augmentation** (FedNova's per-batch and FedAWARE's once-at-preprocessing random crop of the 4-padded
  image and horizontal flip), the code draws through torchvision's ``RandomCrop.get_params`` and
  ``RandomHorizontalFlip`` from torch's global generator, fedrepro its own way (``data.cifar.crop_flip_draws``).
  The draws are pinned: the harness records the code's (the crop's offsets, whether it flipped) while the code's
  transform runs, and hands the same to fedrepro's ``crop_flip``, which must then give the same tensor (bound 0).
  The laws are compared apart: both draw each offset uniformly from {0, ..., 8} and flip with probability 1/2
  (counts over ``DRAWS`` draws a side, chi-square test at level 1e-3).
* **Labels**: the same integer for every sample.

What the check cannot see: FedAWARE's code applies its CIFAR-10 transform inside FedLab's ``PartitionedCIFAR10``
(once, when it writes each client's file); FedLab is not installed here, so its partitioned-data classes are
placeholders that keep the arguments the code passes them, and the harness applies the code's transform to the
images as torchvision hands them to FedLab (PIL images). IMA's Digit-Five and PACS, several domains side by side,
are compared by ``pipeline_domains`` on files in their loaders' layouts; AGNews (tokenisation) by ``agnews``, as
a check of its own. A dataset the code has no loader for at all is not comparable, with the reason (``CODE_LACKS``)."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from fedrepro.parity import generated, pipeline_domains
from fedrepro.parity.shim import checkout_on_path

DRAWS = 9000
LAW_LEVEL = 1e-3
# (paper, dataset): why the code's data pipeline cannot be compared with ours for it
CODE_LACKS = {
    ("fednova", "synthetic_1_1"): "the FedNova code has no Synthetic data set: util_v4.partition_dataset reads "
    "CIFAR-10 alone; Fig. 5 is the paper's alone",
}
FEDAWARE_FEDLAB = (
    "fedlab.models.mlp",
    "fedlab.contrib.dataset.pathological_mnist",
    "fedlab.contrib.dataset.partitioned_mnist",
    "fedlab.contrib.dataset.partitioned_cifar10",
    "fedlab.contrib.dataset.basic_dataset",
    "fedlab.utils.dataset.partition",
    "fedlab.utils.dataset.functional",
)


class _Kept:
    """FedLab's partitioned data set, as a placeholder that keeps what the code passes it."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def get_dataset(self, cid, type="train"):
        return ()


def _fedlaw(checkout, root) -> dict:
    out = {}
    with checkout_on_path(checkout):
        import datasets as code

        for name in ("fmnist", "cifar10", "cifar100"):
            args = SimpleNamespace(
                dataset=name, node_num=2, iid=0, random_seed=1, dirichlet_alpha=1.0, dirichlet_alpha2=None
            )
            args.longtail_clients = "none"
            data = code.Data(args)
            out[name] = {"train": data.train_set, "test": data.test_set}
    return out


def _fedaware(checkout, root) -> dict:
    import torchvision.datasets as tvd

    out = {}
    with checkout_on_path(checkout, stubs=FEDAWARE_FEDLAB + ("transformers", "datasets")):
        import settings as code

        for name in ("PartitionedCIFAR10", "PartitionedCIFAR100", "PartitionedFMNIST", "CIFAR100Partitioner"):
            setattr(code, name, _Kept)  # the module's global, not its file: FedLab is absent here
        code.MLP = lambda *a, **k: None
        for name, cls in (("cifar10", tvd.CIFAR10), ("cifar100", tvd.CIFAR100)):
            args = SimpleNamespace(dataset=name, partition="dirichlet", dir=0.1, num_clients=2, dseed=0, seed=0)
            args.preprocess = True
            with np.errstate(invalid="ignore", divide="ignore"):  # its client weights, over placeholder sizes
                _, partitioned, _, test_loader = code.get_settings(args)[:4]
            raw = cls(str(root), train=True)  # what FedLab's preprocess hands the transform: PIL images
            raw.transform = partitioned.kwargs["transform"]
            out[name] = {"train": raw, "test": test_loader.dataset}
    return out


def _fednova(checkout, root) -> dict:
    with checkout_on_path(checkout, stubs=("mpi4py",), placeholders={"models": ["LogisticRegression"]}):
        import util_v4

        args = SimpleNamespace(datapath=str(root), NIID=False, alpha=0.1, bs=8)
        train_loader, test_loader, _ = util_v4.partition_dataset(0, 2, args)
    return {"cifar10": {"train": train_loader.dataset.data, "test": test_loader.dataset}}


def notebook_cell(path: Path, marker: str) -> str:
    """The source of the first code cell of a notebook that contains ``marker``."""
    cells = json.loads(Path(path).read_text())["cells"]
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and marker in source:
            return source
    raise ValueError(f"{path}: no code cell contains {marker!r}")


def _ima(checkout, root) -> dict:
    import torchvision
    from torchvision import transforms
    from torchvision.datasets import FashionMNIST

    cell = notebook_cell(Path(checkout) / "main_mnist_fmnist_cifar_label_skew_test_allmethods_ima.ipynb", "trans_mnist")
    out = {}
    with checkout_on_path(checkout):
        from args import args_parser

        for name in ("fmnist", "cifar10", "cifar100"):
            args = args_parser()  # its defaults (parse_args(args=[])); a user of the notebook sets args.dataset
            args.dataset = name
            scope = {"args": args, "transforms": transforms, "torchvision": torchvision, "FashionMNIST": FashionMNIST}
            exec(compile(cell, "notebook cell: the data", "exec"), scope)  # the notebook's own cell, unchanged
            out[name] = {"train": scope["trainset"], "test": scope["testset"]}
    return out


CODES = {"fedlaw": _fedlaw, "fedaware": _fedaware, "fednova": _fednova, "ima": _ima}


@contextlib.contextmanager
def _recorded_draws():
    """torchvision's crop offsets and flips, as the code's transforms draw them."""
    from torchvision import transforms
    from torchvision.transforms import functional

    draws = []
    get_params, hflip = transforms.RandomCrop.get_params, functional.hflip

    def recorded_params(img, output_size):
        i, j, h, w = get_params(img, output_size)
        draws.append({"dy": i, "dx": j, "flip": False})
        return i, j, h, w

    def recorded_flip(img):
        draws[-1]["flip"] = True
        return hflip(img)

    transforms.RandomCrop.get_params = staticmethod(recorded_params)
    functional.hflip = recorded_flip
    try:
        yield draws
    finally:
        transforms.RandomCrop.get_params = staticmethod(get_params)
        functional.hflip = hflip


def our_preprocess(paper: str) -> dict:
    """The preprocessing fedrepro's params file gives each dataset of the paper's runs (one per dataset)."""
    from fedrepro.configure import expansion, paramsfile
    from fedrepro.configure.paramsfile import ROOT

    runs = expansion.expand(paramsfile.load_params_files([str(ROOT / "params" / f"{paper}.yaml")]))
    found: dict[str, list] = {}
    for run in runs:
        pre = run.setting.get("preprocess") or {}
        if pre not in found.setdefault(run.setting["dataset"], []):
            found[run.setting["dataset"]].append(pre)
    return found


def _compare_split(code_set, ours, augment: bool) -> dict:
    gap, labels_differ, draws_seen = 0.0, 0, 0
    for i in range(len(ours)):
        with _recorded_draws() as draws:
            x_code, y_code = code_set[i]
        index = torch.tensor([i])
        if augment:
            from fedrepro.data.cifar import crop_flip

            (d,) = draws
            picked = crop_flip(ours.images[index], torch.tensor([d["dy"]]), torch.tensor([d["dx"]]),
                               torch.tensor([d["flip"]]), ours.pad)  # fmt: skip
            x_ours, y_ours = ours._normalised(picked)[0], ours.labels[i]
            draws_seen += 1
        else:
            x, y = ours.batch(index)
            x_ours, y_ours = x[0], y[0]
        gap = max(gap, float((torch.as_tensor(x_code).reshape(x_ours.shape) - x_ours).abs().max()))
        labels_differ += int(int(y_code) != int(y_ours))
    return {"samples": len(ours), "max_gap": gap, "labels_differing": labels_differ, "pinned_draws": draws_seen}


def draw_laws(n: int = DRAWS) -> dict:
    """Offsets and flips drawn n times by torchvision's transforms and by fedrepro, with a chi-square test of each
    against the uniform law both are meant to draw from."""
    from PIL import Image
    from scipy.stats import chisquare
    from torchvision import transforms

    from fedrepro.data.cifar import crop_flip_draws

    pipeline = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip()])
    image = Image.fromarray(np.zeros((32, 32, 3), np.uint8))
    torch.manual_seed(0)
    with _recorded_draws() as draws:
        for _ in range(n):
            pipeline(image)
    code = {k: np.array([d[k] for d in draws], dtype=np.int64) for k in ("dy", "dx", "flip")}
    dy, dx, flip = crop_flip_draws(n, 4, "cpu", torch.Generator().manual_seed(0))
    ours = {"dy": dy.numpy(), "dx": dx.numpy(), "flip": flip.numpy().astype(np.int64)}
    result = {}
    for side, values in (("code", code), ("fedrepro", ours)):
        for key, bins in (("dy", 9), ("dx", 9), ("flip", 2)):
            counts = np.bincount(values[key], minlength=bins)
            result[f"{side}_{key}"] = {
                "counts": counts.tolist(),
                "p_value": float(chisquare(counts).pvalue) if len(counts) == bins else 0.0,
            }
    result["equal"] = all(r["p_value"] > LAW_LEVEL for r in result.values())
    return result


def compare(paper: str, checkout) -> list[dict]:
    """One row per (dataset, preprocessing) of the paper that has generated files, one per multi-domain dataset
    (IMA's), and one per dataset without."""
    from fedrepro import data

    wanted = our_preprocess(paper)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedrepro-parity-data-") as tmp:
        sums = generated.write(tmp)
        with generated.on_generated(tmp, sums):
            code = CODES[paper](checkout, tmp)
            domains = {}
            if paper == "ima":  # several domains side by side, in the layouts IMA's own loaders read
                domains = {r["dataset"]: r for r in pipeline_domains.compare_ima(checkout, wanted)}
            for dataset, variants in wanted.items():
                if dataset in domains:
                    rows.append(domains[dataset])
                    continue
                if (paper, dataset) in CODE_LACKS:
                    rows.append({"dataset": dataset, "status": "not comparable", "why": CODE_LACKS[paper, dataset]})
                    continue
                if dataset not in generated.CLASSES:
                    rows.append({"dataset": dataset, "status": "not compared", "why": "no generated files yet"})
                    continue
                for pre in variants:
                    row = {"dataset": dataset, "preprocess": pre}
                    augment = pre.get("augment", "none") != "none"
                    for split in ("train", "test"):
                        # augmented: fedrepro's images before its own draws, then the code's draws (pinned)
                        plain = {**pre, "augment": "none"} if augment else pre
                        ours = data.load(dataset, tmp, train=split == "train", preprocess=plain)
                        row[split] = _compare_split(code[dataset][split], ours, augment and split == "train")
                    exact = all(row[s]["max_gap"] == 0.0 and not row[s]["labels_differing"] for s in ("train", "test"))
                    row["status"] = "equal" if exact else "differs"
                    rows.append(row)
    if any(r.get("train", {}).get("pinned_draws") for r in rows):
        rows.append({"dataset": "*", "check": "crop and flip laws", **draw_laws()})
        rows[-1]["status"] = "equal" if rows[-1].pop("equal") else "differs"
    return rows
