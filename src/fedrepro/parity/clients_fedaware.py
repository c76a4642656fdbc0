"""One client's local training, FedAWARE's code and fedrepro's, on the same batches.

The code's side is the client trainer its scripts build, unchanged: ``FedAvgSerialClientTrainer`` of
``fedaware.py`` (FedAWARE) and of ``baselines/fedavg.py`` (FedAvg), FedLab ``SGDSerialClientTrainer``s whose
``local_process`` asks ``settings.get_heterogeneity`` for the batch size and epochs, takes each client's loader
from its data set and trains with the ``torch.optim.SGD`` that ``setup_optim`` made (plain SGD at the script's lr,
``CrossEntropyLoss``). Both scripts train at import, so their definitions alone are executed
(``servers_fedaware.definitions``); the module-level ``args`` they read is the code's own ``settings.parse_args()``
of the script's command line, shrunk (``code_argv``). The trainer is built as the scripts build it
(``cuda=True``: FedLab's choice of GPU answers the CPU) around the code's own network (FedLab's ``MLP(784, 10)``
for Fashion-MNIST, ``model.ToyCifarNet`` for CIFAR-10, as ``settings.get_settings``), holding fedrepro's weights
(paired by ``parity.models.match``; the networks are compared apart).

fedrepro's side is its real trainer (the sequential path) at the setting of the code's FMNIST run
(params/fedaware.yaml with params/subsets/fedaware_parity_fmnist.yaml) and of Table 2's CIFAR-10 under the code's
protocol (params/subsets/fedaware_official_protocol.yaml), shrunk to three clients of 45, 150 and 200 generated
samples, all of them every round, 2 rounds, at the code's E = 3, B = 64 and lr 0.01: 3, 9 and 12 steps (unequal
counts, partial last batches). Its batches are recorded (``parity.clients.record_local_training``) and the
code's data set is a stand-in whose ``get_dataloader(id, batch_size)`` hands client ``id`` those batches, epoch by
epoch (the data order pinned from outside; the tensors are the same, the data pipeline is compared apart); it
records the batch size the code asked for, and every pinned epoch must have been taken. Each round the code's
trainer starts from fedrepro's global model of the round, sent as the script's ``downlink_package`` is.

Compared per client and round: the rate (the code's optimiser's against fedrepro's, 1e-12), the batch size the
code asked for, and the client's model within ``parity.clients.bound`` (4 eps32 per step of the largest
parameter); both programs run the same forward, backward and ``p - lr * g`` (one fused ``add_``), so equal
models are expected bit for bit, and a 1% change of the rate on fedrepro's side alone must land far outside."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import sys
from pathlib import Path

import numpy as np
import torch

from fedrepro.parity import clients, models as model_pairs
from fedrepro.parity.clients import LR_RELATIVE, _EpochBatches, bound, generated_clients
from fedrepro.parity.servers_fedaware import PLACEHOLDERS, STUBS, definitions, require_fedlab
from fedrepro.parity.shim import checkout_on_path

SIZES = (45, 150, 200)  # generated samples a client: 1, 3 and 4 batches of 64 an epoch
SHRUNK = {"num_clients": len(SIZES), "participation": 1.0, "rounds": 2, "device": "cpu"}
SHAPES = {"fmnist": (1, 28, 28), "cifar10": (3, 32, 32)}
# (dataset, our model, the script whose trainer runs, our algorithm, the params files of its setting)
FMNIST = ("params/fedaware.yaml", "params/subsets/fedaware_parity_fmnist.yaml")
CIFAR10 = ("params/fedaware.yaml", "params/subsets/fedaware_official_protocol.yaml")
CASES = (
    ("fmnist", "mlp", "fedaware.py", "fedaware", FMNIST),
    ("fmnist", "mlp", "baselines/fedavg.py", "fedavg", FMNIST),
    ("cifar10", "cnn_fedaware", "fedaware.py", "fedaware", CIFAR10),
)
REPLACE = ("agnews_dataset",)  # imports transformers and datasets for AGNews, which these paths never call


@functools.lru_cache(maxsize=None)
def setting(dataset: str, algorithm: str) -> dict:
    """The code's FMNIST run (seed 1998, the code's assignment) or Table 2's CIFAR-10 cell under the code's
    protocol, for ``algorithm``, shrunk (SHRUNK)."""
    from fedrepro.configure import expansion, paramsfile

    files = FMNIST if dataset == "fmnist" else CIFAR10
    experiment = "fedaware_parity_fmnist" if dataset == "fmnist" else "fedaware_table2_cifar10"
    params = paramsfile.load_params_files([str(paramsfile.ROOT / p) for p in files])
    # the code's exported partition file is not needed (the clients here are generated); its check would refuse
    params["experiments"][experiment]["base"]["partition"] = {"kind": "iid"}
    found = next(
        r.setting
        for r in expansion.expand(params)
        if r.experiment == experiment
        and r.setting["algorithm"] == algorithm
        and not r.setting["plugins"]
        and r.setting["cohort"]["assignment"] == "code"
    )
    return {**copy.deepcopy(found), **SHRUNK}


def ours(run_setting: dict, dataset: str) -> list[dict]:
    """fedrepro's trainer on the generated clients, its model drawn at the run's seed; every client's local
    training as recorded."""
    return clients.ours(run_setting, generated_clients(SIZES, SHAPES[dataset], 60, seed=0), seed=run_setting["seed"])


def code_argv(script: str, run_setting: dict) -> list[str]:
    """The script's command line (exp_scripts' values for the data set), shrunk to SHRUNK's clients and rounds."""
    return [script, "-num_clients", str(run_setting["num_clients"]), "-com_round", str(run_setting["rounds"]),
            "-sample_ratio", "1.0", "-batch_size", str(run_setting["batch_size"]),
            "-epochs", str(run_setting["local_epochs"]), "-lr", repr(run_setting["client"]["lr"]),
            "-glr", repr(run_setting["server"]["lr"]), "-dataset", run_setting["dataset"], "-dseed", "2023",
            "-seed", str(run_setting["seed"]), "-partition", "dirichlet", "-dir", "0.1"]  # fmt: skip


