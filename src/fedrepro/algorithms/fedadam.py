"""FedAdam (Reddi et al., 2021): FedAvg's weighted mean fed to Adam on the server (no bias correction).

d = sum_{i in S} n_i / n_S * Delta_i;   m <- b1 m + (1-b1) d;   v <- b2 v + (1-b2) d^2
x <- x - eta_g m / (sqrt(v) + tau)
"""

from fedrepro.parts import Algorithm
from fedrepro.server import WeightedMean
from fedrepro.server_optim import ServerAdam


def build(setting, ctx) -> Algorithm:
    c = setting["fedadam"]
    return Algorithm(
        "fedadam", WeightedMean(), ServerAdam(setting["server"]["lr"], c["beta1"], c["beta2"], c["tau"], c["v0"])
    )
