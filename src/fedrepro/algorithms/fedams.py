"""FedAMS (Wang, Lin & Chen, 2022): FedAvg's weighted mean fed to AMSGrad with a floor eps on v_hat.

d = sum_{i in S} n_i / n_S * Delta_i;   m <- b1 m + (1-b1) d;   v <- b2 v + (1-b2) d^2
v_hat <- max(v_hat, v, eps);   x <- x - eta_g m / sqrt(v_hat)
"""

from fedrepro.parts import Algorithm
from fedrepro.server import WeightedMean
from fedrepro.server_optim import ServerAMS


def build(setting, ctx) -> Algorithm:
    c = setting["fedams"]
    return Algorithm("fedams", WeightedMean(), ServerAMS(setting["server"]["lr"], c["beta1"], c["beta2"], c["eps"]))
