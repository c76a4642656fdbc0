"""A record per paper: which code (repository, commit), the command, the shim, this project's commit, the
environment and every check's numbers. docs/parity.md's matrix is rendered from these files alone."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

import torch

from fedrepro.parity import (
    clients,
    clients_fedaware,
    clients_fednova,
    models,
    partitions,
    pipeline,
    rounds,
    rounds_fednova,
    rounds_ima_methods,
    servers,
    servers_fedaware,
    servers_fedlaw,
)
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
    "utils.tSNE and leaf.dataloader placeholders (utils.global_test imports both; HEAD ships neither); data checks "
    "(parity.generated.on_generated): every torchvision CIFAR and (Fashion-)MNIST opened reads the generated "
    "folder and accepts its md5; FedAWARE: FedLab's modules (not installed) placeholders, its partitioned-data "
    "classes keeping the arguments the code passes them; IMA: the notebook's data cell run by a driver; IMA "
    "Digit-Five and PACS (parity.pipeline_domains): mixed_digit_dataloader.get_mixed_digit_datasets and "
    "PACS_dataloader.get_PACS_datasets in a scratch working directory whose data/ holds the generated files, the "
    "package __init__ of its partial FedLab copy and pynvml placeholders, numpy.compat.long (NumPy 2 removed "
    "numpy.compat; NumPy 1's was int); IMA "
    "rounds (parity.rounds, parity.rounds_ima_methods): Server.fedavg, fedprox, fedsam, fedfa_anchorloss and "
    "fednova in a scratch folder with their output folders made, placeholders for "
    "utils.bias_var_covar_analysis, pynvml and the package __init__ of its partial FedLab copy (which imports "
    "four modules HEAD lacks), args.split 2CNN_2 (the notebook's; ASAM's CNN radius), the training set's targets "
    "given (FedFA reads them), torch's default dtype float32 or float64 per case, and by names in its modules: "
    "client.DataLoader hands out fedrepro's batches, server_se1.dispatch loads fedrepro's global model (and FedFA's "
    "anchors) of the round first, server_se1.aggregation, utils.optimizer.fednova_optimizer and torch.optim.SGD "
    "record what the code computed; "
    "FedLAW clients (parity.clients): client nodes as "
    "SimpleNamespaces holding the code's optimisers and fedrepro's batches; FedLAW rounds (parity.rounds_fedlaw): "
    "main_fedlaw.py and main_baselines.py run as scripts on generated idx files, in float64, by names in their "
    "modules: nodes.Node (client_funct's too) a subclass handing its clients fedrepro's batches and its central "
    "node fedrepro's proxy batches, client_funct.Client_update loading fedrepro's global model of the round "
    "first, utils.validate recording the scored global model; FedLAW servers: "
    "torch.tensor(..., device='cuda') on the CPU, the central node's proxy loader yielding fedrepro's batch order, "
    "FedBE's torch.randn_like draws fedrepro's; FedAWARE servers: fedaware.py's definitions only (not its "
    "script part), settings and agnews_dataset, pynvml and torch.utils.tensorboard placeholders, model.LinearReg "
    "placeholder, FeedbackSampler's shuffled list fedrepro's warmup permutation, FedLab 1.3.0 from PyPI; FedAWARE "
    "clients (parity.clients_fedaware): fedaware.py's and baselines/fedavg.py's definitions only, their global args "
    "the code's settings.parse_args() of the shrunk command line, agnews_dataset a placeholder, FedLab's "
    "get_best_gpu answering the CPU, the trainer's data set a stand-in handing each client fedrepro's batches, "
    "epoch by epoch; FedAWARE rounds (parity.rounds_fedaware): fedaware.py and baselines/fedavg.py run as scripts "
    "in a scratch folder (datasets/fmnist/ made, -preprocess 1) on generated idx files, pynvml a placeholder, a "
    "SummaryWriter that writes nothing, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 for FedLab's pickled partitions, and by "
    "names in FedLab's and the code's modules: utils.FeedbackSampler a subclass whose shuffled list is fedrepro's "
    "warmup permutation and whose draws after the exploration are fedrepro's, SyncServerHandler.downlink_package "
    "loading fedrepro's global model of the round first, SyncServerHandler.load recording the uploads, the new "
    "global model, the momenta and Frank-Wolfe weights, partitioned_fmnist.MNISTPartitioner recording its split; "
    "FedAWARE baselines' servers (parity.servers_fedaware_baselines): each baselines/ script's definitions only, "
    "the same placeholders and utils.projection (fedams.py imports it, HEAD's utils lacks it), the handler's "
    "sampler a namespace holding fedrepro's draw; FedNova "
    "clients (parity.clients_fednova): one distoptim.FedNova (or distoptim.FedProx) per client, its parameters and "
    "old_init set to fedrepro's global model each round, its rate fedrepro's, the name dist in its module an "
    "all-reduce over one thread per client; FedNova rounds (parity.rounds_fednova, rounds_fednova_script): "
    "train_LocalSGD.py's init_processes and run in one spawned gloo process per client, its argv set from "
    "fedrepro's setting, util_v4.partition_dataset handing out fedrepro's batches round by round, "
    "util_v4.select_model the code's vgg11 with fedrepro's initial weights, update_learning_rate loading "
    "fedrepro's global model of the round first, update_local_epochs recording its draws (the same function called "
    "beforehand for fedrepro's run), its FedNova and FedProx names recording subclasses, distoptim.FedProx's "
    "communicate recording the all-reduced sum, torch.nn.functional.dropout replaying fedrepro's masks; FedAWARE "
    "AGNews (parity.agnews): settings.get_settings "
    "in a scratch folder of generated CSV files, its from_pretrained('/data/pythia-70m') reading a tiny GPT-NeoX "
    "checkpoint built here (its tokenizer given end-of-text as padding token after a first call without one), "
    "torch.load unpickling as before torch's weights_only default, DataFrame.drop(columns=..., axis=1) as pandas "
    "before 3.0"
)


def _project_commit() -> str:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "src"], capture_output=True, text=True)
    return head.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")


def checks(paper: str) -> dict:
    """The checks the harness has for one paper's code: name -> function(checkout, inits) -> rows."""
    found = {
        "models": lambda checkout, inits: models.compare(paper, checkout, inits),
        "pipeline": lambda checkout, inits: pipeline.compare(paper, checkout),
    }
    if paper == "fedlaw":
        found["clients"] = lambda checkout, inits: clients.compare_fedlaw(checkout)
        found["servers"] = lambda checkout, inits: servers_fedlaw.compare_fedlaw(checkout)
        from fedrepro.parity import rounds_fedlaw

        found["rounds"] = lambda checkout, inits: rounds_fedlaw.compare_fedlaw(checkout)
    if paper == "fedaware":
        found["clients"] = lambda checkout, inits: clients_fedaware.compare_fedaware(checkout)
        from fedrepro.parity import rounds_fedaware, servers_fedaware_baselines

        found["servers"] = lambda checkout, inits: [
            *servers_fedaware.compare_fedaware(checkout),
            *servers_fedaware_baselines.compare_fedaware_baselines(checkout),
        ]

        found["rounds"] = lambda checkout, inits: rounds_fedaware.compare_fedaware(checkout)
        from fedrepro.parity import agnews

        found["text"] = lambda checkout, inits: agnews.compare(checkout)
    if paper == "fednova":
        found["partitions"] = lambda checkout, inits: partitions.compare_fednova(checkout)
        found["clients"] = lambda checkout, inits: clients_fednova.compare_fednova(checkout)
        found["rounds"] = lambda checkout, inits: rounds_fednova.compare_fednova(checkout)
        found["servers"] = lambda checkout, inits: servers.compare_fednova(checkout)
    if paper == "ima":
        found["servers"] = lambda checkout, inits: servers.compare_ima(checkout)
        found["rounds"] = lambda checkout, inits: (
            rounds.compare_ima(checkout)
            + rounds_ima_methods.compare_methods(checkout)
            + rounds_ima_methods.compare_protocol(checkout)
        )
    return found


