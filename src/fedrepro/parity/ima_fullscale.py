"""IMA's code at full scale on the real Fashion-MNIST: Table 1's FMNIST (CNN) #C=2 cell, FedAvg alone (FMA, the
notebook's ``agg_mode='wa'``) and FedAvg + IMA (``agg_mode='ima'``), one seed, resumable across killed processes.

What runs is the code's own: each notebook's cells, unchanged, from its imports to the cell that calls
``Server.fedavg`` (``main_mnist_fmnist_cifar_label_skew_test_allmethods_wa.ipynb`` for FMA, ``..._ima.ipynb`` for
+IMA), executed in order in one namespace by this driver, in a scratch folder outside the checkout. Its settings are
``args.py``'s defaults, which are this cell's: 100 clients, 10 a round, 300 rounds, E = 5, B = 50, lr 0.01 decayed
0.99 a round, momentum 0.9, its CNN, the split ``2CNN_2`` (FedLab's shards, 2 a client, partition seed 1), training
seed 2023 (``args.seed``, which ``Server`` reseeds every generator with), IMA from t_s = 225 with a window of 5 and
the rate decayed 0.97 a round from t_s (``decay_mode`` EXD).

The shim, by names in the code's modules (never its files): torchvision's ``FashionMNIST(root="data/fmnist/",
download=True)`` finds the real files already in place (fedrepro's reader copies them from Debian's
``dataset-fashion-mnist`` folder into the scratch folder, checking their content's sha256), so nothing is
downloaded; the folders the code saves into (``results/Test/...``, ``acc results/``) are made; CUDA answers no;
matplotlib draws off screen; the placeholders of ``parity.rounds.STUBS`` stand in for modules its HEAD imports
but lacks. ``args.args_parser`` may be given other values (the tests shrink the run; the full run changes nothing).

Resumption. ``server_se1``'s ``client_update``, ``aggregation`` and ``test_on_globaldataset`` (the names its
module imported) are wrapped (``Resumable``). Every ``every`` rounds, at the end of a round, the wrapper saves what
the next round reads: the global model, the window of the last P global models as ``aggregation(..., 'ima')``
holds it, the clients' loss lists, ``Server.args`` (which the loop mutates from t_s on), torch's, NumPy's and
Python's generator states and the per-round accuracies. A restarted process runs the same cells; the wrappers
skip the saved rounds without computing them (no training, no test: the recorded accuracies are handed back),
and at the end of the last skipped round put the saved state in place, so the next round starts bit for bit
where the killed process would have. The loop's own code still runs in the skipped rounds (its sampling, its
``dispatch``, its decay branches, which depend on t alone); the args it arrives at must equal the saved ones.

The +IMA branch forks from the FMA run at t_s: before t_s, ``aggregation(..., 'ima')`` computes the same weighted
mean in the same order as ``'wa'`` and only stores it in its window, and both loops test every round, so the two
runs are the same computation up to round t_s (the two notebooks' setup cells give the same initial model and
client sets; both are checked). The FMA run keeps the window ``'ima'`` would hold and saves its state at t_s; the
+IMA run restarts from it (the notebook runs +IMA from round 0; ``tests/ops/test_parity_ima_fullscale.py``
shows on generated data that the fork gives its accuracies and final model bit for bit)."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from fedrepro.errors import FedreproError
from fedrepro.parity.rounds import STUBS
from fedrepro.parity.shim import checkout_on_path, pandas_positional_getitem

NOTEBOOKS = {
    "fedavg": "main_mnist_fmnist_cifar_label_skew_test_allmethods_wa.ipynb",
    "fedavg+ima": "main_mnist_fmnist_cifar_label_skew_test_allmethods_ima.ipynb",
}
AGG_MODES = {"fedavg": "wa", "fedavg+ima": "ima"}
TRAINING_CALL = "server_fedavg.fedavg("  # the cell that trains FedAvg in both notebooks
MUTATED = ("lr", "weight_decay", "E")  # what the loop's decay branches change in Server.args
NAMES_ONLY = ("setup",)  # args the notebooks set to a file-name string (differs between them; names files alone)


class Stopped(FedreproError):
    """Raised after the checkpoint of ``stop_after`` rounds (an interruption on purpose, caught by the driver)."""


def cells_through_training(notebook: Path) -> list[str]:
    """The notebook's code cells in order, through the first that calls ``server_fedavg.fedavg``."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    out = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        out.append("".join(cell["source"]))
        if TRAINING_CALL in out[-1]:
            return out
    raise ValueError(f"{notebook}: no code cell calls {TRAINING_CALL}")


