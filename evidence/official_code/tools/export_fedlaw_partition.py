"""Export FedLAW's FMNIST Dir(0.1) / 20-client partition of one seed and its splits.

Replays, in a fresh process and with the run's arguments, exactly the start of
main_baselines.py / main_fedlaw.py (setup_seed, Data(args), Node(-1, ...), Node(i, ...)),
importing the authors' modules unchanged (CPU shim: this folder's sitecustomize.py on PYTHONPATH),
and reads the index lists the Nodes hold.  The numpy stream that draws the splits is the same
for FedAvg and FedLAW (model init consumes only torch's stream).
Arguments: --seed (the run's --random_seed, 8 unless given), --code (the authors' checkout, the
current folder unless given), --out (the output path without extension; writes .npz and .json),
--kept (optional: also write the form kept in evidence/official_code/partitions/, only client_0..19
as uint16 in a compressed .npz, the file `partition.kind: file` reads; numpy writes it byte for byte
the same for the same lists).
The code reads /home/Dataset/FashionMNIST; PARITY_REMAP_ROOT points it at a folder holding
FashionMNIST/raw/ with the four unzipped idx files.  Run as (seed 8 was exported from /work/parity/FedLAW):
  PYTHONPATH=evidence/official_code/tools PARITY_PATCH_FEDLAB=0 \
  PARITY_REMAP_ROOT=/home/Dataset/FashionMNIST=<data root> \
  python evidence/official_code/tools/export_fedlaw_partition.py --seed 9 --code <checkout> \
    --out <folder>/fedlaw_fmnist_dir0.1_seed9_n20
"""
import argparse
import json
import os
import sys

import numpy as np

_cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
_cli.add_argument("--seed", type=int, default=8, help="the run's --random_seed (draws the partition)")
_cli.add_argument("--code", default=".", help="the FedLAW checkout (ZexiLee/ICML-2023-FedLAW)")
_cli.add_argument("--out", default=None, help="output path without extension")
_cli.add_argument("--kept", default=None, help="also write client_0..19 as uint16, compressed, to this .npz")
_opts = _cli.parse_args()
if not os.path.isfile(os.path.join(_opts.code, "datasets.py")):
    sys.exit("--code %s: no datasets.py there; give the FedLAW checkout" % _opts.code)
SEED = _opts.seed
OUT = _opts.out or "/work/parity/partitions/fedlaw_fmnist_dir0.1_seed%d_n20" % SEED

sys.argv = ["main_baselines.py", "--dataset", "fmnist", "--local_model", "MLP", "--dirichlet_alpha", "0.1",
            "--node_num", "20", "--T", "200", "--E", "3", "--random_seed", str(SEED), "--lr", "0.08",
            "--local_wd_rate", "5e-4", "--momentum", "0.9", "--server_method", "fedavg", "--client_method", "local_train"]
sys.path.insert(0, os.path.abspath(_opts.code))
from datasets import Data  # noqa: E402  (FedLAW's datasets.py)
from nodes import Node  # noqa: E402
from args import args_parser  # noqa: E402
from utils import setup_seed  # noqa: E402

args = args_parser()
setup_seed(args.random_seed)
data = Data(args)
groups = [np.asarray(list(data.groups[i]), dtype=np.int64) for i in range(args.node_num)]
sizes_full = [len(data.train_loader[i]) for i in range(args.node_num)]
central = Node(-1, data.test_loader[0], data.test_set, args)
clients = {i: Node(i, data.train_loader[i], data.train_set, args) for i in range(args.node_num)}

out = {}
for i in range(args.node_num):
    full = np.asarray(list(data.train_loader[i]), dtype=np.int64)  # shuffled in place by Node; same set
    tr = np.asarray(clients[i].local_data.dataset.idxs, dtype=np.int64)
    va = np.asarray(clients[i].validate_set.dataset.idxs, dtype=np.int64)
    assert sorted(full.tolist()) == sorted(groups[i].tolist())
    assert sorted(np.concatenate([tr, va]).tolist()) == sorted(full.tolist())
    out["client_%d" % i] = groups[i]            # the partition, in the order datasets.py made it
    out["client_train_%d" % i] = tr             # the 70% the client trains on (order after Node's shuffle)
    out["client_valid_%d" % i] = va             # the 30% held out (client_valid_ratio 0.3)
proxy = np.asarray(central.validate_set.dataset.idxs, dtype=np.int64)   # indices into the TEST set
evalset = np.asarray(central.local_data.dataset.idxs, dtype=np.int64)   # indices into the TEST set
out["server_proxy"] = proxy
out["server_test"] = evalset

allidx = np.concatenate(groups)
assert allidx.min() >= 0 and allidx.max() < 60000
assert len(np.unique(allidx)) == len(allidx), "an index appears twice"
print("total assigned:", len(allidx), "of 60000")
print("client sizes (full, incl. 30% valid):", [len(g) for g in groups])
print("client train sizes:", [len(out["client_train_%d" % i]) for i in range(20)])
print("client valid sizes:", [len(out["client_valid_%d" % i]) for i in range(20)])
print("empty clients:", [i for i, g in enumerate(groups) if len(g) == 0])
print("size weights (from len(data.train_loader[i])):", np.round(np.array(sizes_full) / sum(sizes_full), 4).tolist())
ytr = data.train_set.targets.numpy()
yte = data.test_set.targets.numpy()
for i, g in enumerate(groups):
    print(i, np.bincount(ytr[g], minlength=10).tolist())
print("server proxy: %d test indices, per class %s" % (len(proxy), np.bincount(yte[proxy], minlength=10).tolist()))
print("server test (evaluation) set: %d test indices; proxy and eval disjoint: %s; union = all 10000: %s"
      % (len(evalset), len(set(proxy) & set(evalset)) == 0, len(set(proxy) | set(evalset)) == 10000))

np.savez(OUT + ".npz", **out)
meta = {"source": "ZexiLee/ICML-2023-FedLAW@47f7a7226baeb4d684e5d555f793caba874adea3 datasets.Data + nodes.Node, args: " + " ".join(sys.argv[1:]),
        "clients": [groups[i].tolist() for i in range(20)],
        "client_train": [out["client_train_%d" % i].tolist() for i in range(20)],
        "client_valid": [out["client_valid_%d" % i].tolist() for i in range(20)],
        "server_proxy_test_indices": proxy.tolist(),
        "server_eval_test_indices": evalset.tolist(),
        "note": "clients/client_train/client_valid index the FashionMNIST TRAIN set (60000); server_* index the TEST set (10000)"}
json.dump(meta, open(OUT + ".json", "w"))
print("wrote", OUT + ".npz", OUT + ".json")
if _opts.kept:
    assert allidx.max() < 2 ** 16  # uint16 holds every train-set index (all below 60,000)
    np.savez_compressed(_opts.kept, **{"client_%d" % i: groups[i].astype(np.uint16) for i in range(args.node_num)})
    print("wrote", _opts.kept)
