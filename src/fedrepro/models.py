"""Models with the exact layers of the papers' code (see docs/algorithms.md for sources)."""
from __future__ import annotations

from torch import nn


class MLP(nn.Module):
    """784-200-200-10 with ReLU (FedLAW's FMNIST MLP; FedLab's MLP used by FedAWARE)."""

    def __init__(self, in_features: int = 784, num_classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, 200), nn.ReLU(),
                                 nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, num_classes))

    def forward(self, x):
        return self.net(x)


class LeNet5(nn.Module):
    """FedLAW code's "LeNet5": conv(1,16,5,pad 2)-pool-conv(16,32,5,pad 2)-pool-Linear(1568,10)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(32 * 7 * 7, num_classes)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


class TwoConvCNN(nn.Module):
    """IMA's (FedAvg-style) CNN, Table 4: two 5x5 convs without padding, FC 384-128-classes.

    FMNIST: conv(1,32)-conv(32,32) -> 512 features; CIFAR: conv(3,64)-conv(64,64) -> 1600.
    ReLU after both hidden FC layers, as IMA's code does.
    """

    def __init__(self, in_channels: int = 1, width: int = 32, side: int = 28, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, width, 5), nn.ReLU(), nn.MaxPool2d(2))
        out_side = ((side - 4) // 2 - 4) // 2
        flat = width * out_side * out_side
        self.classifier = nn.Sequential(nn.Linear(flat, 384), nn.ReLU(), nn.Linear(384, 128), nn.ReLU(),
                                        nn.Linear(128, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def build(name: str, dataset: str, pretrained: dict | None = None, batchnorm: str = "running_stats") -> nn.Module:
    """``pretrained`` (the setting's section: weights path) is read by pretrained models only,
    ``batchnorm`` (running_stats | batch_stats) by models with BatchNorm only."""
    from fedrepro.catalog import DATASETS
    from fedrepro import models_extra, text
    if name in models_extra.BUILDERS:
        return models_extra.build(name, dataset, batchnorm)
    if name in text.BUILDERS:
        return text.build(name, dataset, pretrained)
    channels, side, _ = DATASETS[dataset]["shape"]
    classes = DATASETS[dataset]["num_classes"]
    if name == "mlp":
        return MLP(channels * side * side, classes)
    if name == "lenet5":
        return LeNet5(channels, classes)
    if name == "cnn":
        return TwoConvCNN(channels, 32 if channels == 1 else 64, side, classes)
    raise ValueError(f"unknown model '{name}'")


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

