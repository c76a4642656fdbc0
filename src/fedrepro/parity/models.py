"""Is fedrepro's model the authors' model? For each (dataset, model) pair of the four papers' tables: equal
parameter counts, logits equal in eval and train mode with the weights copied each way (dropout masks pinned by
one seed before both forwards), and the same initialisation distribution per layer.

Logits are compared in float64 (both models cast after the copy): the same function then agrees to ~1e-15
relative, while another function differs at the logits' own scale, so the bound, 1e-9 of the largest logit, is no
reading of this machine's float32 rounding. Initialisation: over ``inits`` fresh draws of each program, per
parameter tensor the pooled mean and standard deviation of its entries; with n entries a side the sample std of
a normal or uniform law has a relative standard error of at most sqrt(1/(2n)), the mean one of s/sqrt(n); a layer
differs when either gap exceeds Z = 5 standard errors (two-sided, normal approximation; 5 sigma keeps the
family-wise false alarm over a few hundred tensors below 1e-4). Constant tensors (norm weights 1, biases 0) must
be equal constants."""

from __future__ import annotations

import copy as copy_module
import importlib
import math
from types import SimpleNamespace

import torch

from fedrepro import catalog, models
from fedrepro.flat import learnt_buffers
from fedrepro.parity.shim import checkout_on_path

Z = 5.0
RELATIVE = 1e-9

# paper -> rows (dataset, our model, the code's module, its builder, arguments) or (dataset, our model, reason)
_IMA = lambda name: ("model", "Client_Model", ("args", name))  # noqa: E731  IMA's one class, picked by name
PAIRS = {
    "fedaware": [
        ("cifar10", "cnn_fedaware", "model", "ToyCifarNet", ()),
        ("cifar100", "resnet18_gn32", "model", "ResNet18_gn", ()),
        ("cifar100", "resnet18_gn32_code", "model", "ResNet18_gn", ()),
        (
            "agnews",
            "pythia70m",
            "both programs load EleutherAI/pythia-70m through transformers; no checkpoint "
            "is on this machine, and neither program defines the network",
        ),
    ],
    "fedlaw": [
        ("fmnist", "mlp", "models_dict.cnn", "MLP", ()),
        ("fmnist", "lenet5", "models_dict.cnn", "LeNet5", ()),
        ("cifar10", "simplecnn", "models_dict.cnn", "CNNCifar10", ()),
        ("cifar100", "simplecnn", "models_dict.cnn", "CNNCifar100", ()),
        ("cifar10", "resnet20", "models_dict.resnet", "ResNet20", (10,)),
        ("cifar100", "resnet20", "models_dict.resnet", "ResNet20", (100,)),
        ("cifar10", "resnet56", "models_dict.resnet", "ResNet56", (10,)),
        ("cifar10", "resnet110", "models_dict.resnet", "ResNet110", (10,)),
        ("cifar10", "wrn56_4", "models_dict.resnet", "WRN56_4", (10,)),
        ("cifar10", "densenet121", "models_dict.densenet", "DenseNet121", (10,)),
        ("cifar10", "alexnet", "the code defines no AlexNet (utils.init_model); the paper names it only"),
        ("cifar10", "resnet8", "the code defines no ResNet-8 (utils.init_model); the paper names it only"),
    ],
    "ima": [
        ("fmnist", "cnn", *_IMA("fmnist")),
        ("cifar10", "cnn", *_IMA("cifar10")),
        ("cifar10", "resnet18_gn2", *_IMA("resnet18")),
        ("cifar100", "resnet18_gn2", *_IMA("resnet18")),
        ("cifar100", "vgg11_gn2", *_IMA("vgg11_gn")),
        ("digit5", "digit_cnn_gn2", *_IMA("mixed_digit_gn")),
        ("pacs", "alexnet_gn32", *_IMA("alexnet_gn")),
    ],
    "fednova": [
        ("cifar10", "vgg11", "models", "vgg11", ()),
        (
            "synthetic_1_1",
            "logreg",
            "the code has no Synthetic data set nor logistic regression (util_v4.select_model: "
            "VGG only); Fig. 5 is the paper's alone",
        ),
    ],
}