def run(paper: str, checkout, out: Path, inits: int, argv: list[str], only: tuple[str, ...] = ()) -> Path:
    """Run the paper's checks (``only``: these, kept beside the record's other checks, which must come from the
    same commit of the code) and write its record."""
    available = checks(paper)
    unknown = sorted(set(only) - set(available))
    if unknown:
        raise ValueError(f"--checks {','.join(unknown)}: {paper} has the checks {', '.join(available)}")
    if paper == "fedaware" and {"clients", "servers", "rounds"} & set(only or available):
        servers_fedaware.require_fedlab()  # before the other checks' minutes
    path = out / f"{paper}.json"
    code_commit = commit(checkout)
    record = {"checks": {}, "check_runs": {}}
    if only and path.exists():
        record = json.loads(path.read_text())
        if record["commit"] != code_commit:
            raise ValueError(
                f"{path}: made from {record['repository']} @{record['commit'][:12]}, the checkout is at "
                f"{code_commit[:12]}; run every check (no --checks) to record another commit"
            )
        if "check_runs" not in record:  # a record of one run of every check: each check keeps that run's facts
            ran = {k: record[k] for k in ("fedrepro_commit", "started_utc", "wall_seconds")}
            record["check_runs"] = {name: {**ran, "with": sorted(record["checks"])} for name in record["checks"]}
    started = time.time()
    for name in only or available:
        began = time.time()
        record["checks"][name] = available[name](checkout, inits)
        record["check_runs"][name] = {
            "fedrepro_commit": _project_commit(),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began)),
            "wall_seconds": round(time.time() - began),
        }
    command = f"python -m fedrepro.parity {paper} --checkout <checkout of {REPOSITORIES[paper]}> --inits {inits}"
    record.update(
        {
            "paper": paper,
            "repository": REPOSITORIES[paper],
            "commit": code_commit,
            "command": command + (f" --checks {','.join(only)}" if only else ""),
            "shim": SHIM,
            "fedrepro_commit": _project_commit(),
            "torch": torch.__version__,
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, CPU only",
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "wall_seconds": round(time.time() - started),
        }
    )
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def load(folder: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))}
