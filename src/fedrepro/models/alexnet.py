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
            nn.Conv2d(in_channels, 64, 11, stride=4, padding=5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Linear(256, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))
