"""What exists: datasets, models, algorithms and plug-ins, as plain data.

This module imports nothing heavy, so the Snakefile can expand and check a grid of
thousands of runs in well under a second before any job starts.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent

DATASETS = {
    "fmnist": {"train_size": 60000, "test_size": 10000, "num_classes": 10, "shape": (1, 28, 28)},
    "cifar10": {"preprocess": True, "train_size": 50000, "test_size": 10000, "num_classes": 10, "shape": (3, 32, 32)},
    "cifar100": {"preprocess": True, "train_size": 50000, "test_size": 10000, "num_classes": 100, "shape": (3, 32, 32)},
    # Generated from a fixed seed (datasets_extra.SYNTHETIC_SEED); its 30 users are its clients.
    # smallest_test_class: its rarest class in the test set (counted from the generated files), which
    # bounds a class-balanced proxy set
    "synthetic_1_1": {"train_size": 4833, "test_size": 552, "num_classes": 10, "shape": (60,), "natural_clients": 30,
                      "smallest_test_class": 14},
    "synthetic_0_0": {"train_size": 4833, "test_size": 552, "num_classes": 10, "shape": (60,), "natural_clients": 30,
                      "smallest_test_class": 8},
    # text.py: texts tokenised by the model's tokenizer to a fixed length (pretrained.max_length)
    "agnews": {"text": True, "train_size": 120000, "test_size": 7600, "num_classes": 4, "shape": (100,)},
}

MODELS = {
    "mlp": {"datasets": ["fmnist"], "doc": "Linear 784-200-200-10 with ReLU (FedLAW, FedAWARE code)"},
    "lenet5": {"datasets": ["fmnist"], "doc": "FedLAW code's LeNet5: conv16-conv32 (5x5, pad 2), Linear 1568-10"},
    "cnn": {"datasets": ["fmnist", "cifar10", "cifar100"],
            "doc": "IMA's two-conv CNN: conv32-conv32 (5x5), FC 512-384-128-10; CIFAR: conv64-conv64, FC 1600-384-128"},
    # models_extra.py
    "cnn_fedaware": {"datasets": ["cifar10", "cifar100"], "params": {"cifar10": 122570},
                     "doc": "FedAWARE's CIFAR-10 CNN: conv32-conv64-conv64 (3x3), FC 1024-64-10, Kaiming/N(0,.01) init"},
    "simplecnn": {"datasets": ["cifar10", "cifar100"], "params": {"cifar10": 122570},
                  "doc": "FedLAW's SimpleCNN: the same layers as cnn_fedaware, PyTorch default init"},
    "resnet18_gn32": {"datasets": ["cifar10", "cifar100"], "params": {"cifar100": 11220132},
                      "doc": "FedAWARE's CIFAR ResNet-18 with GroupNorm(32), Linear 512-classes"},
    "resnet18_gn2": {"datasets": ["cifar10", "cifar100"],
                     "doc": "IMA's CIFAR ResNet-18 with GroupNorm(2), 512-128 linear projector, 128-classes"},
    "vgg11": {"datasets": ["cifar10", "cifar100"], "params": {"cifar10": 9750922},
              "doc": "FedNova's VGG-11 (config A, no normalisation, dropout classifier 512-512-classes)"},
    "vgg11_gn2": {"datasets": ["cifar10", "cifar100"],
                  "doc": "IMA's VGG-11 with GroupNorm(2) after every conv, 512-128 projector, 128-classes"},
    "resnet20": {"datasets": ["cifar10", "cifar100"],
                 "doc": "FedLAW's CIFAR ResNet-20 (16/32/64); BatchNorm on batch statistics only (no running stats)"},
    "resnet56": {"datasets": ["cifar10", "cifar100"],
                 "doc": "FedLAW's CIFAR ResNet-56 (16/32/64); BatchNorm on batch statistics only (no running stats)"},
    "logreg": {"datasets": ["synthetic_1_1", "synthetic_0_0"], "doc": "multinomial logistic regression 60-10 (FedNova)"},
    # FedLAW Tables 1, 9: the paper and its code leave both undefined; ours (models_extra) with counts by hand
    "resnet8": {"datasets": ["cifar10", "cifar100"], "params": {"cifar10": 78042},
                "doc": "CIFAR ResNet-8 (one BasicBlock per 16/32/64 stage, as ResNet-20/56); BatchNorm on batch statistics"},
    "alexnet": {"datasets": ["cifar10", "cifar100"], "params": {"cifar10": 2472266},
                "doc": "CIFAR AlexNet: convs 64-192-384-256-256 (11/4, 5, 3, 3, 3), 3 max-pools, Linear 256-classes, no norm"},
    # text.py; weights from pretrained.path (a hub id or a local folder). The count is the one of
    # Pythia-70M's published config with a 4-way head in place of the LM head (tests/test_agnews.py).
    "pythia70m": {"datasets": ["agnews"], "pretrained": True, "params": {"agnews": 44673024},
                  "doc": "Pythia-70M (GPT-NeoX) with a sequence-classification head, all parameters fine-tuned"},
}

PARTITION_KEYS = {
    "iid": ["kind", "seed"],
    "dirichlet": ["kind", "seed", "alpha", "min_size", "balance"],
    "shards": ["kind", "seed", "classes_per_client", "distinct"],
    # CIFAR-100's Pachinko allocation: alpha over coarse labels, beta over each one's fine labels
    "pachinko": ["kind", "seed", "alpha", "beta", "samples_per_client"],
    # the dataset's own clients (Synthetic's users); nothing to draw
    "natural": ["kind"],
}

# Sections of a setting that only some algorithms or plug-ins read; the others are pruned
# from the resolved setting so that they do not enter its hash.
OPTIONAL_SECTIONS = {"fedprox", "scaffold", "feddyn", "fednova", "fedlaw", "fedaware", "ima", "aware",
                     "fedavgm", "fedcm", "fedadam", "fedyogi", "fedams", "random_epochs",
                     "fedasam", "fedfa", "fedgma", "feddf", "fedbe", "serverft"}

def _proximal_check(section: str):
    def check(setting: dict) -> list[str]:
        mu, lr = setting[section]["mu"], setting["client"]["lr"]
        return [f"{section}.mu * client.lr = {mu * lr:g} must be < 1 (a local proximal step would overshoot "
                f"x_global)"] if mu * lr >= 1 else []
    return check


def _fednova_vr_check(setting: dict) -> list[str]:
    # FedNova-VR corrects with every client's d_i of the previous round: it needs them all, every round
    problems = []
    if setting["fednova"].get("vr") and setting["participation"] < 1:
        problems.append(f"fednova.vr = true needs participation = 1 (every client's normalised gradient of the "
                        f"previous round); participation = {setting['participation']}")
    if setting["fednova"].get("vr") and setting["fednova"]["mu"] > 0 and setting["client"]["momentum"] > 0:
        # the code's ||a_i||_1 recursion is not the correction's weight when both act, so d_i would be wrong
        problems.append(f"fednova.vr = true with both fednova.mu = {setting['fednova']['mu']} and client.momentum = "
                        f"{setting['client']['momentum']}: d_i is exact with one of them only; set one to 0")
    return problems


def _random_epochs_check(setting: dict) -> list[str]:
    c = setting["random_epochs"]
    return [f"random_epochs.low = {c['low']} exceeds random_epochs.high = {c['high']}"] if c["low"] > c["high"] else []


# An algorithm is a preset of named parts (see fedrepro.algorithms); ``sections`` are the
# setting sections it reads, ``modules`` the source files its runs depend on.
ALGORITHMS: dict[str, dict] = {
    "fedavg": {"sections": [], "modules": ["algorithms/fedavg.py"]},
    "fedavgm": {"sections": ["fedavgm"], "modules": ["algorithms/fedavgm.py"]},
    "fedprox": {"sections": ["fedprox"], "modules": ["algorithms/fedprox.py"], "checks": [_proximal_check("fedprox")]},
    "scaffold": {"sections": [], "modules": ["algorithms/scaffold.py"]},
    "feddyn": {"sections": ["feddyn"], "modules": ["algorithms/feddyn.py"]},
    "fedcm": {"sections": ["fedcm"], "modules": ["algorithms/fedcm.py"]},
    "fedadam": {"sections": ["fedadam"], "modules": ["algorithms/fedadam.py", "server_optim.py"]},
    "fedyogi": {"sections": ["fedyogi"], "modules": ["algorithms/fedyogi.py", "server_optim.py"]},
    "fedams": {"sections": ["fedams"], "modules": ["algorithms/fedams.py", "server_optim.py"]},
    "fednova": {"sections": ["fednova"], "modules": ["algorithms/fednova.py", "algorithms/fedprox.py"],
                "checks": [_proximal_check("fednova"), _fednova_vr_check]},
}

# Models whose last layer is a Linear classifier over IMA's 128-d feature layer (FedFA's anchors live there)
FEATURE_CLASSIFIER_MODELS = {"cnn", "resnet18_gn2", "vgg11_gn2"}


def _fedfa_checks(setting: dict) -> list[str]:
    if setting["model"] not in FEATURE_CLASSIFIER_MODELS:
        return [f"fedfa needs a feature layer followed by a Linear classifier; model '{setting['model']}' is not "
                f"one of {sorted(FEATURE_CLASSIFIER_MODELS)}"]
    return []


ALGORITHMS["fedasam"] = {"sections": ["fedasam"], "modules": ["algorithms/fedasam.py"]}
ALGORITHMS["fedgma"] = {"sections": ["fedgma"], "modules": ["algorithms/fedgma.py"]}
ALGORITHMS["fedfa"] = {"sections": ["fedfa"], "modules": ["algorithms/fedfa.py"], "checks": [_fedfa_checks]}

PLUGINS: dict[str, dict] = {}
PLUGINS["random_epochs"] = {"sections": ["random_epochs"], "modules": ["algorithms/random_epochs.py"],
                            "checks": [_random_epochs_check]}


def ima_start_round(setting: dict) -> int:
    """ima.start_round (0-indexed), or 0.75 R, the paper's t_s, when it is left unset."""
    start = setting["ima"]["start_round"]
    return int(0.75 * setting["rounds"]) if start is None else start


