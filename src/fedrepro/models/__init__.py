"""Models by name, with the exact layers of the papers' code (see docs/algorithms.md for sources).

One module per family: mlp (MLP, logistic regression), cnn (the small CNNs), resnet, vgg, alexnet,
pythia (the pretrained text classifier); ``build`` names them.
"""
from __future__ import annotations

import math

from torch import nn

from fedrepro.models.alexnet import AlexNetGN, CifarAlexNet
from fedrepro.models.cnn import CifarCNN, DigitCNNGN, LeNet5, TwoConvCNN
from fedrepro.models.mlp import MLP, LogisticRegression
from fedrepro.models.resnet import CifarResNet, ResNet18GN, densenet121_cifar
from fedrepro.models.vgg import VGG11, VGG11GN

def _pythia70m(shape, k, pretrained):
    from fedrepro.models import pythia  # loads transformers' model code: only when asked for
    return pythia.pythia70m(k, pretrained)


# name -> builder(shape (channels, height, width) or (features,), number of classes, options): models
# catalog.MODELS marks ``batchnorm`` take ``running_stats``, those it marks ``pretrained`` take ``pretrained``
BUILDERS = {
    "mlp": lambda shape, k: MLP(math.prod(shape), k),
    "logreg": lambda shape, k: LogisticRegression(math.prod(shape), k),
    "lenet5": lambda shape, k: LeNet5(shape[0], k),
    "cnn": lambda shape, k: TwoConvCNN(shape[0], 32 if shape[0] == 1 else 64, shape[1], k),
    "cnn_fedaware": lambda shape, k: CifarCNN(shape[0], k, init="fedaware"),
    "simplecnn": lambda shape, k: CifarCNN(shape[0], k),
    "resnet18_gn32": lambda shape, k: ResNet18GN(shape[0], k, groups=32),
    "resnet18_gn2": lambda shape, k: ResNet18GN(shape[0], k, groups=2, projector=128),
    "vgg11": lambda shape, k: VGG11(shape[0], k),
    "vgg11_gn2": lambda shape, k: VGG11GN(shape[0], k, groups=2),
    "resnet20": lambda shape, k, running_stats: CifarResNet(20, shape[0], k, running_stats),
    "resnet56": lambda shape, k, running_stats: CifarResNet(56, shape[0], k, running_stats),
    # FedLAW Table 5 (Li et al. 2018's models, models/resnet.py)
    "resnet110": lambda shape, k, running_stats: CifarResNet(110, shape[0], k, running_stats),
    "wrn56_4": lambda shape, k, running_stats: CifarResNet(56, shape[0], k, running_stats, width=4),
    "densenet121": lambda shape, k, running_stats: densenet121_cifar(shape[0], k, running_stats),
    # FedLAW Tables 1, 9: not defined by the paper or its code (our choices, see the classes' docs)
    "resnet8": lambda shape, k, running_stats: CifarResNet(8, shape[0], k, running_stats),
    "alexnet": lambda shape, k: CifarAlexNet(shape[0], k),
    # IMA Table 1's feature-skew rows (Digit-Five, PACS), as its code builds them
    "digit_cnn_gn2": lambda shape, k: DigitCNNGN(shape[0], k, groups=2),
    "alexnet_gn32": lambda shape, k: AlexNetGN(shape[0], k, groups=32),
    "pythia70m": _pythia70m,
}


def build(name: str, dataset: str, pretrained: dict | None = None, batchnorm: str = "running_stats") -> nn.Module:
    """``pretrained`` (the setting's section: weights path) is read by pretrained models only,
    ``batchnorm`` (running_stats | batch_stats) by models with BatchNorm only."""
    from fedrepro.catalog import DATASETS, MODELS
    if name not in BUILDERS:
        raise ValueError(f"unknown model '{name}'")
    options = {}
    if MODELS[name].get("batchnorm"):
        if batchnorm not in ("running_stats", "batch_stats"):
            raise ValueError(f"batchnorm = {batchnorm!r}; allowed: running_stats, batch_stats")
        options["running_stats"] = batchnorm == "running_stats"
    if MODELS[name].get("pretrained"):
        options["pretrained"] = pretrained
    return BUILDERS[name](DATASETS[dataset]["shape"], DATASETS[dataset]["num_classes"], **options)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
