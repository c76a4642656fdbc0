"""VGG-11: FedNova's (no normalisation) and IMA's (GroupNorm, linear projector)."""

from __future__ import annotations

import math

from torch import nn

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
        self.classifier = nn.Sequential(
            nn.Dropout(),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Dropout(),
            nn.Linear(512, 512),
            nn.ReLU(),
            nn.Linear(512, num_classes),
        )
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


# name -> builder(shape, number of classes): the models of vgg.yaml
BUILDERS = {
    "vgg11": lambda shape, k: VGG11(shape[0], k),
    "vgg11_gn2": lambda shape, k: VGG11GN(shape[0], k, groups=2),
}