@contextlib.contextmanager
def fedlab_on_cpu():
    """FedLab's ``cuda=True`` picks the GPU with the most free memory through pynvml; here it answers the CPU
    (nothing to do where FedLab is absent: a stand-in checkout of the tests)."""
    try:
        import fedlab.core.model_maintainer as maintainer
    except ImportError:
        maintainer = None
    if maintainer is None:
        yield
        return

    saved = maintainer.get_best_gpu
    maintainer.get_best_gpu = lambda: torch.device("cpu")
    try:
        yield
    finally:
        maintainer.get_best_gpu = saved


class PinnedClients:
    """The code's data set: ``get_dataset`` a client's samples (their count is what the trainer reads),
    ``get_dataloader`` its pinned batches, epoch by epoch; the batch sizes the code asks for are recorded."""

    def __init__(self):
        self.batches, self.asked = {}, []

    def get_dataset(self, cid, type="train"):
        return [y for epoch in self.batches[int(cid)][:1] for _, ys in epoch for y in ys]

    def get_dataloader(self, cid, batch_size=None, type="train"):
        loader = _EpochBatches()
        loader.epochs = [list(epoch) for epoch in self.batches[int(cid)]]
        self.asked.append((int(cid), batch_size, loader))
        return loader


def code_network(checkout, dataset: str):
    """The network ``settings.get_settings`` builds for the data set (imported inside the shim's block)."""
    if dataset == "fmnist":
        from fedlab.models.mlp import MLP

        return MLP(784, 10)
    import model

    return model.ToyCifarNet()