def code_builder(checkout, dataset: str, module: str, name: str, args: tuple):
    """A function that builds a fresh code model (imported once, unchanged, from the checkout)."""
    with checkout_on_path(checkout):
        builder = getattr(importlib.import_module(module), name)
    if args[:1] == ("args",):  # IMA's Client_Model(args, name): the argument fields its models read
        spec = catalog.DATASETS[dataset]
        ns = SimpleNamespace(dims_feature=128, num_classes=spec["num_classes"])
        return lambda: builder(ns, args[1])
    return lambda: builder(*args)


def _logits(out):
    return out[-1] if isinstance(out, tuple) else out  # IMA's models return (features, logits)


def execution_order(model: torch.nn.Module, x: torch.Tensor) -> list[str]:
    """Names of the modules that hold tensors, in the order one forward pass first calls them: the order in
    which two programs agree even when one declares its layers in another order (IMA's digit CNN declares its
    three convs before its three GroupNorms)."""
    order, handles = [], []
    for name, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False)):
            handles.append(
                module.register_forward_pre_hook(
                    lambda m, args, name=name: order.append(name) if name not in order else None
                )
            )
    try:
        with torch.no_grad():
            model.eval()(x)
    finally:
        for h in handles:
            h.remove()
    return order


def _ordered(model: torch.nn.Module, kind: str, order: list[str]) -> list[tuple[str, torch.Tensor]]:
    modules = dict(model.named_modules())
    rank = {name: i for i, name in enumerate(order)}
    out = []
    for name in sorted(modules, key=lambda n: rank.get(n, len(rank))):
        for leaf, t in getattr(modules[name], f"named_{kind}")(recurse=False):
            if t is not None and t.is_floating_point():
                out.append((f"{name}.{leaf}" if name else leaf, t))
    return out


def match(src: torch.nn.Module, dst: torch.nn.Module, x: torch.Tensor) -> list[tuple[str, str]]:
    """Pairs (src name, dst name) of parameters and learnt buffers, both sides in the order a forward pass on
    ``x`` uses them (``execution_order``), each taking the first unused tensor of the same shape on the other
    side; a shape with no partner leaves the pair list short, and the comparison says so."""
    pairs = []
    src_order, dst_order = (
        execution_order(src, x.to(next(src.parameters()).dtype)),
        execution_order(dst, x.to(next(dst.parameters()).dtype)),
    )
    for kind in ("parameters", "buffers"):
        a, b = _ordered(src, kind, src_order), _ordered(dst, kind, dst_order)
        used = set()
        for name, t in a:
            j = next((j for j, (_, u) in enumerate(b) if j not in used and u.shape == t.shape), None)
            if j is not None:
                used.add(j)
                pairs.append((name, b[j][0]))
    return pairs


def copy(src: torch.nn.Module, dst: torch.nn.Module, pairs) -> None:
    tensors = {**dict(src.named_parameters()), **dict(src.named_buffers())}
    targets = {**dict(dst.named_parameters()), **dict(dst.named_buffers())}
    with torch.no_grad():
        for a, b in pairs:
            targets[b].copy_(tensors[a])


def _gap(a: torch.nn.Module, b: torch.nn.Module, x: torch.Tensor, train: bool) -> float:
    """On copies: a train-mode pass moves BatchNorm's running statistics, which the next comparison reads."""
    a, b = copy_module.deepcopy(a).train(train), copy_module.deepcopy(b).train(train)
    with torch.no_grad():
        torch.manual_seed(7)
        ya = _logits(a(x))
        torch.manual_seed(7)
        yb = _logits(b(x))
    return float((ya - yb).abs().max() / ya.abs().max().clamp_min(1e-30))


