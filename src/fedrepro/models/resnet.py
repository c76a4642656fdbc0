"""The ResNets of the papers: CIFAR ResNet-18 with GroupNorm (FedAWARE, IMA) and FedLAW's CIFAR
ResNet-8/20/56/110, WRN-56-4 and DenseNet-121 with BatchNorm.

FedLAW (4.3) "followed the model architectures used in (Li et al., 2018)", i.e. the models of
"Visualizing the Loss Landscape of Neural Nets" (github.com/tomgoldstein/loss-landscape,
cifar10/models/resnet.py and densenet.py): He et al.'s CIFAR ResNet-(6n+2) with 1x1 conv + BN (option B)
shortcuts, its k-times wider WRN-56-k, and the CIFAR DenseNet-BC-121 of kuangliu/pytorch-cifar.

Sources (the project's notes on the papers): FedAWARE 4.2, IMA 4.2 (Table 4), FedLAW 4.3.

Normalisation layers: GroupNorm has no buffers. FedLAW's CIFAR ResNet-8/20/56 use BatchNorm, by
default with running statistics as the papers' code keeps them (the flat engine carries them in
``FlatModel.buffers`` and averages them over the cohort; eval mode normalises with them). The setting
``batchnorm: batch_stats`` builds them *without running statistics* (``track_running_stats=False``):
every forward pass, evaluation included, normalises with the statistics of its own batch (evaluation
batches hold 4096 test images), as this project did before the engine carried buffers.
"""

from __future__ import annotations

import torch
from torch import nn

# --------------------------------------------------------------------------- ResNet-18 (CIFAR stem)


def _norm(kind: str, channels: int, groups: int) -> nn.Module:
    """gn: GroupNorm(groups); bn: BatchNorm with running statistics; bn_batch: batch statistics only;
    bn_init_stats: BatchNorm that trains on batch statistics and evaluates with its initial ones (FrozenStatsNorm)."""
    if kind == "gn":
        return nn.GroupNorm(groups, channels)
    if kind == "bn_init_stats":
        return FrozenStatsNorm(channels)
    return nn.BatchNorm2d(channels, track_running_stats=kind == "bn")


class FrozenStatsNorm(nn.Module):
    """BatchNorm2d as a server that never receives running statistics evaluates it: training normalises with
    the batch's statistics, evaluation with the initial running mean 0 and variance 1, i.e. x / sqrt(1 + eps)
    times the weight plus the bias.

    FedAWARE's code builds its CIFAR-100 ResNet18_gn with BatchNorm blocks (model.py defines BasicBlock twice,
    the later BatchNorm one wins) and FedLab sends parameters only, so the server model's running statistics
    stay at 0 and 1 for the whole run and every test accuracy is taken with them. The module keeps them as
    constants made in the forward pass (no buffers, so nothing is averaged or carried) and calls the same
    ``batch_norm`` kernel BatchNorm2d calls, with BatchNorm2d's parameter names."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x):
        if self.training:
            return nn.functional.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)
        mean, var = self.weight.new_zeros(self.weight.shape), self.weight.new_ones(self.weight.shape)
        return nn.functional.batch_norm(x, mean, var, self.weight, self.bias, False, 0.0, self.eps)


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int, norm: str, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.n1 = _norm(norm, planes, groups)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.n2 = _norm(norm, planes, groups)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride, bias=False), _norm(norm, planes, groups)
            )

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

    ``conv_init``: "default" leaves PyTorch's initialisation; "kaiming_fan_out" draws every convolution from
    kaiming_normal_(mode="fan_out", nonlinearity="relu") as IMA's code (resnetcifar.py) does, the paper being
    silent (its norm layers' 1 and 0 are PyTorch's default already). ``block_norm``: "gn", or "bn_init_stats"
    for FedAWARE's code's network (GroupNorm stem, BatchNorm blocks evaluated with the initial statistics,
    FrozenStatsNorm).
    """

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 10,
        groups: int = 32,
        projector: int = 0,
        conv_init: str = "default",
        block_norm: str = "gn",
    ):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), nn.GroupNorm(groups, 64), nn.ReLU())
        layers, in_planes = [], 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            for s in (stride, 1):
                layers.append(BasicBlock(in_planes, planes, s, block_norm, groups))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        head = (
            [nn.Linear(512, projector), nn.Linear(projector, num_classes)]
            if projector
            else [nn.Linear(512, num_classes)]
        )
        self.head = nn.Sequential(*head)
        if conv_init == "kaiming_fan_out":
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif conv_init != "default":
            raise ValueError(f"conv_init = {conv_init!r}; allowed: default, kaiming_fan_out")

    def forward(self, x):
        out = self.layers(self.stem(x))
        return self.head(nn.functional.adaptive_avg_pool2d(out, 1).flatten(1))