def code(checkout, dataset: str, our_model: str, script: str, run_setting: dict, log: list[dict]) -> list[dict]:
    """The code's trainer on fedrepro's batches, round by round from fedrepro's global models."""
    from fedrepro import models

    checkout = Path(checkout)
    argv = code_argv(script, run_setting)
    rows = []
    with (
        checkout_on_path(checkout, stubs=STUBS, placeholders=PLACEHOLDERS, replace=REPLACE),
        fedlab_on_cpu(),
        contextlib.redirect_stderr(io.StringIO()),  # tqdm's bars
    ):
        saved_argv, saved_path = list(sys.argv), list(sys.path)
        try:
            import settings

            sys.argv[:] = argv
            args = settings.parse_args()
            module = definitions(checkout / script, Path(script).stem)
            module.args = args  # the script's global: local_process reads it
            net = code_network(checkout, dataset)
            mine = models.build(our_model, dataset)
            pairs = model_pairs.match(mine, net, torch.zeros(2, *SHAPES[dataset]))
            back = [(b, a) for a, b in pairs]
            trainer = module.FedAvgSerialClientTrainer(net, args.num_clients, cuda=True)
            if script == "fedaware.py":
                trainer.setup_optim(args.epochs, args.batch_size, args.lr, args.local_momentum, args)
            else:
                trainer.setup_optim(args.epochs, args.batch_size, args.lr, args)
            data = PinnedClients()
            trainer.setup_dataset(data)
            for t in sorted({e["round"] for e in log}):
                entries = sorted((e for e in log if e["round"] == t), key=lambda e: e["client"])
                torch.nn.utils.vector_to_parameters(entries[0]["start"].clone(), mine.parameters())
                model_pairs.copy(mine, net, pairs)
                payload = [torch.nn.utils.parameters_to_vector(net.parameters()).detach().clone()]
                data.batches = {e["client"]: e["batches"] for e in entries}
                data.asked = []
                ids = np.array([e["client"] for e in entries])  # the sampler's sorted list: the training order
                trainer.local_process(payload, ids)
                packs = trainer.uplink_package
                for e, pack, (cid, asked, loader) in zip(entries, packs, data.asked):
                    torch.nn.utils.vector_to_parameters(pack[0].clone(), net.parameters())
                    model_pairs.copy(net, mine, back)
                    got = torch.nn.utils.parameters_to_vector(mine.parameters()).detach()
                    rows.append(
                        {
                            "round": t,
                            "client": e["client"],
                            "steps": sum(len(b) for b in e["batches"]),
                            "lr_code": float(trainer.optimizer.param_groups[0]["lr"]),
                            "lr_ours": float(e["lr"]),
                            "batch_size_asked": asked if cid == e["client"] else None,
                            "epochs_left": len(loader.epochs),
                            "relative_gap": float((got - e["end"]).abs().max() / e["end"].abs().max()),
                            "bit_for_bit": bool(torch.equal(got, e["end"])),
                        }
                    )
        finally:
            sys.argv[:], sys.path[:] = saved_argv, saved_path  # baselines/fedavg.py appends "./" to sys.path
    return rows


def compare_case(checkout, dataset, our_model, script, algorithm, lr_factor: float = 1.0) -> dict:
    """One case; ``lr_factor`` (tests) scales fedrepro's client rate alone, the code keeps the script's."""
    run_setting = setting(dataset, algorithm)
    mine = copy.deepcopy(run_setting)
    mine["client"]["lr"] *= lr_factor
    rows = code(checkout, dataset, our_model, script, run_setting, ours(mine, dataset))
    for row in rows:
        row["bound"] = bound(row["steps"])
    worst = max(r["relative_gap"] / r["bound"] for r in rows)
    lr_equal = all(abs(r["lr_code"] - r["lr_ours"]) <= LR_RELATIVE * r["lr_ours"] for r in rows)
    batches_equal = all(r["batch_size_asked"] == run_setting["batch_size"] and r["epochs_left"] == 0 for r in rows)
    cl = run_setting["client"]
    return {
        "case": f"{script}'s trainer, {dataset} `{our_model}` (lr {cl['lr']:g}, E {run_setting['local_epochs']}, "
        f"B {run_setting['batch_size']})",
        "model": our_model,
        "dataset": dataset,
        "code_argv": code_argv(script, run_setting)[1:],
        "clients": list(SIZES),
        "rounds": run_setting["rounds"],
        "steps": sorted({r["steps"] for r in rows}),
        "relative_gap": max(r["relative_gap"] for r in rows),
        "gap_over_bound": worst,
        "bit_for_bit": all(r["bit_for_bit"] for r in rows),
        "lr_equal": lr_equal,
        "batches_equal": batches_equal,
        "rows": rows,
        "status": "equal" if worst <= 1 and lr_equal and batches_equal else "differs",
    }


def compare_fedaware(checkout) -> list[dict]:
    require_fedlab()
    return [compare_case(checkout, *case[:4]) for case in CASES]
