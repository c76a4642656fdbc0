"""The small CNNs of the papers' code, layer for layer (see docs/algorithms.md for sources)."""

from __future__ import annotations

from torch import nn


class LeNet5(nn.Module):
    """FedLAW code's "LeNet5": conv(1,16,5,pad 2)-pool-conv(16,32,5,pad 2)-pool-Linear(1568,10)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
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
            nn.Conv2d(in_channels, width, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, width, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        out_side = ((side - 4) // 2 - 4) // 2
        flat = width * out_side * out_side
        self.classifier = nn.Sequential(
            nn.Linear(flat, 384), nn.ReLU(), nn.Linear(384, 128), nn.ReLU(), nn.Linear(128, num_classes)
        )

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


class CifarCNN(nn.Module):
    """Three 3x3 convs without padding (32-64-64, max-pool after the first two), FC 1024-64-classes.

    The same layers are FedAWARE's CIFAR-10 "5-layer CNN" (code: ToyCifarNet; 122,570 parameters,
    Kaiming-normal fan-out conv init, N(0, 0.01) linear init, zero biases) and FedLAW's SimpleCNN
    (PyTorch default init); ``init`` picks the paper's initialisation.
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, init: str = "default"):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3),
            nn.ReLU(),
        )
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


class DigitCNNGN(nn.Module):
    """IMA's Digit-Five CNN (code: ``mixed_digit_gn``) for 3 x 28 x 28 inputs: three blocks of conv 5x5 (pad 2),
    GroupNorm(2 groups), ReLU, 2x2 max-pool (64, 64, 128 channels: 28 -> 14 -> 7 -> 3), then FC 1152-384
    (ReLU), 384-128 (the 128-d feature, no ReLU in the code) and the classifier 128-classes.

    The paper's Table 4 prints FC 6272-2048-128-10 after three pools, which cannot be (6272 = 128 x 7 x 7 is
    the two-pool FedBN model); its text says "five GroupNorm layers". We follow the code: 806,090 parameters.
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, groups: int = 2):
        super().__init__()
        blocks = []
        for c_in, c_out in ((in_channels, 64), (64, 64), (64, 128)):
            blocks += [nn.Conv2d(c_in, c_out, 5, 1, 2), nn.GroupNorm(groups, c_out), nn.ReLU(), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*blocks)
        self.fc = nn.Sequential(nn.Linear(128 * 3 * 3, 384), nn.ReLU(), nn.Linear(384, 128))
        self.classifier = nn.Linear(128, num_classes)

    def forward(self, x):
        return self.classifier(self.fc(self.features(x).flatten(1)))


# name -> builder(shape (channels, height, width), number of classes): the models of cnn.yaml
BUILDERS = {
    "lenet5": lambda shape, k: LeNet5(shape[0], k),
    "cnn": lambda shape, k: TwoConvCNN(shape[0], 32 if shape[0] == 1 else 64, shape[1], k),
    "cnn_fedaware": lambda shape, k: CifarCNN(shape[0], k, init="fedaware"),
    "simplecnn": lambda shape, k: CifarCNN(shape[0], k),
    "digit_cnn_gn2": lambda shape, k: DigitCNNGN(shape[0], k, groups=2),
}
