"""Whole rounds of FedAWARE's code and of fedrepro, compared round by round: the code's scripts run unchanged.

The code's side is ``fedaware.py`` (FedAWARE) or ``baselines/fedavg.py`` (FedAvg), run as a script (``runpy``,
``__name__ == "__main__"``) with ``exp_scripts/run_fmnist_dirichlet.sh``'s arguments shrunk to 6 clients, 3 a
round (``-sample_ratio 0.5``) and 4 rounds: its ``settings.get_settings`` builds FedLab's MLP and the code's
``PartitionedFMNIST`` from generated Fashion-MNIST idx files (``-preprocess 1``: FedLab's ``MNISTPartitioner``
draws its own Dir(0.1) split with ``-dseed``, which fedrepro's trainer is given), its loop samples with the
``FeedbackSampler``, trains every sampled client with its ``FedAvgSerialClientTrainer`` on the code's own
unshuffled loaders, loads the uploads into its server (``global_update``: the pairing with the sampler's unsorted
draw, FedAvg's warm-up step, the momenta, Frank-Wolfe's min-norm step) and evaluates. fedrepro's side is its real
trainer (the sequential path) at the setting of the code's FMNIST run (params/fedaware.yaml with
params/subsets/fedaware_parity_fmnist.yaml: ``cohort.warmup: permutation``, ``cohort.assignment: code``,
``client.shuffle: none``, E = 3, B = 64, lr 0.01, glr 1, alpha 0.3), shrunk alike. The batches are not pinned:
both programs take each client's samples in the partition's order, so the code's own data path feeds it.

Pinned from outside, by names in FedLab's and the code's modules (never its files): ``utils.FeedbackSampler`` is a
subclass whose shuffled list is fedrepro's ``warmup`` permutation (its exploration's set arithmetic and pairing
its own) and whose draws after the exploration are fedrepro's (``cohorts.code_pairing``: numpy's ``choice`` and
our stream are other generators); FedLab's ``SyncServerHandler.downlink_package`` first loads fedrepro's global
model of the round, so every round starts from the same model while each side keeps its own momenta; its
``load`` records each upload and, once the round's last arrives, the new global model (and FedAWARE's momenta and
Frank-Wolfe weights). Around the script: the scratch folder it writes its logs in, ``datasets/fmnist/`` made, a
``SummaryWriter`` that writes nothing (tensorboard is not installed), FedLab's GPU choice answering the CPU, and
torch.load's ``weights_only`` off for FedLab's pickled partitions (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD).

Bounds, relative to the largest entry, per round (float32, as both programs train): every client's model within
``parity.clients.bound`` (4 eps32 a step, the client check's); the global model: after FedAvg's step (FedAvg, and
FedAWARE's warm-up) the client bound plus (4K + 4) eps32 for a weighted mean of K models. After FedAWARE's min-norm
step, with u_i the normalised momenta and lambda the weights each side found: the code's direction
p_c = sum lambda_c,i u_c,i, ours p_o. Then |p_c - p_o| <= max_i |u_c,i - u_o,i| (the same weights on the
momenta of the other side; measured) + sqrt(g_o(lambda_c)) + sqrt(g_o(lambda_o)), where g_o is Frank-Wolfe's
duality gap on our Gram matrix (for the min-norm point p* of a hull and any p in it, |p - p*|^2 <= g(p), as in
``parity.servers_fedaware``), times glr, plus (2N + 2) eps32 for the sums of N unit vectors and the step."""

from __future__ import annotations

import contextlib
import copy
import io
import runpy
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from fedrepro.parity import generated
from fedrepro.parity.clients import bound as client_bound, record_local_training
from fedrepro.parity.clients_fedaware import fedlab_on_cpu
from fedrepro.parity.rounds_fedlaw import _NO_CIFAR, _global_state, _read, write_fmnist
from fedrepro.parity.servers_fedaware import PLACEHOLDERS, _gap, _unit_gram, require_fedlab
from fedrepro.parity.shim import checkout_on_path, script_surroundings

EPS32 = float(torch.finfo(torch.float32).eps)
TRAIN, TEST = 600, 100  # generated samples
SHRUNK = {"num_clients": 8, "participation": 0.5, "rounds": 4, "device": "cpu", "partition": {"kind": "iid"}}
DSEED = 2023  # the script's data seed (-dseed): FedLab's Dirichlet draw
# our method -> (the code's script, its method arguments, the terms a 1% change of each of which the case records)
CASES = {
    "fedaware": ("fedaware.py", ["-alpha"], (("fedaware", "alpha"), ("server", "lr"))),
    "fedavg": ("baselines/fedavg.py", [], (("server", "lr"),)),
}