def same_function(code, ours, dataset: str, batch: int = 8) -> dict:
    """Weights copied code -> ours and ours -> code; relative max logit gap in eval and train mode, float64."""
    spec = catalog.DATASETS[dataset]
    x = torch.randn(batch, *spec["shape"], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out = {
        "params_code": models.num_parameters(code),
        "params_ours": models.num_parameters(ours),
        "buffers_code": len(learnt_buffers(code)),
        "buffers_ours": len(learnt_buffers(ours)),
    }
    for direction, (src, dst) in {"code_to_ours": (code, ours), "ours_to_code": (ours, code)}.items():
        pairs = match(src, dst, x[:2])
        # every parameter must find its partner; a buffer without one keeps its initial value (FedAWARE's code's
        # server BatchNorm statistics stay at 0 and 1, which resnet18_gn32_code holds as constants)
        out[f"matched_{direction}"] = len(dict(src.named_parameters()).keys() & {a for a, _ in pairs}) == len(
            list(src.parameters())
        )
        copy(src, dst, pairs)
        code64, ours64 = code.double(), ours.double()
        out[f"eval_gap_{direction}"] = _gap(code64, ours64, x, False)
        out[f"train_gap_{direction}"] = _gap(code64, ours64, x, True)
        code.float(), ours.float()
    gaps = [v for k, v in out.items() if k.startswith(("eval_gap", "train_gap"))]
    out["equal"] = (
        out["params_code"] == out["params_ours"]
        and all(out[k] for k in out if k.startswith("matched"))
        and all(g <= RELATIVE for g in gaps)
    )
    return out


def _pooled(build, inits: int, seed: int) -> list[tuple[str, int, float, float, bool]]:
    """Per floating-point parameter: (name, entries, mean, std, constant) over ``inits`` fresh models."""
    draws = []
    for i in range(inits):
        torch.manual_seed(seed + i)
        draws.append([(n, p.detach().double().flatten()) for n, p in build().named_parameters()])
    out = []
    for j, (name, _) in enumerate(draws[0]):
        values = torch.cat([d[j][1] for d in draws])
        out.append(
            (
                name,
                values.numel(),
                float(values.mean()),
                float(values.std()) if values.numel() > 1 else 0.0,
                bool((values == values[0]).all()),
            )
        )
    return out


def same_init(build_code, build_ours, inits: int, dataset: str) -> dict:
    """The per-layer test of the module doc; layers paired by use and shape (``match``)."""
    code, ours = build_code(), build_ours()
    x = torch.randn(2, *catalog.DATASETS[dataset]["shape"], generator=torch.Generator().manual_seed(0))
    pairs = [(a, b) for a, b in match(code, ours, x) if a in dict(code.named_parameters())]
    stats_code = {n: s for n, *s in _pooled(build_code, inits, 1000)}
    stats_ours = {n: s for n, *s in _pooled(build_ours, inits, 2000)}
    differing = []
    for a, b in pairs:
        (na, ma, sa, ca), (nb, mb, sb, cb) = stats_code[a], stats_ours[b]
        if ca or cb:
            ok = ca and cb and ma == mb
        else:
            se_std = math.sqrt(1 / (2 * na) + 1 / (2 * nb))
            se_mean = math.sqrt(sa**2 / na + sb**2 / nb)
            ok = abs(sa / sb - 1) <= Z * se_std and abs(ma - mb) <= Z * se_mean
        if not ok:
            differing.append({"code": a, "ours": b, "std_code": sa, "std_ours": sb, "mean_code": ma, "mean_ours": mb})
    return {"inits": inits, "layers": len(pairs), "differing_layers": differing, "equal": not differing}


def compare(paper: str, checkout, inits: int = 4, only: tuple[str, ...] = ()) -> list[dict]:
    """One record row per (dataset, model) pair of the paper (``only``: these models)."""
    rows = []
    for row in PAIRS[paper]:
        dataset, ours_name = row[0], row[1]
        if only and ours_name not in only:
            continue
        if len(row) == 3:
            rows.append({"dataset": dataset, "model": ours_name, "status": "not comparable", "why": row[2]})
            continue
        build_code = code_builder(checkout, dataset, *row[2:])
        build_ours = lambda: models.build(ours_name, dataset)  # noqa: E731
        torch.manual_seed(0)
        result = {
            "dataset": dataset,
            "model": ours_name,
            "code": f"{row[2]}.{row[3]}{row[4] if row[4] else ''}",
            "function": same_function(build_code(), build_ours(), dataset),
            "init": same_init(build_code, build_ours, inits, dataset),
        }
        result["status"] = "equal" if result["function"]["equal"] and result["init"]["equal"] else "differs"
        rows.append(result)
    return rows
