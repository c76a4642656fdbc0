"""FedYogi (Reddi et al., 2021): FedAvg's weighted mean fed to Yogi on the server (no bias correction).

d = sum_{i in S} n_i / n_S * Delta_i;   m <- b1 m + (1-b1) d;   v <- v - (1-b2) d^2 sign(v - d^2)
x <- x - eta_g m / (sqrt(v) + tau)
"""

from fedrepro.parts import Algorithm
from fedrepro.server import WeightedMean
from fedrepro.server_optim import ServerYogi


def build(setting, ctx) -> Algorithm:
    c = setting["fedyogi"]
    return Algorithm(
        "fedyogi", WeightedMean(), ServerYogi(setting["server"]["lr"], c["beta1"], c["beta2"], c["tau"], c["v0"])
    )
