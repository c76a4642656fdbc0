"""Shared test helpers: generated data in the real idx.gz format, environments for subprocesses.

Nothing here needs the internet. Datasets are generated (tiny, random, but in Fashion-MNIST's
on-disk format) so that the real download, extraction and loading code runs on them.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FMNIST_FILES = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
]
DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")


def pytest_configure(config):
    """One torch thread in every test, whichever files a run collects (it was set by eight modules at
    import, so a test's kernels depended on the selection). The suite trains tiny models, where more
    threads cost more than they give on a small shared machine; no assertion depends on the count,
    since every numerical test compares with a reference computed in the same process."""
    import torch

    torch.set_num_threads(1)
    fmnist_source()  # a FEDREPRO_TEST_FMNIST it does not take stops the run before any test


# --------------------------------------------------------------------------- idx files


def idx_images(images: np.ndarray) -> bytes:
    """idx3-ubyte: magic 0x00000803, then count, rows, cols (big-endian), then uint8 pixels."""
    n, rows, cols = images.shape
    return struct.pack(">IIII", 0x0803, n, rows, cols) + images.astype(np.uint8).tobytes()


def idx_labels(labels: np.ndarray) -> bytes:
    """idx1-ubyte: magic 0x00000801, then count, then uint8 labels."""
    return struct.pack(">II", 0x0801, len(labels)) + labels.astype(np.uint8).tobytes()


def fake_fmnist_arrays(n_train: int, n_test: int, seed: int = 0):
    """Random 28x28 images whose mean brightness depends on the label, so a model can learn a bit."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = np.arange(n) % 10
        rng.shuffle(labels)
        images = rng.integers(0, 60, size=(n, 28, 28)) + (labels * 19)[:, None, None]
        out[split] = (images.astype(np.uint8), labels.astype(np.uint8))
    return out


def fmnist_sized_arrays(seed: int = 0):
    """Fashion-MNIST's sizes (60000 training and 10000 test images) on a black background, as its own
    images are: label k is a band of noisy pixels on rows 2k to 2k+7, which an MLP learns in a round.
    The noise is confined to the band so that the .gz files stay under the published sizes, which the
    downloader reads no further than (fedrepro.data.fmnist.FMNIST_BYTES)."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", 60000), ("t10k", 10000)):
        labels = (np.arange(n) % 10).astype(np.uint8)
        rng.shuffle(labels)
        images = np.zeros((n, 28, 28), dtype=np.uint8)
        for k in range(10):
            rows = labels == k
            images[rows, 2 * k : 2 * k + 8] = rng.integers(100, 256, size=(int(rows.sum()), 8, 28), dtype=np.uint8)
        out[split] = (images, labels)
    return out


def write_fake_fmnist(
    folder: Path,
    n_train: int = 400,
    n_test: int = 100,
    seed: int = 0,
    gz: bool = True,
    raw: bool = False,
    arrays: dict | None = None,
) -> dict[str, dict]:
    """Write the four Fashion-MNIST files; return {file name: {"md5", "sha256_content"}}.

    ``gz`` writes the published ``*.gz`` files; ``raw`` also writes the decompressed files,
    which is what torchvision's reader loads. ``arrays`` (as fake_fmnist_arrays returns) replaces
    the ``n_train``/``n_test`` random images.
    """
    folder.mkdir(parents=True, exist_ok=True)
    arrays = arrays or fake_fmnist_arrays(n_train, n_test, seed)
    sums = {}
    for split in ("train", "t10k"):
        images, labels = arrays[split]
        for kind, content in (("images-idx3", idx_images(images)), ("labels-idx1", idx_labels(labels))):
            name = f"{split}-{kind}-ubyte"
            blob = gzip.compress(content, mtime=0)
            if gz:
                (folder / f"{name}.gz").write_bytes(blob)
            if raw:
                (folder / name).write_bytes(content)
            sums[f"{name}.gz"] = {
                "md5": hashlib.md5(blob).hexdigest(),
                "sha256_content": hashlib.sha256(content).hexdigest(),
            }
    return sums


@pytest.fixture(scope="session")
def tiny_data_root(tmp_path_factory) -> Path:
    """A data root torchvision's FashionMNIST reader accepts: <root>/FashionMNIST/raw/*-ubyte."""
    root = tmp_path_factory.mktemp("tiny_fmnist")
    write_fake_fmnist(root / "FashionMNIST" / "raw", n_train=400, n_test=100, raw=True)
    return root


@pytest.fixture
def fmnist_mirror(tmp_path, monkeypatch) -> Path:
    """Generated Fashion-MNIST .gz files, and the downloader's checksums and expected sizes set to theirs."""
    from torchvision.datasets import FashionMNIST

    from fedrepro.data import fmnist

    folder = tmp_path / "mirror"
    sums = write_fake_fmnist(folder, n_train=50, n_test=20)
    monkeypatch.setattr(FashionMNIST, "resources", [(name, sums[name]["md5"]) for name in FMNIST_FILES])
    monkeypatch.setattr(fmnist, "FMNIST_CONTENT_SHA256", {n: s["sha256_content"] for n, s in sums.items()})
    monkeypatch.setattr(fmnist, "FMNIST_BYTES", {n: (folder / n).stat().st_size for n in FMNIST_FILES})
    return folder


def train_args(setting: dict, out, partition_dir, data_root, *extra: str) -> list[str]:
    """The ``fedrepro train`` arguments of a test run: one torch thread, no progress bar, then ``extra``."""
    return [
        "train",
        "--setting",
        json.dumps(setting),
        "--partition",
        str(partition_dir),
        "--data-root",
        str(data_root),
        "--out",
        str(out),
        "--no-progress",
        "--threads",
        "1",
        *extra,
    ]


def make_partition(data_root: Path, out: Path, num_clients: int = 4, kind: str = "iid", **extra) -> Path:
    """Partition the training labels under ``data_root`` into ``out`` with the real code."""
    from fedrepro import data, partitions
    from fedrepro.partitions import records as partition_records

    setting = {"dataset": "fmnist", "num_clients": num_clients, "kind": kind, "seed": 1, **extra}
    labels = data.train_labels("fmnist", data_root)
    parts = partitions.make(labels, setting)
    partition_records.save(out, setting, labels, parts, 10)
    return out


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    """A port free a moment ago. Another process may take it before a server binds it, so a caller
    that starts a server on it retries with another port when the bind fails (tests/tracking/test_tracking.py)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def down_server() -> str:
    """The URL of a server that is down: every connection to its port on 127.0.0.1 is refused, for the
    whole test. The socket is bound, so no other process can take the port, but it never listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def subprocess_env(tracking_uri: str | None = None, fmnist: "FmnistData | None" = None, **extra) -> dict:
    """The environment for fedrepro/snakemake subprocesses: the venv first, one torch thread; with
    ``fmnist``, what its processes need to accept that Fashion-MNIST."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.pop("MLFLOW_TRACKING_URI", None)
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    env.update(extra)
    return fmnist.add_to(env) if fmnist else env


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch) -> str:
    """A private sqlite MLflow store; never the project's mlflow.db."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def snakemake_cmd(workdir: Path, *args: str) -> list[str]:
    """snakemake on the project's Snakefile, run in another working directory."""
    return [str(BIN / "snakemake"), "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir), *args]


def run_snakemake(workdir: Path, *args: str, env=None, timeout=900) -> subprocess.CompletedProcess:
    """``snakemake_cmd`` run to its end, its output captured (by default in ``subprocess_env()``)."""
    return subprocess.run(
        snakemake_cmd(workdir, *args), capture_output=True, text=True, env=env or subprocess_env(), timeout=timeout
    )


def job_counts(output: str) -> dict[str, int]:
    """Parse snakemake's 'Job stats' table (job / count) from its output."""
    lines = output.splitlines()
    counts: dict[str, int] = {}
    for i, line in enumerate(lines):
        if line.strip().startswith("Job stats"):
            for row in lines[i + 3 :]:
                parts = row.split()
                if len(parts) != 2 or not parts[1].isdigit():
                    break
                counts[parts[0]] = int(parts[1])
            break
    return counts


def write_yaml(path: Path, obj) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(obj, sort_keys=False))
    return path


def have_debian_fmnist() -> bool:
    return all((DEBIAN_FMNIST / f).exists() for f in FMNIST_FILES)


# --------------------------------------------------------------------------- the end-to-end tests' data

# The tuning stage's tests: a small FMNIST experiment, and a tune block of FedProx's mu
TUNING_BASE = {
    "dataset": "fmnist",
    "model": "mlp",
    "num_clients": 4,
    "participation": 0.5,
    "rounds": 2,
    "device": "cpu",
    "client": {"lr": 0.02},
    "partition": {"kind": "iid", "seed": 1},
    "ima": {"window": 1, "start_round": 1},
}
TUNE_PROX = {"when": {"algorithm": "fedprox"}, "grid": {"fedprox.mu": [0.1, 0.01]}, "seeds": [7]}

FMNIST_CHOICE = "FEDREPRO_TEST_FMNIST"
GENERATED_FMNIST_HOOK = ROOT / "tests" / "generated_fmnist"


def fmnist_source() -> tuple[str, str]:
    """("debian" or "generated", why): Debian's files when installed, unless FEDREPRO_TEST_FMNIST=generated
    asks for the generated ones (how the generated path is tested on a machine that has the package)."""
    choice = os.environ.get(FMNIST_CHOICE, "")
    if choice not in ("", "generated"):
        raise pytest.UsageError(f"{FMNIST_CHOICE}={choice!r}: the one value it takes is 'generated'")
    if choice:
        return "generated", f"{FMNIST_CHOICE}=generated"
    if have_debian_fmnist():
        return "debian", f"Debian's dataset-fashion-mnist in {DEBIAN_FMNIST}"
    return "generated", f"Debian's dataset-fashion-mnist is not in {DEBIAN_FMNIST}"


class FmnistData:
    """The Fashion-MNIST mirror the end-to-end tests' workflows download from, and what their processes need
    to accept it: nothing for Debian's files; for generated ones, their checksums (generated_fmnist/)."""

    def __init__(self, source: str, mirror: Path, sums: Path | None = None):
        self.source, self.mirror, self.sums = source, f"{mirror}/", sums

    def add_to(self, env: dict) -> dict:
        if self.sums is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(GENERATED_FMNIST_HOOK), env.get("PYTHONPATH")) if p)
            env["FEDREPRO_TEST_FMNIST_SUMS"] = str(self.sums)
        return env

    def params(self, params: dict) -> dict:
        """A copy of a params file's content whose Fashion-MNIST comes from this mirror alone."""
        params = json.loads(json.dumps(params))
        params.setdefault("data", {}).setdefault("mirrors", {})["fmnist"] = [self.mirror]
        return params

    def params_text(self, text: str) -> str:
        import yaml

        return yaml.safe_dump(self.params(yaml.safe_load(text)), sort_keys=False)

    def params_file(self, path: Path, folder: Path) -> Path:
        """``path`` itself on Debian's files (as CI runs it), else a copy of the same name in ``folder``."""
        if self.source == "debian":
            return path
        import yaml

        folder.mkdir(parents=True, exist_ok=True)
        return write_yaml(folder / path.name, self.params(yaml.safe_load(path.read_text())))


