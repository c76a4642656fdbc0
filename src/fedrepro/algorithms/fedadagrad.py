"""FedAdagrad (Reddi et al., 2021, Algorithm 2): FedAvg's weighted mean fed to Adagrad on the server.

    d = sum_{i in S} n_i / n_S * Delta_i;   m <- b1 m + (1-b1) d;   v <- v + d^2
    x <- x - eta_g m / (sqrt(v) + tau)

FedOpt's third optimiser: the papers' codes offer it (FedAWARE's fedopt option adagrad, IMA's aggregator
mode fedadagrad) though no table of the four papers runs it. Unlike Adam's, v only grows, so the step
of a coordinate shrinks with every round it moved in.
"""

from fedrepro.parts import Algorithm
from fedrepro.server import WeightedMean
from fedrepro.server_optim import AdaptiveServer


class ServerAdagrad(AdaptiveServer):
    def __init__(self, lr: float, beta1: float = 0.9, tau: float = 1e-5, v0: float = 0.0):
        super().__init__(lr, beta1, beta2=1.0)  # beta2 plays no part: v is a plain sum
        self.tau, self.v0 = tau, v0

    def init_v(self, d):
        return d.new_full(d.shape, self.v0)

    def second_moment(self, d2):
        self.v.add_(d2)

    def denominator(self):
        return self.v.sqrt() + self.tau


def build(setting, ctx) -> Algorithm:
    c = setting["fedadagrad"]
    return Algorithm(
        "fedadagrad", WeightedMean(), ServerAdagrad(setting["server"]["lr"], c["beta1"], c["tau"], c["v0"])
    )
