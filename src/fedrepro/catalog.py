"""What exists, as plain data: datasets, models, partition kinds; and IMA's default start round.

Read by the validation (registry, config) and by the training code alike. It imports nothing, and it
holds no algorithm entries or checks, so adding a method or editing a check changes no run's identity
(a run's code hash covers the files its training imports: identity.code_closure).

``family`` names the module that serves a dataset (``data/<family>.py``) or builds a model
(``models/<family>.py``): a run's code hash covers its own families and no other.
"""
from __future__ import annotations

import math

DATASETS = {
    "fmnist": {"family": "fmnist", "train_size": 60000, "test_size": 10000, "num_classes": 10, "shape": (1, 28, 28)},
    "cifar10": {"family": "cifar", "preprocess": True, "train_size": 50000, "test_size": 10000, "num_classes": 10, "shape": (3, 32, 32)},
    "cifar100": {"family": "cifar", "preprocess": True, "train_size": 50000, "test_size": 10000, "num_classes": 100, "shape": (3, 32, 32)},
    # Generated from a fixed seed (data.synthetic.SYNTHETIC_SEED); its 30 users are its clients.
    # smallest_test_class: its rarest class in the test set (counted from the generated files), which
    # bounds a class-balanced proxy set
    "synthetic_1_1": {"family": "synthetic", "train_size": 4833, "test_size": 552, "num_classes": 10, "shape": (60,), "natural_clients": 30,
                      "smallest_test_class": 14},
    "synthetic_0_0": {"family": "synthetic", "train_size": 4833, "test_size": 552, "num_classes": 10, "shape": (60,), "natural_clients": 30,
                      "smallest_test_class": 8},
    # data/agnews.py: texts tokenised by the model's tokenizer to a fixed length (pretrained.max_length)
    "agnews": {"family": "agnews", "text": True, "train_size": 120000, "test_size": 7600, "num_classes": 4, "shape": (100,)},
    # IMA's feature-skew datasets (data/digit5.py, pacs.py): several domains side by side; each domain is split
    # over num_clients / len(domains) clients (partitions.make) and scored on its own test set (evaluation.score).
    # Digit-Five's sizes are approximate (FedBN's ten parts of about 743 images a domain; its test files vary):
    # only the bounds checks and the plan's cost estimate read them. PACS: 9,991 images, 10% of each domain test.
    "digit5": {"family": "digit5", "train_size": 37150, "test_size": 7430, "num_classes": 10, "shape": (3, 28, 28),
               "domains": ["MNIST", "SVHN", "USPS", "SynthDigits", "MNIST_M"]},
    "pacs": {"family": "pacs", "train_size": 8994, "test_size": 997, "num_classes": 7, "shape": (3, 224, 224),
             "domains": ["photo", "art_painting", "cartoon", "sketch"]},
}

