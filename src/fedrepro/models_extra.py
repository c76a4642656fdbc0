"""The CIFAR and Synthetic models of the four papers, with the layers their specs give.

Sources (see /work/shared/specs): FedAWARE 4.2, IMA 4.2 (Table 4), FedLAW 4.3, FedNova 4.2.

Normalisation layers: GroupNorm has no buffers. FedLAW's CIFAR ResNet-8/20/56 use BatchNorm, by
default with running statistics as the papers' code keeps them (the flat engine carries them in
``FlatModel.buffers`` and averages them over the cohort; eval mode normalises with them). The setting
``batchnorm: batch_stats`` builds them *without running statistics* (``track_running_stats=False``):
every forward pass, evaluation included, normalises with the statistics of its own batch (evaluation
batches hold 4096 test images), as this project did before the engine carried buffers.
"""
from __future__ import annotations

import math

from torch import nn


class CifarCNN(nn.Module):
    """Three 3x3 convs without padding (32-64-64, max-pool after the first two), FC 1024-64-classes.

    The same layers are FedAWARE's CIFAR-10 "5-layer CNN" (code: ToyCifarNet; 122,570 parameters,
    Kaiming-normal fan-out conv init, N(0, 0.01) linear init, zero biases) and FedLAW's SimpleCNN
    (PyTorch default init); ``init`` picks the paper's initialisation.
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, init: str = "default"):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3), nn.ReLU())
        self.classifier = nn.Sequential(nn.Linear(64 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, num_classes))
        if init == "fedaware":
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                    nn.init.zeros_(m.bias)
                elif isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, 0, 0.01)
                    nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


# --------------------------------------------------------------------------- ResNet-18 (CIFAR stem)


def _norm(kind: str, channels: int, groups: int) -> nn.Module:
    """gn: GroupNorm(groups); bn: BatchNorm with running statistics; bn_batch: batch statistics only."""
    if kind == "gn":
        return nn.GroupNorm(groups, channels)
    return nn.BatchNorm2d(channels, track_running_stats=kind == "bn")


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int, norm: str, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.n1 = _norm(norm, planes, groups)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.n2 = _norm(norm, planes, groups)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False),
                                          _norm(norm, planes, groups))

    def forward(self, x):
        out = self.n1(self.conv1(x)).relu()
        out = self.n2(self.conv2(out))
        return (out + self.shortcut(x)).relu()


class ResNet18GN(nn.Module):
    """CIFAR ResNet-18 (3x3 stem, stride 1, no max-pool; blocks [2,2,2,2] of 64/128/256/512) with
    GroupNorm everywhere, the shortcut included.

    FedAWARE: 32 groups, avg-pool then Linear(512, classes): 11,220,132 parameters for CIFAR-100.
    IMA: 2 groups and a 512->128 linear projector before the classifier (``projector=128``); the
    specs say "linear projector", so no activation sits between projector and classifier.
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, groups: int = 32, projector: int = 0):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), nn.GroupNorm(groups, 64), nn.ReLU())
        layers, in_planes = [], 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            for s in (stride, 1):
                layers.append(BasicBlock(in_planes, planes, s, "gn", groups))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        head = [nn.Linear(512, projector), nn.Linear(projector, num_classes)] if projector else [nn.Linear(512, num_classes)]
        self.head = nn.Sequential(*head)

    def forward(self, x):
        out = self.layers(self.stem(x))
        return self.head(nn.functional.adaptive_avg_pool2d(out, 1).flatten(1))


# --------------------------------------------------------------------------- VGG-11


VGG11_CFG = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]