# --------------------------------------------------------------------------- CIFAR ResNet-20/56


class CifarResNet(nn.Module):
    """FedLAW's CIFAR ResNet (Li et al. 2018 landscape models): 3x3 stem conv 16, three stages of
    (depth-2)/6 BasicBlocks with 16/32/64 channels, 1x1 conv + norm shortcut when the shape changes,
    global average pool, Linear(64, classes). BatchNorm with running statistics, or on batch statistics
    only when ``running_stats`` is False (module doc)."""

    def __init__(
        self, depth: int, in_channels: int = 3, num_classes: int = 10, running_stats: bool = True, width: int = 1
    ):
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
        n = (depth - 2) // 6
        bn = "bn" if running_stats else "bn_batch"
        # width k: Li et al. 2018's wide variant (WRN-56-4: k = 4), every width of the stem and the stages
        # times k, the blocks the same BasicBlocks (their code's WResNet_cifar; not Zagoruyko's pre-activation WRN)
        c = 16 * width
        self.stem = nn.Sequential(nn.Conv2d(in_channels, c, 3, 1, 1, bias=False), _norm(bn, c, 0), nn.ReLU())
        layers, in_planes = [], c
        for planes, stride in ((c, 1), (2 * c, 2), (4 * c, 2)):
            for i in range(n):
                layers.append(BasicBlock(in_planes, planes, stride if i == 0 else 1, bn, 0))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(4 * c, num_classes)

    def forward(self, x):
        out = self.layers(self.stem(x))
        return self.fc(nn.functional.adaptive_avg_pool2d(out, 1).flatten(1))


# --------------------------------------------------------------------------- DenseNet-121 (CIFAR stem)


def densenet121_cifar(in_channels: int = 3, num_classes: int = 10, running_stats: bool = True) -> nn.Module:
    """DenseNet-BC-121 for 32x32 images as Li et al. 2018 define it: torchvision's DenseNet (blocks
    [6, 12, 24, 16], growth 32, bottleneck 4 x growth, transitions halving the channels, a final
    BatchNorm + ReLU + global average pool + Linear(1024, classes)) with the CIFAR stem, one 3x3 conv
    of 2 x growth = 64 channels, stride 1, and no BatchNorm, ReLU or max-pool after it (ImageNet's stem:
    7x7 stride 2, BN, ReLU, max-pool). The four stages then see 32, 16, 8, 4 pixels, and the global pool
    is the 4x4 average pool of Li et al. Initialisation is PyTorch's default, as FedLAW's code (kuangliu's
    DenseNet) leaves it: torchvision's constructor draws Kaiming-normal convs and a zero Linear bias, so every
    conv and the Linear are drawn again (BatchNorm's 1 and 0 are the default already). Their DenseNet
    concatenates a layer's new channels before its input, torchvision's after: the same network up to that
    order of channels (docs/parity.md)."""
    from torchvision.models import DenseNet

    model = DenseNet(
        growth_rate=32, block_config=(6, 12, 24, 16), num_init_features=64, bn_size=4, num_classes=num_classes
    )
    model.features.conv0 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
    for name in ("norm0", "relu0", "pool0"):
        setattr(model.features, name, nn.Identity())
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            m.reset_parameters()
    if not running_stats:  # normalise with each batch's statistics (module doc)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.track_running_stats, m.running_mean, m.running_var, m.num_batches_tracked = False, None, None, None
    return model


# name -> builder(shape, number of classes[, running_stats]): the models of resnet.yaml (those marked batchnorm
# take running_stats)
BUILDERS = {
    "resnet18_gn32": lambda shape, k: ResNet18GN(shape[0], k, groups=32),
    "resnet18_gn32_code": lambda shape, k: ResNet18GN(shape[0], k, groups=32, block_norm="bn_init_stats"),
    "resnet18_gn2": lambda shape, k: ResNet18GN(shape[0], k, groups=2, projector=128, conv_init="kaiming_fan_out"),
    "resnet8": lambda shape, k, running_stats: CifarResNet(8, shape[0], k, running_stats),
    "resnet20": lambda shape, k, running_stats: CifarResNet(20, shape[0], k, running_stats),
    "resnet56": lambda shape, k, running_stats: CifarResNet(56, shape[0], k, running_stats),
    "resnet110": lambda shape, k, running_stats: CifarResNet(110, shape[0], k, running_stats),
    "wrn56_4": lambda shape, k, running_stats: CifarResNet(56, shape[0], k, running_stats, width=4),
    "densenet121": lambda shape, k, running_stats: densenet121_cifar(shape[0], k, running_stats),
}
