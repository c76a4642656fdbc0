"""FedDF (Lin et al., NeurIPS 2020) as FedLAW's code runs it: ensemble distillation of the sampled
clients into the FedAvg model on the proxy inputs (labels unused).

    w   <- x - eta_g sum_i p_i Delta_i                           (FedAvg: the student's start)
    t(b) = (1/K) sum_i f(b; x_i)                                 (uniform mean of the K client logits)
    w   <- w - server step on KL(softmax(t(b)) || softmax(f(b; w)))   batchmean, temperature 1,
                                                                  feddf.server_epochs passes (100)
    d    = x - w,   x <- x - 1 * d

The teachers' logits are computed once a round (they do not depend on w), over the proxy set in
fixed chunks of feddf.batch_size. Server optimiser: proxy.py (code: SGD as the client's).

BatchNorm statistics of the teachers (``teacher_statistics``): ``global`` (unset) scores every teacher in
eval mode on the cohort-averaged running statistics; ``code`` as FedLAW's code: each client teacher in
eval mode on its own running statistics (the client's model object), and FedBE's FedAvg and SWAG teachers,
freshly built modules the code leaves in train mode, on each chunk's batch statistics.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedrepro.algorithms.proxy import ProxyTraining, build_proxy_algorithm
from fedrepro.parts import Algorithm, RoundUpdates


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(teacher) || softmax(student)), summed over classes and averaged over the batch."""
    return F.kl_div(F.log_softmax(student_logits, 1), F.softmax(teacher_logits, 1), reduction="batchmean")


class EnsembleDistillation(ProxyTraining):
    teacher: torch.Tensor | None = None  # (n_proxy, C) mean teacher logits of the round

    @property
    def codes_statistics(self) -> bool:
        return self.cfg["teacher_statistics"] == "code"

    def client_teachers(self, models: torch.Tensor, updates: RoundUpdates) -> list[tuple]:
        """(w, buffers, batch statistics) of the K clients: their own running statistics under ``code``."""
        own = self.codes_statistics and updates.buffers is not None
        return [(w, updates.buffers[i] if own else None, False) for i, w in enumerate(models)]

    def teachers(
        self, x: torch.Tensor, x_avg: torch.Tensor, models: torch.Tensor, updates: RoundUpdates
    ) -> list[tuple]:
        return self.client_teachers(models, updates)  # FedDF: the K client models

    def prepare(self, x, x_avg, models, updates) -> None:
        nets = self.teachers(x, x_avg, models, updates)
        total = sum(
            self.net.logits(w, self.proxy_x, self.cfg["batch_size"], buffers, batch) for w, buffers, batch in nets
        )
        self.teacher = total / len(nets)

    def loss(self, w: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return distillation_loss(self.net(w, self.proxy_x[index]), self.teacher[index])


def build(setting, ctx) -> Algorithm:
    return build_proxy_algorithm("feddf", EnsembleDistillation, setting, ctx)
