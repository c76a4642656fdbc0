"""Does FedLAW's FMNIST num_classes=100 bug change client membership?  Replays
datasets.build_non_iid_by_dirichlet_new with num_classes=100 (as the code calls it) and =10."""
import sys
import numpy as np
import torchvision
sys.path.insert(0, ".")
from datasets import build_non_iid_by_dirichlet_new
ts = torchvision.datasets.FashionMNIST(root="/work/parity/FedLAW/data", train=True, download=False)
g100, p100 = build_non_iid_by_dirichlet_new(np.random.RandomState(8), ts, 0.1, 100, len(ts), 20)
g10, p10 = build_non_iid_by_dirichlet_new(np.random.RandomState(8), ts, 0.1, 10, len(ts), 20)
same_sets = all(sorted(g100[i]) == sorted(g10[i]) for i in range(20))
same_order = all(list(g100[i]) == list(g10[i]) for i in range(20))
print("proportion matrix shape with num_classes=100:", p100.shape, "columns 10..99 all zero:", bool((p100[:, 10:] == 0).all()))
print("client sets identical to num_classes=10:", same_sets, "; within-client order identical:", same_order)
ref = np.load("/work/parity/partitions/fedlaw_fmnist_dir0.1_seed8_n20.npz")
print("exported client_i equal to this replay (order too):", all(np.array_equal(ref["client_%d" % i], np.asarray(g100[i])) for i in range(20)))
