"""Resume where training draws from torch's global generator: FedNova's VGG-11 (dropout) and CIFAR's crop/flip
augmentation. A run stopped after k rounds through the engine's checkpoint and continued by a new trainer (as a
restarted job does) equals the uninterrupted run bit for bit on CPU.

The models are the shipped VGG-11 class with narrow convolutions (its layer layout, dropout included, unchanged)
and a small CNN, on 32x32 three-channel images generated here, so each run takes a fraction of a second.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fedrepro.configure import settings
from fedrepro.data.cifar import ImageDataset
from fedrepro.models import vgg
from fedrepro.run.batchable import dropout_layers
from fedrepro.run.trainer import Trainer

# VGG-11's configuration "A" (8 convolutions, 5 poolings) with narrow layers; the last one keeps 512 channels,
# which the classifier (Dropout-FC(512, 512)-ReLU-Dropout-FC(512, 512)-ReLU-FC) expects
TINY_VGG11 = [4, "M", 4, "M", 8, 8, "M", 8, 8, "M", 8, 512, "M"]
ROUNDS, STOP = 5, 2


def _images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 10
    images = torch.randint(0, 120, (n, 3, 32, 32), generator=gen) + 12 * labels.view(-1, 1, 1, 1)
    return images.to(torch.uint8), labels


def _tiny_vgg11(monkeypatch) -> torch.nn.Module:
    monkeypatch.setattr(vgg, "VGG11_CFG", TINY_VGG11)
    torch.manual_seed(0)
    return vgg.VGG11(3, 10)


def _small_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 10),
    )


def _trainer(run_dir, model: str, module: torch.nn.Module, augment: bool) -> Trainer:
    images, labels = _images(160, 0)
    test_images, test_labels = _images(40, 1)
    mean, std = torch.tensor([0.49, 0.48, 0.45]), torch.tensor([0.25, 0.24, 0.26])
    train = ImageDataset(images, labels, mean, std, augment=augment)
    test = ImageDataset(test_images, test_labels, mean, std)
    parts = [np.arange(i * 40, (i + 1) * 40) for i in range(4)]  # equal clients: no size decides the path
    setting = settings.resolve(
        {
            "dataset": "cifar10",
            "model": model,
            "num_clients": 4,
            "participation": 0.5,
            "rounds": ROUNDS,
            "batch_size": 20,
            "local_epochs": 1,
            "device": "cpu",
            "eval_every": 1,
            "seed": 3,
            "client": {"lr": 0.05},
        }
    )
    return Trainer(setting, run_dir, None, None, datasets=(train, test), parts=parts, module=module)


def _rows(trainer) -> pd.DataFrame:
    return pd.DataFrame(trainer.rows).drop(columns=["seconds", "wall_time"])


CASES = {
    "vgg11-dropout": ("vgg11", lambda mp: _tiny_vgg11(mp), False),
    "crop-flip": ("cnn", lambda mp: _small_cnn(), True),
}


@pytest.mark.parametrize("case", CASES)
def test_a_resumed_run_with_global_randomness_equals_the_uninterrupted_one(case, tmp_path, monkeypatch):
    model, build, augment = CASES[case]
    reference = _trainer(tmp_path / "ref", model, build(monkeypatch), augment)
    # the case draws from the global generator in training: dropout layers, or augmented batches
    assert bool(dropout_layers(reference.model.module)) != augment and reference.inputs.train.augment == augment
    reference.run(checkpoint_every=0, progress=False)
    stopped = _trainer(tmp_path / "run", model, build(monkeypatch), augment)
    assert stopped.run(checkpoint_every=0, progress=False, stop_after=STOP)["status"] == "stopped"
    torch.manual_seed(12345)  # whatever the process drew in between must not matter
    torch.rand(100)
    resumed = _trainer(tmp_path / "run", model, build(monkeypatch), augment)
    resumed.run(checkpoint_every=0, progress=False)
    assert resumed.start_round == STOP, "the second trainer continued from the checkpoint"
    assert len(resumed.rows) == ROUNDS
    pd.testing.assert_frame_equal(_rows(reference), _rows(resumed), check_exact=True)
    assert torch.equal(reference.model.flat, resumed.model.flat), "the final models differ"


@pytest.mark.parametrize("case", CASES)
def test_the_randomness_is_what_the_resume_must_restore(case, tmp_path, monkeypatch):
    """Without the generator's state the continuation draws other masks or crops: the same stop and resume with
    the global generator reseeded after the restore ends at another model. So the test above can fail."""
    model, build, augment = CASES[case]
    reference = _trainer(tmp_path / "ref", model, build(monkeypatch), augment)
    reference.run(checkpoint_every=0, progress=False)
    _trainer(tmp_path / "run", model, build(monkeypatch), augment).run(
        checkpoint_every=0, progress=False, stop_after=STOP
    )
    resumed = _trainer(tmp_path / "run", model, build(monkeypatch), augment)
    restore = Trainer.restore

    def restore_but_reseed(self, state):
        restore(self, state)
        torch.manual_seed(self.setting["seed"])

    monkeypatch.setattr(Trainer, "restore", restore_but_reseed)
    resumed.run(checkpoint_every=0, progress=False)
    assert resumed.start_round == STOP
    assert not torch.equal(reference.model.flat, resumed.model.flat)