def generated_fmnist(folder: Path, arrays: dict | None = None) -> FmnistData:
    """Generated files (Fashion-MNIST's sizes unless ``arrays``) in ``folder``/mirror, their checksums beside."""
    sums = write_fake_fmnist(folder / "mirror", arrays=arrays or fmnist_sized_arrays())
    content = folder / "content_sha256.json"
    content.write_text(json.dumps({name: s["sha256_content"] for name, s in sums.items()}))
    return FmnistData("generated", folder / "mirror", content)


@pytest.fixture(scope="session")
def fmnist_data(tmp_path_factory) -> FmnistData:
    """The Fashion-MNIST the end-to-end tests' workflows download (fmnist_source says which)."""
    if fmnist_source()[0] == "debian":
        return FmnistData("debian", DEBIAN_FMNIST)
    return generated_fmnist(tmp_path_factory.mktemp("generated_fmnist"))


def pytest_terminal_summary(terminalreporter):
    source, why = fmnist_source()
    data = "Debian's files" if source == "debian" else "generated files in the real idx.gz format"
    terminalreporter.write_line(f"Fashion-MNIST of the end-to-end tests: {data} ({why})")


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


def read_json(path: Path):
    return json.loads(Path(path).read_text())


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture
def serve():
    """serve(folder) -> URL of a loopback HTTP mirror of that folder; all servers stop after the test."""
    servers = []

    def start(folder: Path) -> str:
        handler = functools.partial(_QuietHandler, directory=str(folder))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def file_size_limit(size: int):
    """For a child process (``preexec_fn``): no file may grow past ``size`` bytes, as on a full disk. SIGXFSZ
    ignored, so the write that crosses it fails with EFBIG (what a full disk's ENOSPC is to the code) instead of
    killing it. RLIMIT_FSIZE is POSIX and needs no privilege: it works in any Linux CI, unlike a small tmpfs."""

    def limit() -> None:
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


