"""The method API: what a method written outside fedrepro is built from, in one import (docs/methods.md).

    from fedrepro import api
    API_VERSION = 1                                     # the version the module was written for

    class TrimmedMean(api.Aggregator): ...              # client updates -> pseudo-gradient d
    def build(setting, ctx: api.BuildContext) -> api.Algorithm:
        return api.Algorithm("trimmed", TrimmedMean(...), api.ServerSGD(setting["server"]["lr"]))

The parts (``fedrepro.parts``): a client objective (``ClientObjective``), gradient corrections
(``GradientCorrection``), hooks at a client's begin and end and at the end of a round (``ClientHook``), an
aggregator, a server optimizer and post-step hooks (``PostStep``); each declares its state by attribute name
(``Part.state``, ``Part.subparts``) and may name itself (``Part.name``) for checkpoints. The round plan is the
method's ``ClientPlan``: the client lr of each round, each client's local epochs and batch size, each the
setting's unless the method declares it. The trainer reads these fields and nothing else of a method.

``API_VERSION`` changes when a name here changes meaning or goes; adding a name keeps it. A method module
whose ``API_VERSION`` differs is refused before any job, with a line naming the two versions.
"""

from __future__ import annotations

from fedrepro.algorithms import BuildContext
from fedrepro.external import API_VERSION
from fedrepro.parts import (
    THE_SETTINGS,
    Aggregator,
    Algorithm,
    ClientHook,
    ClientObjective,
    ClientPlan,
    ClientRun,
    GradientCorrection,
    Part,
    PostStep,
    RoundUpdates,
    ServerOptimizer,
    lr_schedule,
)
from fedrepro.server import ServerSGD, UniformMean, WeightedMean
from fedrepro.server_optim import ServerAdam, ServerAMS, ServerYogi

__all__ = [
    "API_VERSION",
    "THE_SETTINGS",
    "Aggregator",
    "Algorithm",
    "BuildContext",
    "ClientHook",
    "ClientObjective",
    "ClientPlan",
    "ClientRun",
    "GradientCorrection",
    "Part",
    "PostStep",
    "RoundUpdates",
    "ServerAMS",
    "ServerAdam",
    "ServerOptimizer",
    "ServerSGD",
    "ServerYogi",
    "UniformMean",
    "WeightedMean",
    "lr_schedule",
]