def _digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _clients_digest(dict_users) -> str:
    return hashlib.sha256(
        json.dumps([sorted(int(i) for i in dict_users[k]) for k in sorted(dict_users)]).encode()
    ).hexdigest()


def _plain(value):
    return value.item() if isinstance(value, torch.Tensor) else value


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    return a == b


def _save(obj, path: Path) -> None:
    """Written whole or not at all: a process killed while saving leaves the previous file."""
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


class Resumable:
    """The wrappers around the code's client_update, aggregation and test_on_globaldataset for one part."""

    def __init__(self, code, folder: Path, every: int, stop_after: int | None, source: dict | None, fork_at=None):
        self.code, self.folder, self.every, self.stop_after = code, folder, every, stop_after
        self.source = source  # the state to resume from (own checkpoint, or the FMA run's state at t_s)
        self.resume = source["round"] if source else 0
        self.fork_at = fork_at  # FMA: save the state at this round for the +IMA branch
        self.t, self.window, self.fingerprint, self.mark, self.loss_dict = 0, None, None, None, None
        self.facts = {}
        self.history = copy.deepcopy(source["history"]) if source else {k: [] for k in ("acc", "loss", "wall", "cpu")}

    # client_update(args, index, client_models, global_model, round, dataset, dict_users, loss_dict)
    def client_update(self, args, index, client_models, global_model, t_arg, dataset, dict_users, loss_dict):
        if self.t == 0:
            self.fingerprint = {
                "initial_model": _digest(global_model.state_dict().values()),
                "clients": _clients_digest(dict_users),
            }
            if self.source and self.source["fingerprint"] != self.fingerprint:
                raise ValueError(f"{self.folder}: the saved state comes from another initial model or client sets")
            if self.window is None:
                self.window = [[] for _ in range(args.window_size)]
        self.loss_dict = loss_dict  # the Server's loss lists (client_update extends and returns this object)
        if self.t < self.resume:
            if self.t == 0:
                loss_dict.clear()
                loss_dict.update(copy.deepcopy(self.source["loss_dict"]))
            return client_models, loss_dict
        if self.mark is None:
            self.mark = (time.time(), time.process_time())
        return self.code["client_update"](args, index, client_models, global_model, t_arg, dataset, dict_users,
                                          loss_dict)  # fmt: skip

    def aggregation(self, index, global_model, client_models, dict_users, *args, **kwargs):
        if self.t < self.resume:
            return self.source["window"] if kwargs.get("agg_mode") == "ima" else kwargs.get("global_models")
        out = self.code["aggregation"](index, global_model, client_models, dict_users, *args, **kwargs)
        if kwargs.get("agg_mode") == "ima":
            self.window = out
        else:  # the window aggregation(..., 'ima') would hold: the new global model in slot t mod P
            self.window[self.t % len(self.window)] = copy.deepcopy(global_model.state_dict())
        return out

    def test_on_globaldataset(self, args, global_model, testset, *a, **k):
        t = self.t
        if t < self.resume:
            if t == self.resume - 1:
                self._restore(args, global_model)
            self.t += 1
            saved = self.source["history"]
            return torch.tensor(saved["acc"][t], dtype=torch.float32), saved["loss"][t]
        acc, loss = self.code["test_on_globaldataset"](args, global_model, testset, *a, **k)
        now = (time.time(), time.process_time())
        for key, i in (("wall", 0), ("cpu", 1)):
            self.history[key].append(now[i] - self.mark[i])
        self.history["acc"].append(float(acc))
        self.history["loss"].append(float(loss))
        self.mark = now
        self.t += 1
        done = self.t
        if done == self.fork_at:
            _save(self._state(args, global_model), self.folder / "fork.pt")
        stop = self.stop_after is not None and done >= self.stop_after
        if done % self.every == 0 or done == args.r or stop:
            _save(self._state(args, global_model), self.folder / "checkpoint.pt")
            self.on_checkpoint(self)
        if stop:
            raise Stopped(done)
        return acc, loss

    def on_checkpoint(self, resumable) -> None:  # replaced by the driver: writes the record
        pass

    def _state(self, args, global_model) -> dict:
        return {
            "round": self.t,
            "model": copy.deepcopy(global_model.state_dict()),
            "window": copy.deepcopy(self.window),
            "loss_dict": copy.deepcopy(self.loss_dict),
            "args": copy.deepcopy(vars(args)),
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
            "history": copy.deepcopy(self.history),
            "fingerprint": self.fingerprint,
            "facts": self.facts,
        }

    def _restore(self, args, global_model) -> None:
        saved = self.source["args"]
        for key, value in saved.items():
            if key not in NAMES_ONLY and not _same(getattr(args, key, None), value):
                raise ValueError(
                    f"{self.folder}: the loop arrives at args.{key} = {getattr(args, key, None)!r} after round "
                    f"{self.t}, the saved state has {value!r} (a state of another setting)"
                )
        for key in MUTATED:
            setattr(args, key, saved[key])
        global_model.load_state_dict(self.source["model"])
        self.window = copy.deepcopy(self.source["window"])
        torch.set_rng_state(self.source["rng"]["torch"])
        np.random.set_state(self.source["rng"]["numpy"])
        random.setstate(self.source["rng"]["python"])