# --------------------------------------------------------------------------- float32 bounds (README "Floating point")

U32 = 2.0**-24  # float32's unit roundoff


def float32_forward_bound(module, x):
    """Per output, how far a float32 forward pass of a Linear/ReLU network (eval mode) can be from the exact
    one: (sum over layers of the reduction length + 1) * u times the float64 pass of the network with every
    parameter and the input replaced by its absolute value (a dot product's rounding is gamma_n sum |w x|;
    ReLU is 1-Lipschitz, so each layer's error carries forward through |W|)."""
    import copy

    import torch

    twin = copy.deepcopy(module).double().eval()
    length = sum(m.in_features + 1 for m in twin.modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        for p in twin.parameters():
            p.abs_()
        return length * U32 * twin(x.double().abs())


def float64_cross_entropy(module, x, y):
    """The mean cross-entropy of the module on (x, y) computed in float64 (the oracle), and how far a float32
    computation of it can be: a loss moves by at most twice its logits' largest error (log-sum-exp and
    picking a logit are 1-Lipschitz in the max norm), log-sum-exp over K classes rounds within (K + 4) u of
    its terms' magnitude, and a mean of N losses adds N roundings."""
    import copy
    import math

    import torch

    twin = copy.deepcopy(module).double().eval()
    with torch.no_grad():
        z = twin(x.double())
        losses = torch.nn.functional.cross_entropy(z, y, reduction="none")
    k, n = z.shape[1], len(y)
    logits = float32_forward_bound(module, x).max(1).values
    per_sample = 2 * logits + (k + 4) * U32 * (z.abs().max(1).values + math.log(k))
    return float(losses.mean()), float(per_sample.mean() + n * U32 * losses.abs().mean())


def rounding_bound(trainer, steps: int, lr: float, momentum: float, passes: int = 1) -> float:
    """How far float32 rounding alone can put one client update from the same update computed in another
    order (the batched path against the sequential one, a reference loop against the engine).

    Both paths compute each gradient entry as a float32 sum of the same R terms, added in another order
    by another kernel. Two orders of R roundings, each within eps32/2 relative, differ by about
    sqrt(R) eps32 of the largest partial sum (random walk), bounded here by G, the largest gradient entry
    (measured on the trainer's first batch of its first client, in this process). R is at most the batch
    size times the largest activation of one sample (the longest reduction of a backward pass). So one step's
    gradients differ by at most sqrt(R) eps32 G per pass (``passes``: ASAM's two), an update by lr / (1 - mu)
    times that (momentum adds a discrepancy into later steps with weights mu^k), and ``steps`` steps
    add up. Twice that covers what later gradients feed back over a few small steps (lr L < 1)."""
    import math

    import torch
    import torch.nn.functional as F

    module = trainer.model.module
    index = trainer.inputs.client_index[0][: trainer.setting["batch_size"]]
    x, y = trainer.inputs.train.batch(index)
    widest = [x[0].numel()]
    hooks = [
        m.register_forward_hook(lambda m, i, o: widest.append(o[0].numel()))
        for m in module.modules()
        if not list(m.children())
    ]
    saved = {k: v.clone() for k, v in module.state_dict().items()}  # BatchNorm statistics and counters move
    with torch.random.fork_rng():
        trainer.model.loss_and_grad(F.cross_entropy, x, y)
    for h in hooks:
        h.remove()
    module.load_state_dict(saved)  # in place: the flat buffers' views stay bound
    g = float(trainer.model.grad.abs().max())
    r = len(index) * max(widest)
    return 2 * steps * passes * lr / (1 - momentum) * math.sqrt(r) * torch.finfo(torch.float32).eps * g


@pytest.fixture
def float64_engine(monkeypatch):
    """Models, flat vectors, inputs and the engine's data-size weights in float64 for one test: the engine and
    an oracle then differ by float64 rounding (u = 2**-53), far below anything a wrong term moves. Yields the
    dataset class that hands out the samples in float64."""
    import torch

    from fedrepro.run import trainer as trainer_module

    build = trainer_module.run_inputs.build

    def build_float64(*args, **kwargs):
        inputs = build(*args, **kwargs)
        inputs.client_sizes = inputs.client_sizes.double()
        return inputs

    monkeypatch.setattr(trainer_module.run_inputs, "build", build_float64)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield _float64_dataset()
    torch.set_default_dtype(default)


def _float64_dataset():
    """The dataset class of ``float64_engine``, the parity harness's (made on use: conftest imports no torch at
    collection)."""
    from fedrepro.parity.clients import float64_dataset

    return float64_dataset()


def method_section(algorithm: str) -> dict:
    """A method's settings section as a run resolves it (every default of its fragment filled): what a test that
    builds the method's parts directly passes as their config, before overriding the keys it studies."""
    from fedrepro.configure.settings import resolve

    return resolve({"algorithm": algorithm, "evaluation": {"proxy_holdout": 100}})[algorithm]


def fabricate(run, runs_dir: Path, final_acc: float, rounds: int = 12, status: str = "finished") -> None:
    """A finished run's folder written without training (``run`` a ``fedrepro.configure.settings.Run``): its
    metrics.csv, whose last 10 rounds all have test accuracy ``final_acc``, and its summary.json."""
    import pandas as pd

    out = runs_dir / run.id
    out.mkdir(parents=True)
    acc = np.r_[np.linspace(0.1, final_acc, rounds - 10), np.full(10, final_acc)]
    pd.DataFrame(
        {
            "round": np.arange(1, rounds + 1),
            "test_acc": acc,
            "test_loss": 1 - acc,
            "train_loss": 1 - acc,
            "e_lud": 2.0,
            "lr": 0.01,
            "seconds": 0.1,
        }
    ).to_csv(out / "metrics.csv", index=False)
    summary = {
        "run": run.id,
        "status": status,
        "setting": run.setting,
        "final_acc": final_acc,
        "best_acc": final_acc,
        "e_ludd": 2.0,
        "runtime_s": 1.0,
        "device": "cpu",
        "git_commit": "abc",
        "rounds_done": rounds,
        "versions": {"torch": "x"},
    }
    (out / "summary.json").write_text(json.dumps(summary))


def mlp_proxy_problem(k: int = 3, seed: int = 0):
    """A server step's inputs in float64 on a tiny tanh MLP (4 -> 5 -> 3): the module, a flat global point x,
    the round's updates from k <= 3 clients of sizes 10, 30 and 60, and a 20-sample proxy set (x, y)."""
    import torch
    from torch import nn

    from fedrepro.parts import RoundUpdates

    g = torch.Generator().manual_seed(seed)
    module = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    dim = sum(p.numel() for p in module.parameters())
    x = torch.randn(dim, generator=g, dtype=torch.float64)
    deltas = 0.3 * torch.randn(k, dim, generator=g, dtype=torch.float64)
    sizes = torch.tensor([10.0, 30.0, 60.0][:k], dtype=torch.float64)
    updates = RoundUpdates(0, torch.arange(k), deltas, sizes, torch.ones(k), torch.zeros(k), 0.1)
    proxy_x = torch.randn(20, 4, generator=g, dtype=torch.float64)
    proxy_y = torch.randint(0, 3, (20,), generator=g)
    return module, x, updates, proxy_x, proxy_y


# --------------------------------------------------------------------------- the batched and packed paths' problems
# (tests/run/test_batched.py, test_packed.py and test_static_step.py share them)

BATCHED_BATCH = 16
# unequal sizes, as a Dir(0.1) split gives: different step counts and last batches of 8, 7, 7, 0 (full), 5
BATCHED_SIZES = [40, 7, 23, 64, 37]
PACKED_ROUNDS = 3


def batched_data(sizes, channels=1, side=28):
    import torch

    from fedrepro import data

    gen = torch.Generator().manual_seed(0)
    n = sum(sizes)
    images = torch.randint(0, 256, (n, channels, side, side), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, 10, (n,), generator=gen)
    # normalisation on: the batched path must apply it too
    return data.TensorDataset(images, labels, 0.2860, 0.3530), data.TensorDataset(
        images[:64], labels[:64], 0.2860, 0.3530
    )


def batched_trainer(
    tmp_path, mode: str, sizes=BATCHED_SIZES, model="mlp", module=None, datasets=None, **extra
) -> "fedrepro.run.trainer.Trainer":  # noqa: F821
    import torch

    from fedrepro import models
    from fedrepro.configure.settings import resolve
    from fedrepro.run.trainer import Trainer

    datasets = datasets or batched_data(sizes)
    bounds = np.cumsum([0] + list(sizes))
    parts = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]
    setting = {
        "model": model,
        "num_clients": len(sizes),
        "participation": 1.0,
        "local_epochs": 2,
        "batch_size": BATCHED_BATCH,
        "device": "cpu",
        "rounds": 4,
        "eval_every": 1,
        "client": {"lr": 0.05, "momentum": 0.5, "weight_decay": 1e-3},
    }
    for key, value in extra.items():
        setting[key] = {**setting.get(key, {}), **value} if isinstance(value, dict) else value
    torch.manual_seed(3)
    module = module() if module is not None else models.build(model, "fmnist")
    trainer = Trainer(
        resolve(setting), tmp_path / f"run-{mode}", None, None, datasets=datasets, parts=parts, module=module
    )
    trainer.cohort_mode = mode
    return trainer