def _vgg_features(in_channels: int, groups: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    c = in_channels
    for v in VGG11_CFG:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
            continue
        layers.append(nn.Conv2d(c, v, 3, padding=1))
        if groups:
            layers.append(nn.GroupNorm(groups, v))
        layers.append(nn.ReLU())
        c = v
    return nn.Sequential(*layers)


class VGG11(nn.Module):
    """FedNova's VGG-11 (configuration 'A', no normalisation): the 8 convs, then Dropout-FC(512,512)-
    ReLU-Dropout-FC(512,512)-ReLU-FC(512,classes); 9,750,922 parameters for CIFAR-10. Conv weights
    N(0, sqrt(2/n)) with n = k*k*out_channels, zero bias (the official code's init)."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10):
        super().__init__()
        self.features = _vgg_features(in_channels, 0)
        self.classifier = nn.Sequential(nn.Dropout(), nn.Linear(512, 512), nn.ReLU(), nn.Dropout(),
                                        nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0, math.sqrt(2.0 / n))
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


class VGG11GN(nn.Module):
    """IMA's VGG-11: every conv followed by GroupNorm(2) and ReLU, then a 512->128 linear projector
    and the classifier (Table 4: "VGG11.FC(512,128)", "FC(128,classes)")."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10, groups: int = 2):
        super().__init__()
        self.features = _vgg_features(in_channels, groups)
        self.head = nn.Sequential(nn.Linear(512, 128), nn.Linear(128, num_classes))

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


# --------------------------------------------------------------------------- CIFAR ResNet-20/56


class CifarResNet(nn.Module):
    """FedLAW's CIFAR ResNet (Li et al. 2018 landscape models): 3x3 stem conv 16, three stages of
    (depth-2)/6 BasicBlocks with 16/32/64 channels, 1x1 conv + norm shortcut when the shape changes,
    global average pool, Linear(64, classes). BatchNorm with running statistics, or on batch statistics
    only when ``running_stats`` is False (module doc)."""

    def __init__(self, depth: int, in_channels: int = 3, num_classes: int = 10, running_stats: bool = True):
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
        n = (depth - 2) // 6
        bn = "bn" if running_stats else "bn_batch"
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False), _norm(bn, 16, 0), nn.ReLU())
        layers, in_planes = [], 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                layers.append(BasicBlock(in_planes, planes, stride if i == 0 else 1, bn, 0))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        out = self.layers(self.stem(x))
        return self.fc(nn.functional.adaptive_avg_pool2d(out, 1).flatten(1))


# --------------------------------------------------------------------------- FedLAW's AlexNet


class CifarAlexNet(nn.Module):
    """FedLAW's AlexNet (Tables 1, 9; Fig. 1), which neither the paper nor its code defines. We take the
    CIFAR AlexNet common in CIFAR code (e.g. the pytorch-classification repository): torchvision's five
    conv layers 64-192-384-256-256 (11x11 stride 4 pad 5, 5x5 pad 2, then 3x3 pad 1) with a 2x2 max-pool
    after conv1, conv2 and conv5, so a 32x32 image ends as 256 x 1 x 1, and one Linear(256, classes).
    No normalisation layer and no dropout: nothing for the flat engine to carry and nothing random
    at evaluation. 2,472,266 parameters for CIFAR-10.
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 64, 11, stride=4, padding=5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Linear(256, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


class LogisticRegression(nn.Module):
    """Multinomial logistic regression (FedNova's Synthetic model): one Linear layer, softmax CE."""

    def __init__(self, in_features: int = 60, num_classes: int = 10):
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x):
        return self.linear(x.flatten(1))


BUILDERS = {
    "cnn_fedaware": lambda c, k: CifarCNN(c, k, init="fedaware"),
    "simplecnn": lambda c, k: CifarCNN(c, k),
    "resnet18_gn32": lambda c, k: ResNet18GN(c, k, groups=32),
    "resnet18_gn2": lambda c, k: ResNet18GN(c, k, groups=2, projector=128),
    "vgg11": lambda c, k: VGG11(c, k),
    "vgg11_gn2": lambda c, k: VGG11GN(c, k, groups=2),
    "resnet20": lambda c, k, running_stats=True: CifarResNet(20, c, k, running_stats),
    "resnet56": lambda c, k, running_stats=True: CifarResNet(56, c, k, running_stats),
    # FedLAW Tables 1, 9: not defined by the paper or its code (our choices, see the classes' docs)
    "resnet8": lambda c, k, running_stats=True: CifarResNet(8, c, k, running_stats),
    "alexnet": lambda c, k: CifarAlexNet(c, k),
    "logreg": None,  # built from the feature dimension, below
}


def build(name: str, dataset: str, batchnorm: str = "running_stats") -> nn.Module:
    """``batchnorm`` (running_stats | batch_stats) is read by the models catalog.MODELS marks batchnorm."""
    from fedrepro.catalog import DATASETS, MODELS
    shape, classes = DATASETS[dataset]["shape"], DATASETS[dataset]["num_classes"]
    if name == "logreg":
        return LogisticRegression(math.prod(shape), classes)
    if name not in BUILDERS:
        raise ValueError(f"unknown model '{name}'")
    if MODELS[name].get("batchnorm"):
        if batchnorm not in ("running_stats", "batch_stats"):
            raise ValueError(f"batchnorm = {batchnorm!r}; allowed: running_stats, batch_stats")
        return BUILDERS[name](shape[0], classes, running_stats=batchnorm == "running_stats")
    return BUILDERS[name](shape[0], classes)
