"""FedASAM (Caldarola et al., 2022): FedAvg whose clients take Adaptive-SAM steps (Kwon et al., 2021).

Every local step makes two forward/backward passes on the same minibatch:

    g    = grad f(w; xi)                                   (the loss logged is f(w; xi))
    T_w  = |w| + eta  on the weight tensors, 1 on the other parameters (biases)
    eps  = rho * T_w^2 g / ||T_w g||                       (the ascent to the worst point nearby)
    g'   = grad f(w + eps; xi)                              (model.grad; then w is restored)

and the client's SGD (weight decay, momentum) steps with g'. The server is FedAvg's weighted mean.
"Weight" means a parameter whose name contains "weight" (conv, linear and GroupNorm scales), which is
the rule of the IMA code's ASAM class; weight decay enters only the descent step, as there (it is in
the SGD optimizer, not in the ascent gradient).
"""

import torch
import torch.nn.functional as F

from fedrepro.parts import Algorithm, ClientObjective, ClientRun
from fedrepro.server import ServerSGD, WeightedMean


class AdaptiveSharpness(ClientObjective):
    batched_forms = frozenset({"step"})  # run/batched.py
    forwards_per_step = 2  # two forward passes a step: a dropout model draws two masks (run/batched.py)

    def __init__(self, rho: float, eta: float):
        self.rho, self.eta = rho, eta
        self.weight_mask: torch.Tensor | None = None  # True on entries of "weight" parameters

    def begin(self, run: ClientRun) -> None:
        model = run.model
        if self.weight_mask is None:
            mask = [
                torch.full((p.numel(),), "weight" in name, dtype=torch.bool)
                for name, p in model.module.named_parameters()
            ]
            self.weight_mask = torch.cat(mask).to(model.flat.device)

    def __call__(self, run: ClientRun, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        model = run.model
        loss = model.loss_and_grad(F.cross_entropy, inputs, labels)
        w = model.flat
        scale = torch.where(self.weight_mask, w.abs() + self.eta, torch.ones_like(w))
        scaled = scale * model.grad
        eps = scale * scaled * (self.rho / (scaled.norm() + 1e-16))  # 1e-16: a zero gradient gives eps = 0
        w.add_(eps)
        model.loss_and_grad(F.cross_entropy, inputs, labels)
        w.sub_(eps)
        return loss

    def batched(self, view, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The same two passes for the (k, P) rows of clients training together (run/batched.py): each row's
        ascent scaled by its own ||T_w g||."""
        loss = view.loss_and_grad(inputs, labels)
        w = view.x
        scale = torch.where(self.weight_mask, w.abs() + self.eta, torch.ones_like(w))
        scaled = scale * view.grad
        eps = scale * scaled * (self.rho / (scaled.norm(dim=1, keepdim=True) + 1e-16))
        w.add_(eps)
        view.loss_and_grad(inputs, labels)
        w.sub_(eps)
        return loss


def build(setting, ctx) -> Algorithm:
    c = setting["fedasam"]  # rho and eta resolved: null is IMA Table 5's value for the model (fedasam.yaml)
    rho, eta = c["rho"], c["eta"]
    return Algorithm(
        "fedasam", WeightedMean(), ServerSGD(setting["server"]["lr"]), objective=AdaptiveSharpness(rho, eta)
    )