def setting(method: str) -> dict:
    """The code's FMNIST run (seed 1998, the code's assignment) for ``method``, shrunk (SHRUNK)."""
    from fedrepro.parity.clients_fedaware import setting as fmnist_setting

    return {**copy.deepcopy(fmnist_setting("fmnist", method)), **SHRUNK}


def code_partition(checkout, root: Path, num_clients: int) -> list[np.ndarray]:
    """FedLab's Dirichlet split of the generated training labels, as the code's ``PartitionedFMNIST`` draws it
    (``partitioned_fmnist.MNISTPartitioner``, noniid-labeldir, Dir(0.1), the script's data seed)."""
    with checkout_on_path(checkout, stubs=("pynvml",), placeholders=PLACEHOLDERS, replace=("agnews_dataset",)):
        import partitioned_fmnist

        labels = _read(root, "train", torch.float32).labels
        made = partitioned_fmnist.MNISTPartitioner(
            labels, num_clients, partition="noniid-labeldir", dir_alpha=0.1, verbose=False, seed=DSEED
        )
    return [np.asarray(made.client_dict[c], dtype=np.int64) for c in range(num_clients)]


def ours(run_setting: dict, root: Path, parts: list[np.ndarray], starts=None, lambdas=None) -> dict:
    """fedrepro's run: every client's local training, the global model after every round, FedAWARE's momenta and
    min-norm weights. ``starts`` ({round: model}): each round starts from it; ``lambdas`` ({round: weights}):
    the min-norm weights of those rounds are these (the code's), not our solver's."""
    from types import SimpleNamespace

    from fedrepro import models
    from fedrepro.algorithms import fedaware as fedaware_module
    from fedrepro.run.trainer import Trainer

    log, globals_, servers, current = [], [], [], {"round": 0}
    solve = fedaware_module.min_norm_weights

    def given_weights(gram, *args, **kwargs):
        lam = torch.as_tensor(lambdas[current["round"]], dtype=gram.dtype)
        return SimpleNamespace(weights=lam / lam.sum(), value=float("nan"), iterations=0, gap=float("nan"))

    with tempfile.TemporaryDirectory(prefix="fedrepro-parity-fedaware-rounds-") as tmp:
        torch.manual_seed(run_setting["seed"])
        module = models.build(run_setting["model"], run_setting["dataset"])
        datasets = (_read(root, "train", torch.float32), _read(root, "t10k", torch.float32))
        trainer = Trainer(run_setting, tmp, None, None, datasets=datasets, parts=parts, module=module)
        trainer.cohort_mode = "off"  # the sequential path: the reference the batched path is tested against
        record_local_training(trainer, log)
        step, round_ = trainer.algorithm.server_step, trainer.round

        def server_step(x, updates):
            out = step(x, updates)
            momenta = getattr(trainer.algorithm.aggregator, "momenta", None)
            servers.append({"lambda": updates.info.get("lambda"),
                            "momenta": None if momenta is None else momenta.momenta.clone()})  # fmt: skip
            return out

        def round_and_global(t):
            current["round"] = t
            if starts is not None:
                trainer.model.flat.copy_(starts[t])
            row = round_(t)
            globals_.append(trainer.model.flat.clone())
            return row

        trainer.algorithm.server_step, trainer.round = server_step, round_and_global
        if lambdas is not None:
            fedaware_module.min_norm_weights = given_weights
        try:
            trainer.run(progress=False)
        finally:
            fedaware_module.min_norm_weights = solve
    return {"log": log, "globals": globals_, "servers": servers}


def code_argv(script: str, method_args: list[str], run_setting: dict) -> list[str]:
    """The script's command line: run_fmnist_dirichlet.sh's arguments, shrunk."""
    args = [script, "-num_clients", str(run_setting["num_clients"]), "-com_round", str(run_setting["rounds"]),
            "-sample_ratio", repr(run_setting["participation"]), "-batch_size", str(run_setting["batch_size"]),
            "-epochs", str(run_setting["local_epochs"]), "-lr", repr(run_setting["client"]["lr"]),
            "-glr", repr(run_setting["server"]["lr"]), "-dataset", "fmnist", "-dseed", str(DSEED),
            "-seed", str(run_setting["seed"]), "-partition", "dirichlet", "-dir", "0.1",
            "-preprocess", "1"]  # fmt: skip
    if method_args == ["-alpha"]:
        args += ["-alpha", repr(run_setting["fedaware"]["alpha"])]
    return args


