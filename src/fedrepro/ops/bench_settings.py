"""The benchmark's settings: one per paper's model family, at the paper's client and batch sizes.

Apart from bench.py (which imports torch) so that the command line lists them without loading torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchSetting:
    name: str
    paper: str
    dataset: str  # fmnist (real when present, else generated) or cifar10 (generated)
    model: str
    num_clients: int
    per_round: int
    epochs: int
    batch_size: int
    partition: str  # dirichlet (unequal sizes) or shards/iid (equal sizes)
    lr: float = 0.01

    def quick(self) -> "BenchSetting":
        """A CI-size version: a tenth of the clients, at least two per round."""
        clients = max(4, self.num_clients // 10)
        return BenchSetting(
            self.name,
            self.paper,
            self.dataset,
            self.model,
            clients,
            max(2, min(clients, self.per_round // 5)),
            1,
            self.batch_size,
            self.partition,
            self.lr,
        )

    @property
    def step_key(self) -> str:
        """How ``fedrepro plan`` looks a step cost up: ``<dataset>/<model>:<batch size>``."""
        return f"{self.dataset}/{self.model}:{self.batch_size}"


SETTINGS = {
    "fmnist_mlp": BenchSetting("fmnist_mlp", "FedLAW", "fmnist", "mlp", 20, 20, 3, 64, "dirichlet"),
    "fmnist_cnn": BenchSetting("fmnist_cnn", "IMA", "fmnist", "cnn", 100, 10, 5, 50, "shards"),
    "cifar_cnn": BenchSetting("cifar_cnn", "FedAWARE", "cifar10", "cnn", 100, 10, 3, 64, "iid"),
}
