"""FedFA (Zhou et al., 2023, "Federated learning with feature anchors"), as IMA's code runs it.

Global class anchors A (C x d, d = the classifier's input width) are sent with the model. Client i,
in round t, every local step on a minibatch (X, y) with features f = h(X) (the classifier's input):

    loss = CE(logits, y) + [t > 0] * lambda/C * sum_b ||f_b - A_{y_b}||^2 / count_batch(y_b)
    SGD step (weight decay, momentum) on all parameters
    if t > R/4 (calibration): one Adam step (fresh per client and round) on the classifier (W, b)
        with CE(W A^T + b, [0..C-1])       (the classifier must classify each anchor as its class)

and its own anchors A_i (starting at A) follow the features: per epoch, B_c = (1/#batches) sum over
the batches containing class c of the batch's class-c mean feature (pre-step features), and for every
class c of the client's data A_i,c <- m A_i,c + (1 - m) B_c. The server averages the models (FedAvg)
and the anchors, A <- sum_{i in S} p_i A_i. IMA, when added, averages models only, never anchors.

Only models whose last layer is a Linear classifier over a feature layer can run it (registry check).
"""
import torch
import torch.nn.functional as F
from torch import nn

from fedrepro.parts import Algorithm, ClientObjective, ClientRun, RoundUpdates
from fedrepro.catalog import FEATURE_CLASSIFIER_MODELS
from fedrepro.server import ServerSGD, WeightedMean
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults, which the code uses


def classifier_of(module: nn.Module) -> nn.Linear:
    return [m for m in module.modules() if isinstance(m, nn.Linear)][-1]


def initial_anchors(num_classes: int, dim: int, seed: int) -> torch.Tensor:
    """Distinct one-hot rows when C <= d (orthonormal anchors), else unit-norm Gaussian rows."""
    gen = torch.Generator().manual_seed(seed)
    if num_classes <= dim:
        return torch.eye(dim)[torch.randperm(dim, generator=gen)[:num_classes]]
    return F.normalize(torch.randn(num_classes, dim, generator=gen), dim=1)


class FeatureAnchors(ClientObjective):
    state = ("anchors",)

    def __init__(self, anchors: torch.Tensor, lam: float, momentum: float, calibrate_after: float,
                 calibration_lr: float):
        self.anchors = anchors  # the global A
        self.lam, self.momentum = lam, momentum
        self.calibrate_after, self.calibration_lr = calibrate_after, calibration_lr
        self.client_anchors: dict[int, torch.Tensor] = {}  # this round's A_i, until the server averages

    # ---- one client's training
    def begin(self, run: ClientRun) -> None:
        self.round = run.round
        self.classifier = classifier_of(run.model.module)
        self.local = self.anchors.clone()
        self.batch_means = torch.zeros_like(self.anchors)
        self.seen = torch.zeros(len(self.anchors), dtype=torch.bool, device=self.anchors.device)
        self.batches = 0
        self.adam_step = 0
        params = (self.classifier.weight, self.classifier.bias)
        self.adam_m = [torch.zeros_like(p) for p in params]
        self.adam_v = [torch.zeros_like(p) for p in params]

    def anchor_loss(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        counts = torch.bincount(labels, minlength=len(self.anchors)).to(features.dtype)
        dist = (features - self.anchors[labels]).pow(2).sum(1) / counts[labels]
        return self.lam * dist.sum() / len(self.anchors)

    def __call__(self, run: ClientRun, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        model = run.model
        captured = []
        hook = self.classifier.register_forward_hook(lambda mod, args, out: captured.append(args[0]))
        try:
            model.grad.zero_()
            logits = model.module(inputs)
        finally:
            hook.remove()
        features = captured[0]
        loss = F.cross_entropy(logits, labels)
        if self.round > 0:  # round 0 trains on CE alone (the anchors are still the initial ones)
            loss = loss + self.anchor_loss(features, labels)
        loss.backward()
        with torch.no_grad():
            f = features.detach()
            counts = torch.bincount(labels, minlength=len(self.anchors))
            sums = torch.zeros_like(self.batch_means).index_add_(0, labels, f)
            present = counts > 0
            self.batch_means[present] += sums[present] / counts[present, None].to(f.dtype)
            self.seen |= present
            self.batches += 1
        return loss.detach()

    @torch.no_grad()
    def after_step(self, run: ClientRun) -> None:
        if not (self.round > 0 and self.round > self.calibrate_after):
            return
        weight, bias = self.classifier.weight, self.classifier.bias
        target = torch.arange(len(self.anchors), device=self.anchors.device)
        with torch.enable_grad():
            loss = F.cross_entropy(F.linear(self.anchors, weight, bias), target)
            grads = torch.autograd.grad(loss, (weight, bias))  # leaves model.grad untouched
        self.adam_step += 1
        b1, b2 = ADAM_BETAS
        for p, g, m, v in zip((weight, bias), grads, self.adam_m, self.adam_v):
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v / (1 - b2 ** self.adam_step)).sqrt_().add_(ADAM_EPS)
            p.addcdiv_(m, denom, value=-self.calibration_lr / (1 - b1 ** self.adam_step))

    def end_epoch(self, run: ClientRun) -> None:
        # the code divides by all the epoch's batches, not by those holding class c (kept as is)
        mean = self.batch_means[self.seen] / max(self.batches, 1)
        self.local[self.seen] = self.momentum * self.local[self.seen] + (1 - self.momentum) * mean
        self.batch_means.zero_()
        self.seen.zero_()
        self.batches = 0

    def end(self, run: ClientRun) -> None:
        self.client_anchors[run.client] = self.local

    # ---- server
    def end_round(self, updates: RoundUpdates) -> None:
        stacked = torch.stack([self.client_anchors[int(c)] for c in updates.clients])
        self.anchors = torch.einsum("k,kcd->cd", updates.weights.to(stacked.dtype), stacked)
        self.client_anchors.clear()


def build(setting, ctx) -> Algorithm:
    from fedrepro import models
    c = setting["fedfa"]
    if setting["model"] not in FEATURE_CLASSIFIER_MODELS:  # the config check says so earlier, for grids
        raise ValueError(f"fedfa needs a feature/classifier split; model '{setting['model']}' is not one of "
                         f"{sorted(FEATURE_CLASSIFIER_MODELS)}")
    head = classifier_of(ctx.module) if ctx.module is not None else \
        classifier_of(models.build(setting["model"], setting["dataset"]))
    anchors = initial_anchors(head.out_features, head.in_features, setting["seed"]).to(ctx.device)
    return Algorithm("fedfa", WeightedMean(), ServerSGD(setting["server"]["lr"]),
                     objective=FeatureAnchors(anchors, c["lam"], c["momentum"],
                                              c["calibration_start"] * setting["rounds"], c["calibration_lr"]))
