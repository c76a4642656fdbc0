"""The method API: a method's client plan is declared (the trainer probes no attribute of a method), every
built-in method and plug-in declares the plan it had, and what a build returns is checked against the API."""

from __future__ import annotations

import ast

import numpy as np
import pytest
import torch

from fedrepro import algorithms, api, data, identity, models
from fedrepro.algorithms import ima, random_batch, random_epochs
from fedrepro.configure import registry
from fedrepro.configure.settings import resolve
from fedrepro.external import MethodError
from fedrepro.parts import lr_schedule
from fedrepro.run.trainer import Trainer

SIZES = [40, 24, 33, 17, 30, 26]
FEATURE_MODELS = {"fedfa": "cnn"}  # methods that read a feature extractor and a classifier


def _setting(algorithm: str, **extra) -> dict:
    setting = {
        "algorithm": algorithm,
        "dataset": "fmnist",
        "model": FEATURE_MODELS.get(algorithm.split("+")[0], "mlp"),
        "num_clients": len(SIZES),
        "participation": 0.5,
        "local_epochs": 2,
        "batch_size": 8,
        "rounds": 8,
        "seed": 5,
        "device": "cpu",
        "client": {"lr": 0.05, "lr_decay": 0.9},
        "evaluation": {"proxy_holdout": 100},
        "ima": {"start_round": 4, "window": 2, "decay": "epoch", "cycle_rounds": 1},
    }
    setting.update(extra)
    return resolve({k: v for k, v in setting.items() if k != "ima" or "ima" in algorithm})


def _datasets():
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (sum(SIZES), 1, 28, 28), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, 10, (sum(SIZES),), generator=gen)
    return data.TensorDataset(images, labels, 0.2860, 0.3530), data.TensorDataset(
        images[:200], labels[:200], 0.2860, 0.3530
    )


def _trainer(tmp_path, setting) -> Trainer:
    bounds = np.cumsum([0] + SIZES)
    parts = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(SIZES))]
    torch.manual_seed(3)
    return Trainer(
        setting,
        tmp_path / "run",
        None,
        None,
        datasets=_datasets(),
        parts=parts,
        module=models.build(setting["model"], "fmnist"),
    )


def _kept_plan(setting: dict, sizes: dict[int, int]):
    """The plan the trainer took before methods declared it: the setting's lr, epochs and batch size, replaced by
    what each plug-in's apply set (ima's lr schemes and epoch drop, random_epochs' and random_batch's draws),
    written from the plug-ins' own functions."""
    plugins, s = setting["plugins"], setting
    lr = lr_schedule(s)
    epochs = lambda t, c: s["local_epochs"]  # noqa: E731
    if "ima" in plugins:
        start = s["ima"]["start_round"]
        lr = ima.lr_schedule(lr, s["ima"], start)
        if s["ima"]["decay"] == "epoch":
            epochs = lambda t, c: max(
                1, s["local_epochs"] - (0 if t < start else (t - start) // s["ima"]["cycle_rounds"])
            )  # noqa: E731
    if "random_epochs" in plugins:
        epochs = random_epochs.RandomEpochs(s["seed"], s["random_epochs"]["low"], s["random_epochs"]["high"])
    batch = (
        random_batch.RandomBatch(s["seed"], s["random_batch"]["low"])
        if "random_batch" in plugins
        else lambda t, c, n: s["batch_size"]
    )
    return (
        [lr(t) for t in range(s["rounds"])],
        [[epochs(t, c) for c in sizes] for t in range(s["rounds"])],
        [[batch(t, c, n) for c, n in sizes.items()] for t in range(s["rounds"])],
    )


COMBOS = [
    *sorted(registry.ALGORITHMS),
    *(f"fedavg+{p}" for p in sorted(registry.PLUGINS)),
    "fedprox+ima+random_epochs",
    "fedavgm+aware+random_batch",
]


@pytest.mark.parametrize("combo", COMBOS)
def test_every_method_declares_the_client_plan_it_had(tmp_path, combo):
    setting = _setting(combo)
    trainer = _trainer(tmp_path, setting)
    sizes = {c: len(trainer.inputs.client_index[c]) for c in range(len(SIZES))}
    lrs, epochs, batches = _kept_plan(setting, sizes)
    for t in range(setting["rounds"]):
        plan = trainer.plan(t, np.arange(len(SIZES)), trainer.model.flat, trainer.client_lr(t))
        assert (plan.lr, plan.epochs, plan.batches) == (lrs[t], epochs[t], batches[t]), t
    if any(p in setting["plugins"] for p in ("ima", "random_epochs", "random_batch")):
        # the plug-in changes the plan somewhere (else this comparison could not tell its plan from the setting's)
        assert (lrs, epochs, batches) != _kept_plan({**setting, "plugins": []}, sizes)


def test_the_trainer_probes_no_attribute_of_a_method():
    tree = ast.parse((identity.PACKAGE / "run" / "trainer.py").read_text())
    probes = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
    ]
    assert probes == [], f"run/trainer.py probes attributes at lines {probes}"


def test_a_build_that_returns_no_method_of_the_api_is_refused_in_one_line():
    good = api.Algorithm("x", api.WeightedMean(), api.ServerSGD(1.0))
    algorithms.built(good, "x")
    for broken, says in [
        (object(), "not a fedrepro.api.Algorithm"),
        (api.Algorithm("x", api.ServerSGD(1.0), api.ServerSGD(1.0)), "aggregator is a ServerSGD"),
        (
            api.Algorithm("x", api.WeightedMean(), api.ServerSGD(1.0), post_steps=[api.WeightedMean()]),
            r"post_steps\[0\] is a WeightedMean",
        ),
    ]:
        with pytest.raises(MethodError, match=says) as err:
            algorithms.built(broken, "x")
        assert "\n" not in str(err.value)


def test_parts_may_name_their_state_and_two_of_one_name_are_refused():
    class Hook(api.PostStep):
        name = "window"
        state = ("kept",)

        def __init__(self):
            self.kept = torch.zeros(2)

    algorithm = api.Algorithm("x", api.WeightedMean(), api.ServerSGD(1.0), post_steps=[Hook()])
    assert set(algorithm.state_dict()) == {"aggregator", "optimizer", "window"}
    algorithm.post_steps.append(Hook())
    with pytest.raises(ValueError, match="two parts are named 'window'"):
        algorithm.state_dict()
