"""Does this checkout's code reproduce the first rounds of finished runs exactly?

    PYTHONPATH=src python scripts/replay_rounds.py PROJECT [ROUNDS]

PROJECT is the checkout the runs ran in (its results/manifests, results/runs, results/partitions and
data/fmnist are read). Every run its newest manifest names that has a metrics.csv is trained again for ROUNDS
rounds (default 3) from its recorded setting and partition, and each round's train and test numbers are
compared with the recorded ones. After a change meant to preserve behaviour, every line should say "same".
"""

import json
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch

from fedrepro.configure.settings import resolve
from fedrepro.run.trainer import Trainer

torch.set_num_threads(1)
root = Path(sys.argv[1])  # the worktree the runs were made in
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
manifest = json.loads(sorted((root / "results" / "manifests").glob("*.json"))[-1].read_text())
for exp in manifest["experiments"].values():
    for run in exp["runs"]:
        if not (root / "results" / "runs" / run["id"] / "metrics.csv").exists():
            continue
        old = pd.read_csv(root / "results" / "runs" / run["id"] / "metrics.csv")
        with tempfile.TemporaryDirectory() as tmp:
            # the recorded setting, completed with the defaults of settings added since (each keeps old behaviour)
            trainer = Trainer(
                resolve(run["setting"]),
                tmp,
                root / "results" / "partitions" / run["partition"],
                root / "data" / "fmnist",
            )
            for t in range(rounds):
                row = trainer.round(t)
                for key in ("train_loss", "test_acc", "test_loss", "step_norm", "e_lud"):
                    a, b = row[key], old.loc[t, key]
                    same = (a == b) or (pd.isna(a) and pd.isna(b))
                    print(f"{run['id']} round {t + 1} {key}: now {a!r} then {b!r} {'same' if same else 'DIFFERENT'}")