def _ima_checks(setting: dict) -> list[str]:
    start, window, rounds = ima_start_round(setting), setting["ima"]["window"], setting["rounds"]
    problems = []
    if start >= rounds:
        problems.append(f"ima.start_round = {start} must be < rounds = {rounds} (rounds are 0-indexed; IMA "
                        "would never start)")
    if window > start:
        problems.append(f"ima.window = {window} is larger than ima.start_round = {start}: the window would not "
                        "be full when IMA starts; use ima.window <= ima.start_round")
    return problems


def _proxy_check(section: str):
    def check(setting: dict) -> list[str]:
        size, spec = setting[section]["proxy_size"], DATASETS[setting["dataset"]]
        uses_proxy = setting[section].get("variant") != "fixed_gamma"
        if uses_proxy and (size % spec["num_classes"] or size >= spec["test_size"]):
            return [f"{section}.proxy_size = {size} must be a multiple of the {spec['num_classes']} classes of "
                    f"{setting['dataset']} (the proxy set is class-balanced) and smaller than its test set"]
        rarest = spec.get("smallest_test_class")
        if uses_proxy and rarest is not None and size // spec["num_classes"] > rarest:
            return [f"{section}.proxy_size = {size} takes {size // spec['num_classes']} samples per class, but the "
                    f"rarest class of {setting['dataset']}'s test set has {rarest}; use at most "
                    f"{rarest * spec['num_classes']}"]
        return []
    return check