def local_round(trainer, t=0, x=None):
    """One round's local training from ``x`` (default: the initial model; the sequential loop leaves the
    last client's parameters in the shared model, so a second call must not start from there)."""
    from fedrepro.run.cohorts import sample_cohort

    cohort = sample_cohort(trainer.setting["seed"], t, trainer.setting["num_clients"], trainer.k)
    if not hasattr(trainer, "x0"):
        trainer.x0 = trainer.model.flat.clone()
    return trainer.train_cohort(trainer.plan(t, cohort, (trainer.x0 if x is None else x).clone(), trainer.client_lr(t)))


def assert_updates_equal(plain, fast, bound):
    import torch

    assert torch.equal(plain.clients, fast.clients)
    assert torch.equal(plain.steps, fast.steps)
    assert plain.deltas.abs().max() > 1000 * bound, "the bound does not separate moving from not moving"
    gap = float((fast.deltas - plain.deltas).abs().max())
    assert gap <= bound, f"batched and sequential updates differ by {gap:.3e} > {bound:.3e}"


def bn_module():
    """A conv, a BatchNorm with running statistics and a linear head."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 4, 3, stride=2),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


def cifar_like(sizes, augment=True):
    import torch

    from fedrepro.data import cifar

    gen = torch.Generator().manual_seed(0)
    n = sum(sizes)
    images = torch.randint(0, 256, (n, 3, 12, 12), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, 10, (n,), generator=gen)
    mean, std = torch.tensor([0.49, 0.48, 0.45]), torch.tensor([0.25, 0.24, 0.26])
    return (
        cifar.ImageDataset(images, labels, mean, std, augment),
        cifar.ImageDataset(images[:32], labels[:32], mean, std, False),
    )


def small_cnn():
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Dropout(0.2), nn.Linear(16, 10)
    )


def from_one_global_seed(trainers, seed: int):
    """Each trainer's local round started from the same global generator state, and the state it leaves."""
    import torch

    results, states = [], []
    for trainer in trainers:
        torch.manual_seed(seed)
        results.append(local_round(trainer))
        states.append(torch.get_rng_state())
    return results, states


def packed_trainer(method: str, seed: int, run_dir, datasets, **extra) -> "fedrepro.run.trainer.Trainer":  # noqa: F821
    from fedrepro import partitions
    from fedrepro.configure.settings import resolve
    from fedrepro.ops import gpucheck
    from fedrepro.run.trainer import Trainer

    algorithm, *plugins = method.split("+")
    setting = resolve(
        {
            **gpucheck.BASE,
            "rounds": PACKED_ROUNDS,
            "algorithm": algorithm,
            "plugins": plugins,
            "seed": seed,
            **gpucheck.METHOD_EXTRAS.get(method, {}),
            **extra,
            "device": "cpu",
        }
    )
    # each run its own partition draw
    parts = partitions.make(
        datasets[0].labels.numpy(),
        {"kind": "iid", "seed": seed, "num_clients": setting["num_clients"], "dataset": "fmnist"},
    )
    return Trainer(setting, run_dir, None, None, datasets=datasets, parts=parts)


def packed_alone(method, seed, run_dir, datasets, **extra):
    trainer = packed_trainer(method, seed, run_dir, datasets, **extra)
    trainer.cohort_mode = "on"
    summary = trainer.run(checkpoint_every=0, progress=False)
    return trainer, summary
