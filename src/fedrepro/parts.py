"""The named parts a federated round is composed of, and what passes between them.

Client work and server work are separate (as in Flower's Strategy); the server side is a chain
of small transformations with explicit state (as in optax):

    aggregator: client updates -> pseudo-gradient d       (weighted mean, FedNova, FedLAW, AWARE)
    optimizer:  x, d -> x                                 (SGD with eta_g, momentum, Adam, Yogi, AMS;
                                                          +aware wraps the host's: its step projected on AWARE's d)
    post_steps: x -> x                                    (IMA window average)

Sign convention: a client's update is Delta_i = x - x_i; the server step is x <- x - eta_g * d.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import torch

from fedrepro.schedule import client_lr


class Part:
    """Anything with state that must survive a checkpoint. A part declares it: ``state`` names the
    attributes that hold it (a tensor, a list or dict of tensors, or None until first used) and
    ``subparts`` the attributes that are parts themselves; saving and loading are the same for all."""

    state: tuple[str, ...] = ()
    subparts: tuple[str, ...] = ()
    # a client hook's or post-step's name in checkpoints; "" keys it by its position in its method's list
    name: str = ""

    def state_dict(self) -> dict:
        saved = {name: getattr(self, name) for name in self.state if getattr(self, name) is not None}
        saved.update({name: getattr(self, name).state_dict() for name in self.subparts})
        return saved

    def load_state_dict(self, state: dict) -> None:
        # an attribute the checkpoint lacks keeps its initial value (None, zeros: not used yet)
        for name in self.state:
            if name in state:
                setattr(self, name, _restored(getattr(self, name), state[name]))
        for name in self.subparts:
            getattr(self, name).load_state_dict(state.get(name, {}))

    def start_from_fork(self, history: list[torch.Tensor]) -> None:
        """The run starts from a parent's fork state, which holds the parent's parts' state and its last
        global models (oldest first). A part the parent lacks (a plug-in that acts from the fork round on)
        takes from them what it would have kept itself before that round; the others need nothing."""


def _restored(current, saved):
    """The saved value, copied: into the current tensor in place when shapes agree (other parts may
    hold it), else as a fresh copy; lists and dicts element by element."""
    if isinstance(saved, torch.Tensor):
        if isinstance(current, torch.Tensor) and current.shape == saved.shape:
            return current.copy_(saved)
        return saved.clone()
    if isinstance(saved, dict):
        return {k: _restored(None, v) for k, v in saved.items()}
    if isinstance(saved, (list, tuple)):
        return (
            type(current)(_restored(None, v) for v in saved)
            if current is not None
            else [_restored(None, v) for v in saved]
        )
    return saved


@dataclass
class RoundUpdates:
    """What the sampled clients sent back in one round."""

    round: int
    clients: torch.Tensor  # (K,) client ids
    deltas: torch.Tensor  # (K, P) Delta_i = x - x_i
    sizes: torch.Tensor  # (K,) local sample counts n_i
    steps: torch.Tensor  # (K,) local SGD steps tau_i
    losses: torch.Tensor  # (K,) mean local minibatch loss
    lr: float  # client learning rate of the round
    info: dict = field(default_factory=dict)  # what parts report for the round's log
    # (K, B) each client's learnt buffers (BatchNorm running statistics) after its training; None without any
    buffers: torch.Tensor | None = None

    @property
    def weights(self) -> torch.Tensor:
        """Data-size weights over the cohort, n_i / sum_j n_j."""
        return self.sizes / self.sizes.sum()

    def weighted_mean(self) -> torch.Tensor:
        return self.weights @ self.deltas


class Aggregator(Part):
    def __call__(self, x: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        raise NotImplementedError


class ServerOptimizer(Part):
    def __call__(self, x: torch.Tensor, d: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        raise NotImplementedError


class PostStep(Part):
    def __call__(self, x: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        raise NotImplementedError


@dataclass
class ClientRun:
    """One client's local training in one round, as every client hook sees it."""

    round: int
    client: int
    model: object  # the FlatModel; its flat vector is the client's moving parameters x
    x_global: torch.Tensor  # the model the client started from
    lr: float
    steps: int = 0  # local steps taken so far (all of them at ``end``)


class ClientHook(Part):
    """A method's part in a client's local training. The engine calls ``begin`` before the first step,
    ``end`` after the last (``run.steps`` then counts them all) and ``end_round`` once the server step of
    the round is done; the two kinds below add what they act on.

    ``batched_forms`` declares which of its calls have a form for clients training together
    (``fedrepro.run.batched``): "step" (``batched``), "begin", "end", "after_step", "end_epoch"
    (``batched_<name>``). A hook that declares none trains one client after another."""

    batched_forms: frozenset[str] = frozenset()

    def begin(self, run: ClientRun) -> None:
        pass

    def end(self, run: ClientRun) -> None:
        pass

    def end_round(self, updates: RoundUpdates) -> None:
        pass


