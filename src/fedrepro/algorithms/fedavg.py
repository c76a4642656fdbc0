"""FedAvg (McMahan et al., 2017): data-size weighted mean of the cohort's updates.

d = sum_{i in S} n_i / n_S * Delta_i,        x <- x - eta_g * d
"""

from fedrepro.parts import Algorithm
from fedrepro.server import ServerSGD, WeightedMean


def build(setting, ctx) -> Algorithm:
    return Algorithm("fedavg", WeightedMean(), ServerSGD(setting["server"]["lr"]))
