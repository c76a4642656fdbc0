"""The benchmark's two baselines beside the engine (``fedrepro bench``, bench.py): (b) FedAvg as the papers'
public code writes it, (c) the same SGD steps with no federated bookkeeping at all."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from fedrepro.ops.bench_settings import BenchSetting
from fedrepro.run.cohorts import sample_cohort

# ----------------------------------------------------------------------------- (b) reference


class ImageArray(torch.utils.data.Dataset):
    """A torchvision-style dataset: uint8 arrays on the CPU, each sample a PIL image then ToTensor,
    as ``torchvision.datasets.FashionMNIST``/``CIFAR10.__getitem__`` do."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        from torchvision import transforms

        # HWC (CIFAR-10) or HW (Fashion-MNIST), the layouts torchvision keeps its data in; PIL reads
        # them as RGB and L images
        self.data = images.permute(0, 2, 3, 1).numpy() if images.shape[1] == 3 else images[:, 0].numpy()
        self.targets = labels.tolist()
        self.transform = transforms.ToTensor()

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        from PIL import Image

        return self.transform(Image.fromarray(self.data[i])), self.targets[i]


def reference_dataset(bench: BenchSetting, images, labels, origin: str, data_root) -> torch.utils.data.Dataset:
    if bench.dataset == "fmnist" and origin == "real":
        from torchvision import datasets, transforms

        return datasets.FashionMNIST(str(data_root), train=True, download=False, transform=transforms.ToTensor())
    return ImageArray(images, labels)


class ReferenceLoop:
    """FedAvg written the way reference code is: deepcopy, DataLoader, optim.SGD, state_dict average."""

    def __init__(self, module: nn.Module, dataset, parts, bench: BenchSetting, device: torch.device, seed: int):
        self.model = copy.deepcopy(module).to(device)
        self.dataset, self.parts, self.bench, self.device, self.seed = dataset, parts, bench, device, seed

    def round(self, t: int) -> None:
        b = self.bench
        cohort = sample_cohort(self.seed, t, b.num_clients, b.per_round)
        states, sizes = [], []
        for c in cohort:
            local = copy.deepcopy(self.model)
            local.train()
            optimizer = torch.optim.SGD(local.parameters(), lr=b.lr)
            loader = torch.utils.data.DataLoader(
                torch.utils.data.Subset(self.dataset, self.parts[c].tolist()), batch_size=b.batch_size, shuffle=True
            )
            batch_loss = []
            for _ in range(b.epochs):
                for x, y in loader:
                    x, y = x.to(self.device), y.to(self.device)
                    optimizer.zero_grad()
                    loss = F.cross_entropy(local(x), y)
                    loss.backward()
                    optimizer.step()
                    batch_loss.append(loss.item())
            states.append(copy.deepcopy(local.state_dict()))
            sizes.append(len(self.parts[c]))
        total = sum(sizes)
        averaged = {key: sum(state[key] * (n / total) for state, n in zip(states, sizes)) for key in states[0]}
        self.model.load_state_dict(averaged)


# ----------------------------------------------------------------------------- (c) floor


class ComputeFloor:
    """The round's SGD steps and nothing else: prepared float batches on the device, one model."""

    def __init__(
        self,
        module: nn.Module,
        images: torch.Tensor,
        labels: torch.Tensor,
        bench: BenchSetting,
        parts,
        device: torch.device,
        seed: int,
    ):
        self.model = copy.deepcopy(module).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=bench.lr)
        gen = torch.Generator().manual_seed(seed)
        pool = torch.randint(0, len(labels), (8, bench.batch_size), generator=gen)
        self.batches = [(images[i].to(device).float().div_(255.0), labels[i].to(device)) for i in pool]
        self.bench, self.parts, self.seed = bench, parts, seed

    def batch_sizes(self, t: int) -> list[int]:
        """The engine's batch sizes in round t: full batches and each client's last partial one."""
        b = self.bench
        sizes = []
        for c in sample_cohort(self.seed, t, b.num_clients, b.per_round):
            n = len(self.parts[c])
            per_epoch = [b.batch_size] * (n // b.batch_size) + ([n % b.batch_size] if n % b.batch_size else [])
            sizes += per_epoch * b.epochs
        return sizes

    def round(self, t: int) -> int:
        sizes = self.batch_sizes(t)
        for step, size in enumerate(sizes):
            x, y = self.batches[step % len(self.batches)]
            self.optimizer.zero_grad()
            F.cross_entropy(self.model(x[:size]), y[:size]).backward()
            self.optimizer.step()
        return len(sizes)
