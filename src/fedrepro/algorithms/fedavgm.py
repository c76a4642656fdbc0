"""FedAvgM (Hsu et al., 2019): FedAvg's weighted mean with heavy-ball momentum on the server.

d = sum_{i in S} n_i / n_S * Delta_i,     v <- beta v + d,     x <- x - eta_g v
"""

from fedrepro.parts import Algorithm
from fedrepro.server import ServerSGD, WeightedMean


def build(setting, ctx) -> Algorithm:
    return Algorithm("fedavgm", WeightedMean(), ServerSGD(setting["server"]["lr"], setting["fedavgm"]["momentum"]))