def code(checkout, run_setting: dict, root: Path, run: dict) -> dict:
    """The code's script from fedrepro's round-start models and draws; what it computed, round by round."""
    from fedrepro import streams
    from fedrepro.run.cohorts import code_pairing

    script, method_args, _ = CASES[run_setting["algorithm"]]
    seed, n = run_setting["seed"], run_setting["num_clients"]
    starts = {e["round"]: e["start"] for e in run["log"]}
    record = {"globals": [], "uploads": [], "servers": [], "draws": [], "partition": None}
    argv = code_argv(script, method_args, run_setting)
    with (
        tempfile.TemporaryDirectory(prefix="fedrepro-parity-fedaware-script-") as scratch,
        _global_state(),
        checkout_on_path(checkout, stubs=("pynvml",), placeholders=PLACEHOLDERS, replace=("agnews_dataset",)),
        generated.on_generated(root, _NO_CIFAR),
        fedlab_on_cpu(),
        script_surroundings(Path(scratch), ("datasets/fmnist",)),
    ):
        import partitioned_fmnist
        import utils
        from fedlab.contrib.algorithm import basic_server

        class PinnedSampler(utils.FeedbackSampler):
            def __init__(self, n_clients, probs=None):
                super().__init__(n_clients, probs)
                self.explore = [int(i) for i in streams.rng("warmup", seed).permutation(n_clients)]  # our shuffle
                self.round = 0

            def sample(self, k, startup=0):
                t, self.round = self.round, self.round + 1
                if len(self.explore) > 0 and not self.explored:
                    out = super().sample(k, startup)  # the exploration: its own set arithmetic
                else:  # numpy's choice replaced by our draw, in its drawn order
                    drawn = code_pairing(seed, t, n, k, "permutation")
                    self.last_sampled = drawn, self.p[drawn]
                    out = np.sort(drawn)
                record["draws"].append([int(i) for i in self.last_sampled[0]])
                return out

        class RecordedPartitioner(partitioned_fmnist.MNISTPartitioner):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                record["partition"] = [np.asarray(self.client_dict[c]).tolist() for c in range(len(self.client_dict))]

        handler_class = basic_server.SyncServerHandler
        saved = (handler_class.downlink_package, handler_class.load, utils.FeedbackSampler)
        saved_partitioner = partitioned_fmnist.MNISTPartitioner
        uploads = []

        def downlink(self):
            self.set_model(starts[len(record["globals"])].clone())
            return [self.model_parameters]

        def load(self, payload):
            uploads.append(payload[0].detach().clone())
            done = saved[1](self, payload)
            if done:
                record["globals"].append(self.model_parameters.clone())
                record["uploads"].append(list(uploads))
                uploads.clear()
                projector = getattr(self, "projector", None)
                if projector is not None and projector.feedback is not None and self.sampler.explored:
                    record["servers"].append({"lambda": np.asarray(projector.feedback, dtype=np.float64),
                                              "momenta": torch.stack(projector.momentum).clone()})  # fmt: skip
                else:
                    record["servers"].append(None)
            return done

        handler_class.downlink_package, handler_class.load = property(downlink), load
        utils.FeedbackSampler = PinnedSampler
        partitioned_fmnist.MNISTPartitioner = RecordedPartitioner
        sys.argv[:] = argv
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
                runpy.run_path(str(Path(checkout) / script), run_name="__main__")
        finally:
            handler_class.downlink_package, handler_class.load, utils.FeedbackSampler = saved
            partitioned_fmnist.MNISTPartitioner = saved_partitioner
    lines = printed.getvalue().strip().splitlines()
    record["printed_last"] = next((line for line in reversed(lines) if line.startswith("Round")), "")
    record["argv"] = argv[1:]
    return record


def _units(m: torch.Tensor) -> torch.Tensor:
    norms = m.norm(dim=1)
    return m / torch.where(norms > 0, norms, torch.ones_like(norms))[:, None]