def _fedlaw_checks(setting: dict) -> list[str]:
    problems, cfg = _proxy_check("fedlaw")(setting), setting["fedlaw"]
    stage = cfg["server_epochs"] // 2  # the SWA variant's lambda stage; z is averaged after epoch swa_start
    if cfg["variant"] == "swa" and cfg["server_epochs"] > 0 and cfg["swa_start"] >= stage - 1:
        problems.append(f"fedlaw.swa_start = {cfg['swa_start']} leaves nothing to average: the lambda stage has "
                        f"server_epochs // 2 = {stage} epochs (0-indexed) and SWA starts after epoch swa_start; "
                        f"use fedlaw.swa_start <= {max(stage - 2, 0)} or more fedlaw.server_epochs")
    return problems



ALGORITHMS["fedlaw"] = {"sections": ["fedlaw"], "modules": ["algorithms/fedlaw.py", "algorithms/proxy.py"],
                        "checks": [_fedlaw_checks]}
# FedLAW's server-side baselines, on the same proxy set (algorithms/proxy.py)
ALGORITHMS["feddf"] = {"sections": ["feddf"], "modules": ["algorithms/feddf.py", "algorithms/proxy.py"],
                       "checks": [_proxy_check("feddf")]}
ALGORITHMS["fedbe"] = {"sections": ["fedbe"], "modules": ["algorithms/fedbe.py", "algorithms/feddf.py",
                                                          "algorithms/proxy.py"], "checks": [_proxy_check("fedbe")]}
