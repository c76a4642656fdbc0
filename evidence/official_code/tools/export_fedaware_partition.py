"""Export FedAWARE's FMNIST Dir(0.1) / dseed 2023 / 100-client partition as index arrays.

FedLab's saved client files (datasets/fmnist/fed_fmnist_0.1/train/data{cid}.pkl) hold a
fedlab Subset that keeps the images and targets but NOT the indices.  So the indices are
recomputed with the very call the code makes in partitioned_fmnist.PartitionedFMNIST.preprocess
(MNISTPartitioner(trainset.targets, 100, partition="noniid-labeldir", dir_alpha=0.1, seed=2023))
and then checked against every saved pkl, image by image and label by label.
Run from /work/parity/FedAWARE with the parity venv.
"""
import json
import os
import sys

import numpy as np
import torch
import torchvision
from fedlab.utils.dataset.partition import MNISTPartitioner

ROOT = "/work/parity/FedAWARE"
OUT = "/work/parity/partitions/fedaware_fmnist_dir0.1_dseed2023"
N = 100

trainset = torchvision.datasets.FashionMNIST(root=os.path.join(ROOT, "datasets/fmnist/"), train=True, download=False)
targets = trainset.targets.clone()
part = MNISTPartitioner(trainset.targets, N, partition="noniid-labeldir", dir_alpha=0.1, verbose=False, seed=2023)
clients = [np.asarray(part.client_dict[c], dtype=np.int64) for c in range(N)]

# check against the files the code saved and trains on
for c in range(N):
    sub = torch.load(os.path.join(ROOT, "datasets/fmnist/fed_fmnist_0.1/train/data{}.pkl".format(c)), weights_only=False)
    assert len(sub.data) == len(clients[c]), c
    imgs = torch.stack(list(sub.data))
    assert torch.equal(imgs, trainset.data[clients[c]]), "images differ for client %d" % c
    assert list(sub.targets) == targets[clients[c]].tolist(), "labels differ for client %d" % c
print("all 100 saved data{cid}.pkl match the recomputed indices (images, labels, order)")

allidx = np.concatenate(clients)
assert allidx.min() >= 0 and allidx.max() < 60000
assert len(np.unique(allidx)) == len(allidx), "an index appears twice"
assert all(len(c) > 0 for c in clients)
print("total assigned:", len(allidx), "of 60000; unique:", len(np.unique(allidx)))
sizes = [len(c) for c in clients]
print("client sizes:", sizes)
print("size min/median/max:", min(sizes), int(np.median(sizes)), max(sizes))
y = targets.numpy()
counts = np.stack([np.bincount(y[c], minlength=10) for c in clients])
dom = counts.max(1) / counts.sum(1)
ncls = (counts > 0).sum(1)
print("label counts per client (rows=clients, cols=classes 0..9):")
for c in range(N):
    print(c, counts[c].tolist())
print("share of the dominant class per client: mean %.3f median %.3f; classes present per client: mean %.2f, min %d, max %d"
      % (dom.mean(), np.median(dom), ncls.mean(), ncls.min(), ncls.max()))

np.savez(OUT + ".npz", **{"client_%d" % c: clients[c] for c in range(N)})
json.dump({"clients": [c.tolist() for c in clients],
           "source": "dunzeng/FedAWARE@30836e9f79e3416b81e4eae60b82225966f86be5 settings.get_settings fmnist dirichlet dir=0.1 dseed=2023 (FedLab 1.3.0 MNISTPartitioner noniid-labeldir)",
           "dataset": "FashionMNIST train (60000, torchvision order)"},
          open(OUT + ".json", "w"))
print("wrote", OUT + ".npz", OUT + ".json")
