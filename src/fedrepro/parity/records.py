"""A record per paper: which code (repository, commit), the command, the shim, this project's commit, the
environment and every check's numbers. docs/parity.md's matrix is rendered from these files alone."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

import torch

from fedrepro.parity import models, partitions, servers, servers_fedaware, servers_fedlaw
from fedrepro.parity.shim import commit

ROOT = Path(__file__).resolve().parents[3]
FOLDER = ROOT / "evidence" / "official_code" / "parity"
REPOSITORIES = {
    "fedaware": "dunzeng/FedAWARE",
    "fedlaw": "ZexiLee/ICML-2023-FedLAW",
    "ima": "TailinZhou/FedIMA",
    "fednova": "JYWa/FedNova",
}
SHIM = (
    "fedrepro.parity.shim.checkout_on_path: the checkout first on sys.path while its modules load (same-named "
    "modules of another checkout cleared), .cuda() and torch.cuda.set_device no-ops; FedNova: mpi4py and "
    "models.LogisticRegression placeholders (util_v4 imports both; HEAD defines no LogisticRegression); IMA: "
    "utils.tSNE and leaf.dataloader placeholders (utils.global_test imports both; HEAD ships neither); FedLAW: "
    "torch.tensor(..., device='cuda') on the CPU, the central node's proxy loader yielding fedrepro's batch order, "
    "FedBE's torch.randn_like draws fedrepro's; FedAWARE: fedaware.py's definitions only (not its script part), "
    "settings and agnews_dataset, pynvml and torch.utils.tensorboard placeholders, model.LinearReg placeholder, "
    "FeedbackSampler's shuffled list fedrepro's warmup permutation, FedLab 1.3.0 from PyPI"
)


def _project_commit() -> str:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "src"], capture_output=True, text=True)
    return head.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")


def run(paper: str, checkout, out: Path, inits: int, argv: list[str]) -> Path:
    if paper == "fedaware":
        servers_fedaware.require_fedlab()  # before the model checks' minutes
    started = time.time()
    cpu = time.process_time()
    checks = {"models": models.compare(paper, checkout, inits)}
    if paper == "fednova":
        checks["partitions"] = partitions.compare_fednova(checkout)
        checks["servers"] = servers.compare_fednova(checkout)
    if paper == "ima":
        checks["servers"] = servers.compare_ima(checkout)
    if paper == "fedlaw":
        checks["servers"] = servers_fedlaw.compare_fedlaw(checkout)
    if paper == "fedaware":
        checks["servers"] = servers_fedaware.compare_fedaware(checkout)
    record = {
        "paper": paper,
        "repository": REPOSITORIES[paper],
        "commit": commit(checkout),
        "command": f"python -m fedrepro.parity {paper} --checkout <checkout of {REPOSITORIES[paper]}> --inits {inits}",
        "shim": SHIM,
        "fedrepro_commit": _project_commit(),
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, CPU only",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_seconds": round(time.time() - started),
        "cpu_seconds_main_process": round(time.process_time() - cpu),
        "checks": checks,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{paper}.json"
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def load(folder: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))}