def prepare(scratch: Path, data: Path | None) -> None:
    """The scratch folder the code runs in: the real Fashion-MNIST where its cell looks (``data/fmnist/``), or the
    idx files of ``data`` (tests), and the folders it saves into."""
    raw = scratch / "data" / "fmnist" / "FashionMNIST" / "raw"
    if data is None:
        from fedrepro.data import fmnist

        fmnist.download("fmnist", scratch / "data" / "fmnist", mirrors=[fmnist.DEBIAN_FMNIST], log=lambda *a: None)
    else:
        raw.mkdir(parents=True, exist_ok=True)
        for f in (Path(data) / "FashionMNIST" / "raw").iterdir():
            shutil.copyfile(f, raw / f.name)
    (scratch / "acc results").mkdir(exist_ok=True)


@contextlib.contextmanager
def _no_cuda():
    available = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        yield
    finally:
        torch.cuda.is_available = available


def run_part(checkout, out: Path, part: str, every: int = 10, stop_after=None, overrides=None, data=None,
             on_checkpoint=None, fork: bool = True) -> dict:  # fmt: skip
    """Run (or resume) one part, ``fedavg`` or ``fedavg+ima``, in ``out``/<part>; return its last saved state.
    ``stop_after``: stop after that many rounds (its state saved); ``fork``: +IMA starts from the FedAvg run's state
    at t_s (else from round 0, as the notebook runs it); ``data``: a folder of idx files instead of the real ones."""
    import matplotlib

    matplotlib.use("Agg")
    checkout, out = Path(checkout).resolve(), Path(out).resolve()
    folder = out / part
    folder.mkdir(parents=True, exist_ok=True)
    scratch = out / "scratch"
    scratch.mkdir(exist_ok=True)
    prepare(scratch, data)
    own, fork = folder / "checkpoint.pt", out / "fedavg" / "fork.pt"
    source = torch.load(own, weights_only=False) if own.exists() else None
    if part == "fedavg+ima" and source is None and fork:
        if not fork.exists():
            raise ValueError(f"{fork}: FedAvg + IMA forks from the FedAvg run at t_s; run that part to t_s first")
        source = torch.load(fork, weights_only=False)
    with checkout_on_path(checkout, stubs=STUBS), _no_cuda(), pandas_positional_getitem():
        import args as args_module
        import server_se1

        defaults = args_module.args_parser

        def args_parser():
            parsed = defaults()
            for key, value in (overrides or {}).items():
                setattr(parsed, key, value)
            return parsed

        args_module.args_parser = args_parser
        if source is not None and source["round"] >= args_parser().r:
            return source
        code = {n: getattr(server_se1, n) for n in ("client_update", "aggregation", "test_on_globaldataset")}
        resumable = Resumable(code, folder, every, stop_after, source,
                              fork_at=args_parser().r_ima if part == "fedavg" else None)  # fmt: skip
        resumable.on_checkpoint = on_checkpoint or (lambda r: None)
        for name in code:
            setattr(server_se1, name, getattr(resumable, name))
        results = scratch / "results" / "Test" / "label skew" / "fmnist" / "fedavg" / f"seed{args_parser().seed}"
        results.mkdir(parents=True, exist_ok=True)
        scope = {"__name__": "__notebook__"}
        cwd = os.getcwd()
        os.chdir(scratch)
        try:
            cells = cells_through_training(checkout / NOTEBOOKS[part])
            for i, cell in enumerate(cells[:-1]):
                exec(compile(cell, f"{NOTEBOOKS[part]}, code cell {i}", "exec"), scope)  # unchanged
            resumable.facts = _setup_facts(scope, checkout)
            exec(compile(cells[-1], f"{NOTEBOOKS[part]}, the FedAvg cell", "exec"), scope)
        except Stopped:
            pass
        finally:
            os.chdir(cwd)
    return torch.load(own, weights_only=False)