MODELS = {
    "mlp": {"family": "mlp", "datasets": ["fmnist"], "doc": "Linear 784-200-200-10 with ReLU (FedLAW, FedAWARE code)"},
    "lenet5": {"family": "cnn", "datasets": ["fmnist"], "doc": "FedLAW code's LeNet5: conv16-conv32 (5x5, pad 2), Linear 1568-10"},
    # feature_classifier: the last layer is a Linear classifier over IMA's 128-d feature layer (FedFA's anchors)
    "cnn": {"family": "cnn", "datasets": ["fmnist", "cifar10", "cifar100"], "feature_classifier": True,
            "doc": "IMA's two-conv CNN: conv32-conv32 (5x5), FC 512-384-128-10; CIFAR: conv64-conv64, FC 1600-384-128"},
    # models/cnn.py, resnet.py, vgg.py, alexnet.py
    "cnn_fedaware": {"family": "cnn", "datasets": ["cifar10", "cifar100"], "params": {"cifar10": 122570},
                     "doc": "FedAWARE's CIFAR-10 CNN: conv32-conv64-conv64 (3x3), FC 1024-64-10, Kaiming/N(0,.01) init"},
    "simplecnn": {"family": "cnn", "datasets": ["cifar10", "cifar100"], "params": {"cifar10": 122570},
                  "doc": "FedLAW's SimpleCNN: the same layers as cnn_fedaware, PyTorch default init"},
    "resnet18_gn32": {"family": "resnet", "datasets": ["cifar10", "cifar100"], "params": {"cifar100": 11220132},
                      "doc": "FedAWARE's CIFAR ResNet-18 with GroupNorm(32), Linear 512-classes"},
    "resnet18_gn2": {"family": "resnet", "datasets": ["cifar10", "cifar100"], "feature_classifier": True,
                     "doc": "IMA's CIFAR ResNet-18 with GroupNorm(2), 512-128 linear projector, 128-classes"},
    "vgg11": {"family": "vgg", "datasets": ["cifar10", "cifar100"], "params": {"cifar10": 9750922},
              "doc": "FedNova's VGG-11 (config A, no normalisation, dropout classifier 512-512-classes)"},
    "vgg11_gn2": {"family": "vgg", "datasets": ["cifar10", "cifar100"], "feature_classifier": True,
                  "doc": "IMA's VGG-11 with GroupNorm(2) after every conv, 512-128 projector, 128-classes"},
    "resnet20": {"family": "resnet", "datasets": ["cifar10", "cifar100"], "batchnorm": True,
                 "doc": "FedLAW's CIFAR ResNet-20 (16/32/64); BatchNorm (running or batch statistics: setting batchnorm)"},
    "resnet56": {"family": "resnet", "datasets": ["cifar10", "cifar100"], "batchnorm": True,
                 "doc": "FedLAW's CIFAR ResNet-56 (16/32/64); BatchNorm (running or batch statistics: setting batchnorm)"},
    # FedLAW Table 5: Li et al. 2018's models (models/resnet.py); the counts by hand in tests/test_models.py
    "resnet110": {"family": "resnet", "datasets": ["cifar10", "cifar100"], "params": {"cifar10": 1730714}, "batchnorm": True,
                  "doc": "FedLAW's CIFAR ResNet-110 (16/32/64, 18 blocks a stage); BatchNorm (setting batchnorm)"},
    "wrn56_4": {"family": "resnet", "datasets": ["cifar10", "cifar100"], "params": {"cifar10": 13628234}, "batchnorm": True,
                "doc": "FedLAW's WRN-56-4: the CIFAR ResNet-56 with 4x the widths (64/128/256); BatchNorm (setting batchnorm)"},
    "densenet121": {"family": "resnet", "datasets": ["cifar10", "cifar100"], "params": {"cifar10": 6956298}, "batchnorm": True,
                    "doc": "FedLAW's CIFAR DenseNet-BC-121 (growth 32, 3x3 stem of 64, no stem pooling); BatchNorm (setting batchnorm)"},
    # IMA Table 1's feature-skew rows as its code builds them (models/cnn.py, alexnet.py; counts by hand in
    # tests/test_models.py); where the paper's Table 4 differs, the classes' docs say how
    "digit_cnn_gn2": {"family": "cnn", "datasets": ["digit5"], "feature_classifier": True, "params": {"digit5": 806090},
                      "doc": "IMA's Digit-Five CNN: 3 x (conv5x5 pad 2, GroupNorm(2), ReLU, max-pool) 64-64-128, FC 1152-384-128-10"},
    "alexnet_gn32": {"family": "alexnet", "datasets": ["pacs"], "feature_classifier": True, "params": {"pacs": 12042311},
                     "doc": "IMA's PACS AlexNet: torchvision's AlexNet convs with GroupNorm(32), FC 9216-1024-128-7, no dropout"},
    "logreg": {"family": "mlp", "datasets": ["synthetic_1_1", "synthetic_0_0"], "doc": "multinomial logistic regression 60-10 (FedNova)"},
    # FedLAW Tables 1, 9: the paper and its code leave both undefined; ours (models/resnet.py, alexnet.py) with counts by hand
    "resnet8": {"family": "resnet", "datasets": ["cifar10", "cifar100"], "params": {"cifar10": 78042}, "batchnorm": True,
                "doc": "CIFAR ResNet-8 (one BasicBlock per 16/32/64 stage, as ResNet-20/56); BatchNorm (setting batchnorm)"},
    "alexnet": {"family": "alexnet", "datasets": ["cifar10", "cifar100"], "params": {"cifar10": 2472266},
                "doc": "CIFAR AlexNet: convs 64-192-384-256-256 (11/4, 5, 3, 3, 3), 3 max-pools, Linear 256-classes, no norm"},
    # models/pythia.py; weights from pretrained.path (a hub id or a local folder). The count is the one of
    # Pythia-70M's published config with a 4-way head in place of the LM head (tests/test_agnews.py).
    "pythia70m": {"family": "pythia", "datasets": ["agnews"], "pretrained": True, "params": {"agnews": 44673024},
                  "doc": "Pythia-70M (GPT-NeoX) with a sequence-classification head, all parameters fine-tuned"},
}

PARTITION_KEYS = {
    # long_tail_rho (FedLAW Table 7): kept only where it is not 1 (config.prune), so other partitions keep their ids
    "iid": ["kind", "seed", "long_tail_rho"],
    "dirichlet": ["kind", "seed", "alpha", "min_size", "balance", "long_tail_rho"],
    # FedLAW's hybrid: the first half of the clients from Dir(alpha_balanced), the rest from Dir(alpha)
    "hybrid": ["kind", "seed", "alpha", "alpha_balanced", "min_size", "balance"],
    "shards": ["kind", "seed", "classes_per_client", "distinct"],
    # NIID-Bench's quantity-based label skew ("noniid-#label"): each client holds classes_per_client classes,
    # each class split evenly among the clients holding it (IMA's Digit-Five #C=2)
    "label_quantity": ["kind", "seed", "classes_per_client"],
    # CIFAR-100's Pachinko allocation: alpha over coarse labels, beta over each one's fine labels
    "pachinko": ["kind", "seed", "alpha", "beta", "samples_per_client"],
    # FedLab's balanced "inner" Dirichlet: equal client sizes, a class prior Dir(alpha) per client
    "inner_dirichlet": ["kind", "seed", "alpha"],
    # the dataset's own clients (Synthetic's users); nothing to draw
    "natural": ["kind"],
    # client index lists another program produced (.npz client_0.. or JSON {"clients": [...]}); the run's
    # identity holds the file's content hash, not its path (identity.partition_identity)
    "file": ["kind", "path", "sha256"],
}

FEATURE_CLASSIFIER_MODELS = {name for name, spec in MODELS.items() if spec.get("feature_classifier")}


def cohort_size(setting: dict) -> int:
    """Clients a round samples: floor(participation * N), with a margin for participation's binary rounding."""
    return math.floor(setting["participation"] * setting["num_clients"] + 1e-9)


def ima_start_round(setting: dict) -> int:
    """ima.start_round (0-indexed), or 0.75 R, the paper's t_s, when it is left unset."""
    start = setting["ima"]["start_round"]
    return int(0.75 * setting["rounds"]) if start is None else start

# partition kinds that can keep a long-tailed subset of the training set before splitting it
LONG_TAIL_KINDS = ("iid", "dirichlet")
