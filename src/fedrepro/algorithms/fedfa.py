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
from torch.func import vmap

from fedrepro.catalog import FEATURE_CLASSIFIER_MODELS
from fedrepro.parts import Algorithm, ClientObjective, ClientRun, FeatureTerm, RoundUpdates
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
    batched_forms = frozenset({"begin", "step", "after_step", "end_epoch", "end"})  # run/batched.py
    state = ("anchors",)

    def __init__(
        self, anchors: torch.Tensor, lam: float, momentum: float, calibrate_after: float, calibration_lr: float
    ):
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
            denom = (v / (1 - b2**self.adam_step)).sqrt_().add_(ADAM_EPS)
            p.addcdiv_(m, denom, value=-self.calibration_lr / (1 - b1**self.adam_step))

    def end_epoch(self, run: ClientRun) -> None:
        # the code divides by all the epoch's batches, not by those holding class c (kept as is)
        mean = self.batch_means[self.seen] / max(self.batches, 1)
        self.local[self.seen] = self.momentum * self.local[self.seen] + (1 - self.momentum) * mean
        self.batch_means.zero_()
        self.seen.zero_()
        self.batches = 0

    def end(self, run: ClientRun) -> None:
        self.client_anchors[run.client] = self.local

    # ---- the same, for a group of clients training together (run/batched.py): row j is client j's state
    def batched_begin(self, cohort) -> None:
        k = len(cohort.clients)
        self.round = cohort.round
        self.classifier = classifier_of(cohort.module)
        self.head = _slices(cohort.module, (self.classifier.weight, self.classifier.bias))
        self.local = self.anchors.expand(k, -1, -1).clone()
        self.batch_means = torch.zeros_like(self.local)
        self.seen = torch.zeros(k, len(self.anchors), dtype=torch.bool, device=self.anchors.device)
        self.batches = torch.zeros(k, dtype=torch.long, device=self.anchors.device)
        self.adam_steps = [0] * k
        self.adam_m = [torch.zeros(k, *shape, device=self.anchors.device) for _, shape in self.head]
        self.adam_v = [torch.zeros_like(m) for m in self.adam_m]

    def batched(self, view, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss, features = view.loss_and_grad(inputs, labels, _AnchorTerm(self))
        with torch.no_grad():
            k, c = len(features), len(self.anchors)
            f = features.reshape(k, -1, features.shape[-1])
            # each row's class sums in its own slots, added in batch order as the sequential index_add_ adds
            slot = (labels + c * torch.arange(k, device=labels.device)[:, None]).reshape(-1)
            counts = torch.bincount(slot, minlength=k * c).view(k, c)
            sums = torch.zeros(k * c, f.shape[-1], device=f.device, dtype=f.dtype)
            sums.index_add_(0, slot, f.reshape(-1, f.shape[-1]))
            sums = sums.view(k, c, -1)
            present = counts > 0
            rows = _rows(view, k)
            means = self.batch_means[rows]
            means[present] += sums[present] / counts[present].to(f.dtype)[:, None]
            self.batch_means[rows] = means
            self.seen[rows] |= present
            self.batches[rows] += 1
        return loss

    @torch.no_grad()
    def batched_after_step(self, view) -> None:
        if not (self.round > 0 and self.round > self.calibrate_after):
            return
        rows = _rows(view, len(view.x))
        for j in rows.tolist():
            self.adam_steps[j] += 1
        step = self.adam_steps[int(rows[0])]  # the rows of a step have all taken the same steps
        params = [view.x[:, lo : lo + shape.numel()].view(len(view.x), *shape) for lo, shape in self.head]
        target = torch.arange(len(self.anchors), device=self.anchors.device)
        with torch.enable_grad():
            grads = vmap(
                torch.func.grad(lambda w, b: F.cross_entropy(F.linear(self.anchors, w, b), target), argnums=(0, 1))
            )(*params)
        b1, b2 = ADAM_BETAS
        for p, g, m_all, v_all in zip(params, grads, self.adam_m, self.adam_v):
            m, v = m_all[rows], v_all[rows]
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v / (1 - b2**step)).sqrt_().add_(ADAM_EPS)
            p.addcdiv_(m, denom, value=-self.calibration_lr / (1 - b1**step))
            m_all[rows], v_all[rows] = m, v

    def batched_end_epoch(self, view) -> None:
        rows = _rows(view, len(view.x))
        seen = self.seen[rows]
        mean = self.batch_means[rows] / self.batches[rows].clamp(min=1).to(self.local.dtype)[:, None, None]
        local = self.local[rows]
        local[seen] = self.momentum * local[seen] + (1 - self.momentum) * mean[seen]
        self.local[rows] = local
        self.batch_means[rows] = 0
        self.seen[rows] = False
        self.batches[rows] = 0

    def batched_end(self, cohort) -> None:
        for j, client in enumerate(cohort.clients.tolist()):
            self.client_anchors[int(client)] = self.local[j]

    # ---- server
    def end_round(self, updates: RoundUpdates) -> None:
        stacked = torch.stack([self.client_anchors[int(c)] for c in updates.clients])
        self.anchors = torch.einsum("k,kcd->cd", updates.weights.to(stacked.dtype), stacked)
        self.client_anchors.clear()


class _AnchorTerm(FeatureTerm):
    """The anchor loss of one client's batch, as ``FeatureAnchors.anchor_loss`` (round 0: none), vmappable."""

    def __init__(self, anchors: FeatureAnchors):
        self.of, self.tap = anchors, anchors.classifier

    def __call__(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        a = self.of
        if a.round == 0:
            return None
        classes = torch.arange(len(a.anchors), device=labels.device)
        counts = (labels[:, None] == classes).sum(0).to(features.dtype)  # bincount's counts, vmappable
        dist = (features - a.anchors[labels]).pow(2).sum(1) / counts[labels]
        return a.lam * dist.sum() / len(a.anchors)


def _rows(view, k: int) -> torch.Tensor:
    """The group rows a batched step's view holds."""
    return torch.arange(k, device=view.x.device) if view.rows is None else view.rows


def _slices(module: nn.Module, wanted) -> list[tuple[int, torch.Size]]:
    """Where the parameters ``wanted`` lie in the flat vector (module.parameters() order): (offset, shape)."""
    found, offset = {}, 0
    for p in module.parameters():
        found[id(p)] = (offset, p.shape)
        offset += p.numel()
    return [found[id(p)] for p in wanted]


def build(setting, ctx) -> Algorithm:
    from fedrepro import models

    c = setting["fedfa"]
    if setting["model"] not in FEATURE_CLASSIFIER_MODELS:  # the config check says so earlier, for grids
        raise ValueError(
            f"fedfa needs a feature/classifier split; model '{setting['model']}' is not one of "
            f"{sorted(FEATURE_CLASSIFIER_MODELS)}"
        )
    head = (
        classifier_of(ctx.module)
        if ctx.module is not None
        else classifier_of(models.build(setting["model"], setting["dataset"]))
    )
    anchors = initial_anchors(head.out_features, head.in_features, setting["seed"]).to(ctx.device)
    return Algorithm(
        "fedfa",
        WeightedMean(),
        ServerSGD(setting["server"]["lr"]),
        objective=FeatureAnchors(
            anchors, c["lam"], c["momentum"], c["calibration_start"] * setting["rounds"], c["calibration_lr"]
        ),
    )