ALGORITHMS["serverft"] = {"sections": ["serverft"], "modules": ["algorithms/serverft.py", "algorithms/proxy.py"],
                          "checks": [_proxy_check("serverft")]}
ALGORITHMS["fedaware"] = {"sections": ["fedaware"], "modules": ["algorithms/fedaware.py", "minnorm.py"]}
PLUGINS["ima"] = {"sections": ["ima"], "modules": ["algorithms/ima.py"], "checks": [_ima_checks]}
PLUGINS["aware"] = {"sections": ["aware"], "modules": ["algorithms/aware.py", "algorithms/fedaware.py", "minnorm.py"],
                    "refuses": {"fedaware": "FedAWARE already takes the AWARE step; +aware would project it on itself",
                                "feddyn": "FedDyn does not follow the global gradient-descent rule x <- x - eta_g d "
                                          "that the projection acts on (FedAWARE, Table 2 leaves it out)"}}

# Source files every run depends on; with an algorithm's own modules they form the code hash
# that Snakemake's params trigger sees, so editing one method reruns only its runs.
CORE_MODULES = ["engine.py", "client.py", "server.py", "parts.py", "flat.py", "models.py", "data.py",
                "partition.py", "metrics.py", "checkpoint.py", "algorithms/__init__.py",
                "models_extra.py", "datasets_extra.py", "text.py"]

# Source files a partition depends on (the splitting and the label loading); part of its identity.
PARTITION_MODULES = ["partition.py", "data.py", "datasets_extra.py", "text.py"]


def sections_used(algorithm: str, plugins: list[str]) -> set[str]:
    used = set(ALGORITHMS.get(algorithm, {}).get("sections", []))
    for plugin in plugins:
        used |= set(PLUGINS.get(plugin, {}).get("sections", []))
    return used


def extra_checks(algorithm: str, plugins: list[str]):
    yield from ALGORITHMS.get(algorithm, {}).get("checks", [])
    for plugin in plugins:
        yield from PLUGINS.get(plugin, {}).get("checks", [])


def code_hash(algorithm: str, plugins: list[str]) -> str:
    files = list(CORE_MODULES) + list(ALGORITHMS.get(algorithm, {}).get("modules", []))
    for plugin in plugins:
        files += PLUGINS.get(plugin, {}).get("modules", [])
    return files_hash(files)


def files_hash(files: list[str]) -> str:
    """Hash of the named source files of the package (relative to src/fedrepro)."""
    return _files_hash(tuple(sorted(set(files))), tuple(_stamp(PACKAGE / name) for name in sorted(set(files))))


def partition_code_hash() -> str:
    return files_hash(PARTITION_MODULES)


def _stamp(path: Path) -> tuple:
    try:
        stat = path.stat()
        return (stat.st_mtime_ns, stat.st_size)
    except FileNotFoundError:
        return (0, -1)


@functools.lru_cache(maxsize=512)
def _files_hash(names: tuple, stamps: tuple) -> str:
    # cached on (name, mtime, size): expanding a grid of a thousand runs reads each file once
    digest = hashlib.sha256()
    for name in names:
        path = PACKAGE / name
        digest.update(name.encode())
        digest.update(path.read_bytes() if path.exists() else b"")
    return digest.hexdigest()[:12]