class GradientCorrection(ClientHook):
    """Client-objective term added to the minibatch gradient (proximal, SCAFFOLD, FedDyn)."""

    def __call__(self, grad: torch.Tensor, run: ClientRun) -> None:
        raise NotImplementedError  # modifies grad in place; run.model.flat is the current x


class ClientObjective(ClientHook):
    """How a client computes one minibatch gradient when it is not one cross-entropy backward
    (ASAM's two passes, FedFA's anchor loss). LocalSGD calls it in place of ``loss_and_grad``; the
    corrections, weight decay and momentum then act on ``model.grad`` as for every method."""

    forwards_per_step: int = 1  # forward passes a step makes (a dropout model draws masks for each)

    def __call__(self, run: ClientRun, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError  # fills run.model.grad, returns the detached loss

    def after_step(self, run: ClientRun) -> None:
        pass

    def end_epoch(self, run: ClientRun) -> None:
        pass


class FeatureTerm:
    """A loss on a model's features added to cross-entropy, for the batched path (FedFA's anchor loss):
    ``tap`` is the module whose input the features are; ``__call__(features, labels)`` is one client's
    term (vmapped over the clients training together), or None where it adds nothing."""

    tap: object  # an nn.Module

    def __call__(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        raise NotImplementedError


# A client plan's entry left at this value is the setting's (client.lr and its decay, local_epochs, batch_size)
THE_SETTINGS = None


@dataclass
class ClientPlan:
    """What a method decides of each round's client work, declared: the client lr of round t, a client's local
    epochs and its batch size (t, client, its sample count). Each entry is ``THE_SETTINGS`` unless the method or
    a plug-in replaces it (+ima's lr schemes, +random_epochs, +random_batch); the trainer reads nothing else."""

    lr_schedule: Callable[[int], float] | None = THE_SETTINGS
    local_epochs: Callable[[int, int], int] | None = THE_SETTINGS
    batch_size: Callable[[int, int, int], int] | None = THE_SETTINGS

    def lr_of(self, setting: dict) -> Callable[[int], float]:
        """The client lr of round t: the declared schedule, else the setting's (``lr_schedule``)."""
        return self.lr_schedule if self.lr_schedule is not THE_SETTINGS else lr_schedule(setting)

    def epochs_of(self, setting: dict) -> Callable[[int, int], int]:
        """Round t's local epochs of a client: the declared draw, else the setting's local_epochs."""
        if self.local_epochs is not THE_SETTINGS:
            return self.local_epochs
        return lambda t, client: setting["local_epochs"]

    def batch_of(self, setting: dict) -> Callable[[int, int, int], int]:
        """Round t's batch size of a client with ``size`` samples: the declared draw, else the setting's."""
        if self.batch_size is not THE_SETTINGS:
            return self.batch_size
        return lambda t, client, size: setting["batch_size"]


@dataclass
class Algorithm:
    """A federated method: the client's local rule, the server's chain and the client plan of each round.

    Every part's state is declared (``Part.state``, ``Part.subparts``) and checkpointed under its part's name:
    the aggregator, the optimizer, the objective, and each correction and post-step under ``name`` when it
    declares one (``correction<i>`` / ``post_step<i>`` by position when it does not)."""

    name: str
    aggregator: Aggregator
    optimizer: ServerOptimizer
    corrections: list[GradientCorrection] = field(default_factory=list)
    post_steps: list[PostStep] = field(default_factory=list)
    objective: ClientObjective | None = None  # None: cross-entropy, one backward per step
    client_plan: ClientPlan = field(default_factory=ClientPlan)  # every entry the setting's unless declared

    def parts(self) -> dict[str, Part]:
        named = {"aggregator": self.aggregator, "optimizer": self.optimizer}
        if self.objective is not None:
            named["objective"] = self.objective
        for kind, hooks in (("correction", self.corrections), ("post_step", self.post_steps)):
            for i, part in enumerate(hooks):
                key = part.name or f"{kind}{i}"
                if key in named:
                    raise ValueError(
                        f"method '{self.name}': two parts are named '{key}'; each part's state is kept under its name"
                    )
                named[key] = part
        return named

    def server_step(self, x: torch.Tensor, updates: RoundUpdates) -> torch.Tensor:
        d = self.aggregator(x, updates)
        updates.info["pseudo_grad_norm"] = float(d.norm())
        x_new = self.optimizer(x, d, updates)
        for hook in self.post_steps:
            x_new = hook(x_new, updates)
        for correction in self.corrections:
            correction.end_round(updates)
        if self.objective is not None:
            self.objective.end_round(updates)
        return x_new

    def state_dict(self) -> dict:
        return {name: part.state_dict() for name, part in self.parts().items()}

    def load_state_dict(self, state: dict) -> None:
        for name, part in self.parts().items():
            part.load_state_dict(state.get(name, {}))


def lr_schedule(setting: dict):
    """The client lr of round t without plug-ins (fedrepro.schedule.client_lr), as a function of t."""
    return functools.partial(client_lr, setting)