def _min_norm_rows(code_server: dict, given: dict, free: dict, glr: float, scale: float, bounds: tuple) -> dict:
    """A min-norm round's bounds (module docstring): ``given`` is ours with the code's weights, ``free`` ours
    with our solver's; all three from the same round start and client models. ``bounds``: the momenta's derived
    bounds (``compare_case``), in their entries (b) and in L2 (b2). An entry of a unit vector m / |m| then moves
    by at most b / |m| + (max|m| + b) b2 / (|m| (|m| - b2)): the entry's own gap, and the norm's."""
    entry_bound, l2_bound = bounds
    code_m, ours_m = code_server["momenta"].double(), given["momenta"].double()
    lam_c = torch.as_tensor(code_server["lambda"], dtype=torch.float64)
    lam_c = lam_c / lam_c.sum()  # FedLab's fedavg_aggregate divides the weights by their sum
    used = lam_c > 0
    norms, biggest = ours_m.norm(dim=1)[used], ours_m.abs().amax(dim=1)[used]
    unit_bound = float((entry_bound / norms + (biggest + entry_bound) * l2_bound / (norms * (norms - l2_bound))).max())
    gram = _unit_gram(free["momenta"].double())
    fw_code, fw_ours = _gap(gram, lam_c), _gap(gram, free["lambda"].double())
    # N products and N sums of unit vectors' entries (at most max |m| / |m|), the step's one rounding
    rounding = glr * (2 * len(ours_m) + 2) * EPS32 * float((biggest / norms).max()) / scale + EPS32
    return {
        "unit_gap": float((_units(code_m) - _units(ours_m))[used].abs().max()),
        "unit_bound": unit_bound,
        "momenta_gap": float((code_m - ours_m).abs().max()),
        "momenta_l2_gap": float((code_m - ours_m).norm(dim=1).max()),
        "momenta_bound": entry_bound,
        "momenta_l2_bound": l2_bound,
        "fw_gap_code_on_ours": fw_code,
        "fw_gap_ours": fw_ours,
        "server_bound": glr * unit_bound / scale + rounding,
        "solver_bound": glr * (fw_code**0.5 + fw_ours**0.5) / scale + rounding,
    }