def _setup_facts(scope: dict, checkout: Path) -> dict:
    """What the setup cells built: the partitioner's file (the checkout's own FedLab copy must be the one used),
    the client sets' sizes and digest, how many of them fedrepro's ``shards`` kind draws at the same setting
    (FedLab's recipe, seed 1, repeats allowed; fedrepro draws from ``default_rng``, FedLab from NumPy's legacy
    global generator) and the classes each client holds on both sides, and the args the training cell runs with."""
    import inspect

    from fedrepro import partitions

    part = scope["noniid_labeldir_part"]
    source = Path(inspect.getfile(type(part))).resolve()
    if checkout not in source.parents:
        raise ValueError(f"the notebook's partitioner comes from {source}, not from the checkout's fedlab copy")
    users, args = scope["dict_users_train"], scope["args"]
    labels = np.asarray(scope["trainset"].targets)
    code_sets = [np.sort(np.fromiter(users[k], dtype=np.int64)) for k in range(len(users))]
    ours = partitions.make(labels, {"kind": "shards", "seed": 1, "classes_per_client": 2, "distinct": False,
                                    "num_clients": len(users)})  # fmt: skip

    def classes(sets) -> dict:
        held = np.unique([len(set(labels[s])) for s in sets], return_counts=True)
        return {str(int(c)): int(n) for c, n in zip(*held)}

    return {
        "partitioner": str(source.relative_to(checkout)),
        "clients": len(users),
        "client_sizes": sorted({len(s) for s in code_sets}),
        "clients_sha256": _clients_digest(users),
        "fedrepro_shards_equal_clients": int(sum(np.array_equal(a, b) for a, b in zip(code_sets, ours))),
        "clients_by_classes_held": {"code": classes(code_sets), "fedrepro": classes(ours)},
        "args": {k: _plain(v) for k, v in vars(args).items() if isinstance(v, (int, float, str, torch.Tensor))},
    }
