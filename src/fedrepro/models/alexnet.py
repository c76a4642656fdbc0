"""FedLAW's AlexNet for 32x32 images (our choice of layers: neither the paper nor its code defines it)."""

from __future__ import annotations

from torch import nn


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
            nn.Conv2d(in_channels, 64, 11, stride=4, padding=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 192, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(192, 384, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(384, 256, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(256, 256, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(256, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


class AlexNetGN(nn.Module):
    """IMA's PACS AlexNet (code: ``alexnet_gn``) for 3 x 224 x 224 inputs, trained from scratch: torchvision's
    AlexNet convs (64 11x11 stride 4 pad 2, 192 5x5 pad 2, 384, 256, 256 3x3 pad 1; 3x3 stride-2 max-pools after
    conv1, conv2 and conv5), each conv followed by GroupNorm and ReLU, adaptive average pool to 6 x 6, FC
    9216-1024 (ReLU), 1024-128 (ReLU: the 128-d feature), classifier 128-7. No dropout (commented out in the code).

    Groups: the code's 32; the paper says "two groups in all models". Its Table 4 prints "FC(4096, 512)" and
    "FC(512, 10)" (PACS has 7 classes); the code's feature width is its dims_feature, 128. 12,042,311 parameters.
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 7, groups: int = 32):
        super().__init__()

        def conv(c_in, c_out, kernel, **kw):
            return [nn.Conv2d(c_in, c_out, kernel, **kw), nn.GroupNorm(groups, c_out), nn.ReLU()]

        self.features = nn.Sequential(
            *conv(in_channels, 64, 11, stride=4, padding=2),
            nn.MaxPool2d(3, 2),
            *conv(64, 192, 5, padding=2),
            nn.MaxPool2d(3, 2),
            *conv(192, 384, 3, padding=1),
            *conv(384, 256, 3, padding=1),
            *conv(256, 256, 3, padding=1),
            nn.MaxPool2d(3, 2),
            nn.AdaptiveAvgPool2d((6, 6)),
        )
        self.fc = nn.Sequential(nn.Linear(256 * 6 * 6, 1024), nn.ReLU(), nn.Linear(1024, 128), nn.ReLU())
        self.classifier = nn.Linear(128, num_classes)

    def forward(self, x):
        return self.classifier(self.fc(self.features(x).flatten(1)))


# name -> builder(shape, number of classes): the models of alexnet.yaml
BUILDERS = {
    "alexnet": lambda shape, k: CifarAlexNet(shape[0], k),
    "alexnet_gn32": lambda shape, k: AlexNetGN(shape[0], k, groups=32),
}
