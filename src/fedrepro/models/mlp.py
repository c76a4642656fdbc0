"""The fully connected models: FedLAW's and FedAWARE's MLP, FedNova's logistic regression."""

from __future__ import annotations

import math

from torch import nn


class MLP(nn.Module):
    """784-200-200-10 with ReLU (FedLAW's FMNIST MLP; FedLab's MLP used by FedAWARE)."""

    def __init__(self, in_features: int = 784, num_classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, 200),
            nn.ReLU(),
            nn.Linear(200, 200),
            nn.ReLU(),
            nn.Linear(200, num_classes),
        )

    def forward(self, x):
        return self.net(x)


class LogisticRegression(nn.Module):
    """Multinomial logistic regression (FedNova's Synthetic model): one Linear layer, softmax CE."""

    def __init__(self, in_features: int = 60, num_classes: int = 10):
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x):
        return self.linear(x.flatten(1))


# name -> builder(shape, number of classes): the models of mlp.yaml
BUILDERS = {
    "mlp": lambda shape, k: MLP(math.prod(shape), k),
    "logreg": lambda shape, k: LogisticRegression(math.prod(shape), k),
}
