"""Turn the parity logs into per-round CSVs (round,test_acc) and final numbers.

FedAWARE: per-round test accuracy is the TensorBoard scalar Test/accuracy/fmnist (fraction,
full precision) that fedaware.py / baselines/fedavg.py write every round (freq=1); the
stdout line "Round t, ..., Generalization: acc-loss" (4 decimals) is used as a cross-check.
Accuracies are written in percent.  FedLAW: the stdout line "..., global model test acc is X"
(percent, 9800 test images), one per round; final = mean of the last 10 (the code also prints
its own "final_testacc", compared here).
usage: python records.py   (writes /work/parity/records/*.csv and prints a summary table)
"""
import glob
import os
import re

import numpy as np

LOGS = "/work/parity/logs"
REC = "/work/parity/records"
os.makedirs(REC, exist_ok=True)


def tb_scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    ea.Reload()
    return [(e.step, e.value) for e in ea.Scalars(tag)]


def fedaware(label, method, seed):
    log = os.path.join(LOGS, label + ".log")
    if not os.path.exists(log):
        return None
    txt = open(log).read()
    stdout = [(int(m.group(1)), float(m.group(2))) for m in
              re.finditer(r"^Round (\d+), Loss \S+, Accuracy: \S+, Generalization: ([0-9.]+)-", txt, re.M)]
    pat = ("/work/parity/FedAWARE/fmnist-logs/fmnist_dirichlet_0.1_2023/Run{}_N100_BS64_EP3_LLR0.01_K10_T170_H0_Projection0/"
           "Setting_{}_GLR1.0_*".format(seed, method))
    dirs = sorted(glob.glob(pat), key=os.path.getmtime)
    rows, src = None, None
    if dirs:
        try:
            rows = [(s, 100 * v) for s, v in tb_scalars(dirs[-1], "Test/accuracy/fmnist")]
            src = dirs[-1]
        except Exception as e:  # noqa: BLE001
            print("tensorboard read failed", e)
    if not rows:
        rows, src = [(s, 100 * v) for s, v in stdout], log
    for (s1, a1), (s2, a2) in zip(rows, stdout):
        assert s1 == s2 and abs(a1 - 100 * a2) < 0.006, (s1, a1, s2, a2)
    return rows, src, "PARITY_END" in txt


def fedlaw(label):
    log = os.path.join(LOGS, label + ".log")
    if not os.path.exists(log):
        return None
    txt = open(log).read()
    accs = [float(x) for x in re.findall(r"global model test acc is\s+([0-9.]+)", txt)]
    rows = [(i, a) for i, a in enumerate(accs)]  # round index 0 = the code's "1-th round"
    m = re.search(r"final_testacc is\s+([0-9.]+)", txt)
    if m and len(accs) >= 10:
        assert abs(float(m.group(1)) - np.mean(accs[-10:])) < 1e-6
    return rows, log, "PARITY_END" in txt


runs = []
for s in (1998, 37, 73):
    runs.append(("fedaware_fedaware_seed%d" % s, fedaware("fedaware_fedaware_seed%d" % s, "fedaware", s), 170))
    runs.append(("fedaware_fedavg_seed%d" % s, fedaware("fedaware_fedavg_seed%d" % s, "fedavg", s), 170))
runs.append(("fedlaw_fedavg_seed8", fedlaw("fedlaw_fedavg_seed8"), 200))
runs.append(("fedlaw_fedlaw_seed8", fedlaw("fedlaw_fedlaw_seed8"), 200))
runs.append(("fedlaw_feddyn_seed8", fedlaw("fedlaw_feddyn_seed8"), 200))

print("| run | rounds logged | complete | mean last 10 (%) | last round (%) | per-round source |")
print("|---|---|---|---|---|---|")
for name, res, T in runs:
    if res is None:
        print("| %s | not started | | | | |" % name)
        continue
    rows, src, ended = res
    with open(os.path.join(REC, name + ".csv"), "w") as f:
        f.write("round,test_acc\n")
        for r, a in rows:
            f.write("%d,%.6f\n" % (r, a))
    done = len(rows) == T
    accs = [a for _, a in rows]
    fin = "%.2f" % np.mean(accs[-10:]) if done else "(running: last-10 so far %.2f)" % np.mean(accs[-10:]) if accs else "-"
    last = "%.2f" % accs[-1] if accs else "-"
    print("| %s | %d/%d | %s | %s | %s | %s |" % (name, len(rows), T, "yes" if done and ended else "no", fin, last, src))