def compare_case(checkout, method: str, overrides=None, name=None, nudge=True) -> dict:
    """One method's rounds on both sides. ``overrides`` ({section: {key: value}}) change our setting alone (the
    case then records no 1% change, nor with ``nudge`` false).

    Ours runs three times: free (its round starts are the code's too), with each min-norm round's weights the
    code's (compared with the code within rounding: the solvers' stopping rules apart), and, for the 1% change,
    the latter with the method's term nudged. Our solver's step is compared with the code's weights' apart
    (the Frank-Wolfe gaps' bound)."""
    run_setting = setting(method)
    ours_setting = copy.deepcopy(run_setting)
    for section, values in (overrides or {}).items():
        ours_setting[section] = {**ours_setting[section], **values}
    k, glr = int(run_setting["num_clients"] * run_setting["participation"]), run_setting["server"]["lr"]
    n = run_setting["num_clients"]
    with tempfile.TemporaryDirectory(prefix="fedrepro-parity-fedaware-data-") as tmp:
        root = Path(tmp)
        write_fmnist(root, train=TRAIN, test=TEST)
        parts = code_partition(checkout, root, n)
        free = ours(ours_setting, root, parts)
        starts = {e["round"]: e["start"] for e in free["log"]}
        got = code(checkout, run_setting, root, free)
        lambdas = {t: srv["lambda"] for t, srv in enumerate(got["servers"]) if srv is not None}
        given = ours(ours_setting, root, parts, starts, lambdas) if lambdas else free
        moved = {}
        for section, key in CASES[method][2] if nudge and not overrides else ():
            nudged = copy.deepcopy(ours_setting)
            nudged[section] = {**nudged[section], key: nudged[section][key] * 1.01}
            moved[f"{section}.{key}"] = ours(nudged, root, parts, starts, lambdas or None)["globals"]
    rows, client_ratio, entry_bound, l2_bound = [], 0.0, 0.0, 0.0
    for t, (code_x, our_x) in enumerate(zip(got["globals"], given["globals"])):
        entries = sorted((e for e in given["log"] if e["round"] == t), key=lambda e: e["client"])
        steps = max(sum(len(b) for b in e["batches"]) for e in entries)
        # a momentum: (1 - a) m + a (x - x_i), the client's x_i as far as measured (each within its own bound,
        # checked below), three roundings of |m| + |x - x_i| (lerp rounds once), added to what it carried; in its
        # entries and in L2
        gaps = [u.double() - e["end"].double() for e, u in zip(entries, got["uploads"][t])]
        held = given["servers"][t]["momenta"]
        held = torch.zeros(1, 1) if held is None else held.double()
        deltas = [(e["start"] - e["end"]).double() for e in entries]
        entry_bound += max(float(g.abs().max()) for g in gaps) + 3 * EPS32 * (
            float(held.abs().max()) + max(float(d.abs().max()) for d in deltas)
        )
        l2_bound += max(float(g.norm()) for g in gaps) + 3 * EPS32 * (
            float(held.norm(dim=1).max()) + max(float(d.norm()) for d in deltas)
        )
        for e, upload in zip(entries, got["uploads"][t]):
            gap = float((upload - e["end"]).abs().max() / e["end"].abs().max())
            client_ratio = max(client_ratio, gap / client_bound(sum(len(b) for b in e["batches"])))
        scale = float(our_x.abs().max())
        row = {"round": t, "clients": [e["client"] for e in entries], "code_draw": got["draws"][t],
               "relative_gap": float((code_x - our_x).abs().max()) / scale, "min_norm": t in lambdas}  # fmt: skip
        if t in lambdas:
            row.update(
                _min_norm_rows(
                    got["servers"][t], given["servers"][t], free["servers"][t], glr, scale, (entry_bound, l2_bound)
                )
            )
            row["bound"] = client_bound(steps) + row.pop("server_bound")
            row["solver_gap"] = float((free["globals"][t] - our_x).abs().max()) / scale
        else:
            row["bound"] = client_bound(steps) + (4 * k + 4) * EPS32
        for term, globals_ in moved.items():
            row[f"one_percent_{term}_over_bound"] = float((code_x - globals_[t]).abs().max()) / scale / row["bound"]
        rows.append(row)
    ratio = max(r["relative_gap"] / r["bound"] for r in rows) if len(rows) == run_setting["rounds"] else float("inf")
    solver_ratio = max((r["solver_gap"] / r["solver_bound"] for r in rows if r["min_norm"]), default=0.0)
    momenta_ratio = max(
        (max(r["momenta_gap"] / r["momenta_bound"], r["momenta_l2_gap"] / r["momenta_l2_bound"]) for r in rows
         if r["min_norm"]), default=0.0)  # fmt: skip
    partition_equal = got["partition"] == [p.tolist() for p in parts]
    equal = ratio <= 1 and client_ratio <= 1 and solver_ratio <= 1 and momenta_ratio <= 1 and partition_equal
    return {
        "case": name or f"{method} ({CASES[method][0]}), the code's FMNIST protocol",
        "code_argv": got["argv"],
        "switches": {
            "cohort.warmup": ours_setting["cohort"]["warmup"],
            "cohort.assignment": ours_setting["cohort"]["assignment"],
            "client.shuffle": ours_setting["client"]["shuffle"],
        },  # fmt: skip
        "rounds": run_setting["rounds"],
        "clients": n,
        "per_round": k,
        "client_sizes": [len(p) for p in parts],
        "partition_equal": partition_equal,
        "by_round": rows,
        "global_gap_over_bound": ratio,
        "client_gap_over_bound": client_ratio,
        "solver_gap_over_bound": solver_ratio,
        "momenta_gap_over_bound": momenta_ratio,
        "one_percent": {term: [r[f"one_percent_{term}_over_bound"] for r in rows] for term in moved},
        "code_printed_last": got["printed_last"],
        "status": "equal" if equal else "differs",
    }


# ours at the paper's value of a switch, against the code: what the switch does over whole rounds
PAPER_FORMS = {
    "fedaware, uploads credited to their senders (paper; cohort.assignment: per_client)": (
        "fedaware", {"cohort": {"assignment": "per_client"}}),
}  # fmt: skip


def compare_fedaware(checkout) -> list[dict]:
    require_fedlab()
    rows = [compare_case(checkout, method) for method in CASES]
    return rows + [compare_case(checkout, m, overrides, name) for name, (m, overrides) in PAPER_FORMS.items()]
