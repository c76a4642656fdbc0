"""FedNova's clients, the code's and fedrepro's, on the same batches: the local solver (momentum, weight decay,
proximal term), its normalising vector a_i, tau_eff and each client's normalised share of the average.

fedrepro's side is its real trainer (``run.trainer.Trainer``, the sequential path) at FedNova Table I's
E_i(t) ~ U(2,5) settings of FedNova (params/fednova.yaml: plain SGD, local momentum, proximal term; the server
and hybrid momentum rows are the server check's, the VR rows have no code), shrunk: three clients of unequal
sizes (so last batches are partial), 3 rounds, each client's epochs drawn from {1, 2, 3} every round by
+random_epochs (unequal step counts per client and round), batches of 16, a small CIFAR-shaped model (the
step does not depend on it; VGG-11 and its dropout are the round check's). One case more turns every term up
at once (momentum 0.9, weight decay 0.01, mu 0.5), so a wrong momentum, decay or mu shows far above the bound.

The code's side is ``distoptim.FedNova``, unchanged: one optimiser per client, created once and kept across
rounds as each rank of ``train_LocalSGD.py`` keeps its own, stepped on fedrepro's batches as the script's
``train`` steps it (backward, step, zero_grad), then ``average()``. Pinned from outside: at the start of each
round every client's parameters and its optimiser's ``old_init`` (which ``average()`` sets to the new global
model) hold fedrepro's global model of that round, and the rate in its param groups is fedrepro's (the round
check compares the schedule). ``average()`` all-reduces through the name ``dist`` in the code's module; there it
is an in-process all-reduce over one thread per client (a barrier, then every thread sums the posted tensors in
client order: what gloo's SUM gives, up to the order of additions), so each client's ``average()`` runs whole.

Compared, per client and round: the steps (equal), a_i (the code's ``local_normalizing_vec`` against fedrepro's
``a_norm``, both float64 recursions: 1e-12 relative), the client's model after its local training (float32),
its normalised share (the tensor it posts to the all-reduce against fedrepro's ``nova_scale_i * Delta_i``);
per round: tau_eff (the all-reduced sum against fedrepro's, float32) and the new global model. The bounds are
derived in ``client_bound`` and ``global_bound``."""

from __future__ import annotations

import copy
import sys
import tempfile
import threading
from types import SimpleNamespace

import torch

from fedrepro.parity.clients import EPS32, bound, generated_clients, merged, record_local_training
from fedrepro.parity.shim import checkout_on_path

SIZES = (45, 70, 29)
SHRUNK = {"num_clients": len(SIZES), "participation": 1.0, "rounds": 3, "batch_size": 16, "model": "simplecnn",
          "device": "cpu", "random_epochs": {"low": 1, "high": 3}}  # fmt: skip
STRONG = {"client": {"lr": 0.02, "momentum": 0.9, "weight_decay": 0.01}, "fednova": {"mu": 0.5}}
A_RELATIVE = 1e-12  # a_i: the same float64 recursion on both sides


def fednova_settings() -> dict[str, dict]:
    """Table I U(2,5)'s FedNova rows with a client solver the code has (no VR, no server momentum), shrunk; each
    optimiser once more with every term up (FedNova's and, from the FedProx row, the code's FedProx)."""
    from fedrepro.configure import expansion, paramsfile
    from fedrepro.configure.paramsfile import ROOT

    found = {}
    for run in expansion.expand(paramsfile.load_params_files([str(ROOT / "params" / "fednova.yaml")])):
        s = run.setting
        nova = s.get("fednova", {})
        if run.experiment == "fednova_table1_u25" and s["algorithm"] == "fedprox":
            prox = {**copy.deepcopy(s), **SHRUNK}
        if run.experiment != "fednova_table1_u25" or s["algorithm"] != "fednova" or nova["vr"]:
            continue
        if nova["server_momentum"]:
            continue
        c = s["client"]
        label = f"lr {c['lr']:g}, momentum {c['momentum']:g}, mu {nova['mu']:g}, weight decay {c['weight_decay']:g}"
        found.setdefault(label, {**copy.deepcopy(s), **SHRUNK})
    base = next(s for s in found.values() if s["client"]["momentum"])
    strong = merged(base, STRONG)
    c = strong["client"]
    found[f"every term up: lr {c['lr']:g}, momentum {c['momentum']:g}, mu {strong['fednova']['mu']:g}, "
          f"weight decay {c['weight_decay']:g}"] = strong  # fmt: skip
    # the code's FedProx optimiser (its fedavg and fedprox), every term up: its step's mu, momentum and decay
    strong = merged(prox, {"client": STRONG["client"], "fedprox": STRONG["fednova"]})
    c = strong["client"]
    found[f"FedProx (the code's FedProx optimiser), every term up: lr {c['lr']:g}, momentum {c['momentum']:g}, "
          f"mu {strong['fedprox']['mu']:g}, weight decay {c['weight_decay']:g}"] = strong  # fmt: skip
    return found


def _problem(seed: int = 2):
    return generated_clients(SIZES, (3, 32, 32), 40, seed)


def ours(setting: dict, problem=None, module=None, wrap=None):
    """fedrepro's run: (every client's local training, per round what its FedNova aggregation computed).
    ``problem``: (train, test, parts), default ``_problem()``; ``wrap(trainer)`` runs before training."""
    from fedrepro import models
    from fedrepro.run.trainer import Trainer

    train, test, parts = problem or _problem()
    log, rounds = [], []
    with tempfile.TemporaryDirectory(prefix="fedrepro-parity-fednova-") as tmp:
        module = models.build(setting["model"], setting["dataset"]) if module is None else module
        trainer = Trainer(setting, tmp, None, None, datasets=(train, test), parts=parts, module=module)
        trainer.cohort_mode = "off"
        record_local_training(trainer, log)
        if wrap is not None:
            wrap(trainer)
        aggregate = trainer.aggregate

        def recorded(plan, updates):
            x_new = aggregate(plan, updates)
            info = updates.info
            entry = {"clients": updates.clients.tolist(), "steps": updates.steps.tolist(), "x": plan.x.clone(),
                     "x_new": x_new.clone()}  # fmt: skip
            if "nova_scale" in info:  # FedNova: its normalised shares
                scale = info["nova_scale"]
                entry.update(a_norm=info["a_norm"].tolist(), tau_eff=info["tau_eff"])
            else:  # FedAvg and FedProx (the round check's cases of the code's FedProx optimiser): the weights
                scale = updates.weights
            entry.update(scale=scale.tolist(), shares=scale[:, None] * updates.deltas)
            rounds.append(entry)
            return x_new

        trainer.aggregate = recorded
        trainer.run(progress=False)
    return log, rounds


class ThreadAllReduce:
    """``torch.distributed.all_reduce`` (SUM) over ``world`` threads in one process: each thread posts its tensor,
    all wait, each sums the posted tensors in rank order, all wait, each writes the sum into its tensor."""

    def __init__(self, world: int):
        self.world, self.barrier, self.local = world, threading.Barrier(world), threading.local()
        self.posted, self.log = [None] * world, []

    def __call__(self, tensor, op=None, **kwargs):
        rank = self.local.rank
        self.posted[rank] = tensor.clone()
        self.barrier.wait()
        total = self.posted[0].clone()
        for other in self.posted[1:]:
            total += other
        if rank == 0:
            self.log.append([t.clone() for t in self.posted])
        self.barrier.wait()
        tensor.copy_(total)

    def run(self, functions):
        def body(rank, fn):
            self.local.rank = rank
            fn()

        threads = [threading.Thread(target=body, args=(r, fn)) for r, fn in enumerate(functions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def code_optimiser(setting: dict) -> tuple[str, dict]:
    """The code's optimiser for fedrepro's method (``train_LocalSGD.py``'s table: fedavg and fedprox are its
    ``FedProx`` class, mu 0 for fedavg) and its method arguments: (class name, {mu, gmf})."""
    method = setting["algorithm"]
    if method == "fednova":
        return "FedNova", {"mu": setting["fednova"]["mu"], "gmf": setting["fednova"]["server_momentum"]}
    if method in ("fedavg", "fedprox"):  # FedProx.average never reads gmf: no server momentum in the code
        return "FedProx", {"mu": setting["fedprox"]["mu"] if method == "fedprox" else 0.0, "gmf": 0.0}
    raise ValueError(f"algorithm {method}: FedNova's code has fedavg, fedprox and fednova (distoptim)")


def code(checkout, setting: dict, log: list[dict], rounds: list[dict], on_client=None, sizes=SIZES) -> list[dict]:
    """The code's optimisers (``code_optimiser``: FedNova, or FedProx for fedavg and fedprox) on fedrepro's batches
    from fedrepro's round-start models; per round what they computed: each client's end model and steps (and
    FedNova's a_i), the tensors they all-reduced (FedNova: tau_eff's terms, then the shares; FedProx: the models
    times their ratios), the new model. In torch's default dtype (the round check's float64 oracle sets float64);
    ``on_client(c)`` before each client's local steps."""
    from fedrepro import models

    cl = setting["client"]
    name, method_args = code_optimiser(setting)
    k = setting["num_clients"]
    with checkout_on_path(checkout):
        import distoptim  # noqa: F401  (the package binds the names FedNova and FedProx to the classes)

        module = sys.modules[f"distoptim.{name}"]

        reduce = ThreadAllReduce(k)
        module.dist = SimpleNamespace(all_reduce=reduce, ReduceOp=torch.distributed.ReduceOp)
        torch.manual_seed(0)
        template = models.build(setting["model"], setting["dataset"])
        nodes = []
        for c in range(k):
            model = copy.deepcopy(template)
            opt = getattr(module, name)(
                model.parameters(), ratio=sizes[c] / sum(sizes), lr=cl["lr"], momentum=cl["momentum"],
                weight_decay=cl["weight_decay"], **method_args,
            )  # fmt: skip
            nodes.append(SimpleNamespace(model=model, opt=opt))
        out = []
        for t, ours_round in enumerate(rounds):
            entries = sorted((e for e in log if e["round"] == t), key=lambda e: e["client"])
            got = {"clients": {}, "x_new": None}
            for e in entries:
                node = nodes[e["client"]]
                if on_client is not None:
                    on_client(e["client"])
                start = e["start"].to(torch.get_default_dtype())
                torch.nn.utils.vector_to_parameters(start, node.model.parameters())
                for group in node.opt.param_groups:
                    group["lr"] = e["lr"]
                    for p in group["params"]:
                        if "old_init" in node.opt.state[p]:
                            node.opt.state[p]["old_init"].copy_(p.data)
                node.model.train()
                steps = 0
                for epoch in e["batches"]:
                    for x, y in epoch:
                        x = x.to(torch.get_default_dtype())
                        loss = torch.nn.functional.cross_entropy(node.model(x), y)
                        loss.backward()
                        node.opt.step()
                        node.opt.zero_grad()
                        steps += 1
                got["clients"][e["client"]] = {
                    "end": _vector(node.model), "a": float(getattr(node.opt, "local_normalizing_vec", "nan")),
                    "steps": int(getattr(node.opt, "local_steps", steps)),
                }  # fmt: skip
            reduce.log.clear()
            reduce.run([nodes[e["client"]].opt.average for e in entries])
            *tau_terms, shares = reduce.log  # FedProx all-reduces its models alone
            got["tau_eff"] = float(sum(float(x) for x in tau_terms[0])) if tau_terms else float("nan")
            for j, e in enumerate(entries):
                got["clients"][e["client"]]["share"] = shares[j].clone()
            # FedProx's average() all-reduces ratio_i x_i, then rebinds ``p.data`` to the sum: on torch >= 1.13 that
            # rebinds a shallow copy and the parameters keep ratio_i x_i (docs/parity.md), so its new model is the
            # all-reduced sum itself (in rank order, as the threads summed it); FedNova copies the new model in
            x_new = _vector(nodes[0].model)
            if name == "FedProx":
                x_new = shares[0].clone()
                for share in shares[1:]:
                    x_new += share
            got["x_new"] = x_new
            got["ranks_agree"] = name == "FedProx" or all(torch.equal(_vector(n.model), x_new) for n in nodes)
            got["parameters_hold_average"] = all(torch.equal(_vector(n.model), x_new) for n in nodes)
            out.append(got)
    return out


def _vector(module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(module.parameters()).detach().clone()


def client_bound(steps: int, momentum: float) -> float:
    """The float32 gap of a client's end model, relative to its largest parameter: ``parity.clients.bound`` (four
    roundings of the scale a step, their effect on later gradients doubled), divided by 1 - momentum: a rounding
    left in the momentum buffer moves the parameters again at every later step, by momentum^j of itself, and
    sum_j momentum^j = 1 / (1 - momentum)."""
    return bound(steps) / (1.0 - momentum)


def global_bound(shares_scale: list[float], steps: list[int], momentum: float) -> float:
    """The gap of the new global model, relative to its largest parameter xmax. Client i's share is s_i times its
    update: fedrepro's update is x - x_i, the code's its ``cum_grad`` (the sum of its lr * d_p, one rounding each
    step of at most eps xmax, and the parameter's own path another: 2 tau_i eps xmax) of a client model within
    ``client_bound``; the scaling, the K-term sum and the subtraction from x add 2K + 2 roundings of at most
    sum_i s_i max|Delta_i| + xmax (``shares_scale``: s_i, and their sum over max|Delta| in units of xmax last)."""
    *s, spread = shares_scale
    k = len(s)
    return sum(si * (client_bound(n, momentum) + 2 * n * EPS32) for si, n in zip(s, steps)) + (2 * k + 2) * EPS32 * (
        spread + 1
    )


def mean_bound(weights: list[float], steps: list[int], momentum: float, ends: list[float], xmax: float,
               spread: float) -> float:  # fmt: skip
    """The gap of FedAvg's and FedProx's new global model, relative to its largest parameter xmax. The code sums
    fl(r_i) x_i^code over the ranks (the ratio rounded to float32, the product, K - 1 sums of partial sums at most
    X = max_i max|x_i|: (K + 1) eps X); fedrepro computes x - sum_i p_i (x - x_i) (p_i, Delta_i and each product
    rounded: 3 eps p_i max|Delta_i|, K - 1 sums of at most ``spread`` = sum_i p_i max|Delta_i|, the subtraction eps
    (xmax + spread)). The client models themselves are within ``client_bound`` of their largest parameter
    (``ends``: each client's max|x_i|), and the weights sum to 1."""
    k = len(weights)
    clients = sum(p * client_bound(n, momentum) * end for p, n, end in zip(weights, steps, ends))
    big = max(ends)
    return (clients + (k + 1) * EPS32 * big + (k + 3) * EPS32 * spread + EPS32 * (xmax + spread)) / xmax


def compare_case(checkout, setting: dict, code_setting: dict | None = None) -> dict:
    """One case: fedrepro at ``setting``, the code at ``code_setting`` (default the same; a test breaks one term
    on one side only); returns the case's row. FedProx (the code's ``FedProx`` optimiser) has no a_i, tau_eff nor
    normalised shares: its clients and its new model (``mean_bound``) are compared."""
    from fedrepro.algorithms.fednova import a_norm

    log, rounds = ours(setting)
    got = code(checkout, code_setting or setting, log, rounds)
    nova, momentum = setting["algorithm"] == "fednova", setting["client"]["momentum"]
    rows, worst = [], {"client": 0.0, "global": 0.0, **({"share": 0.0, "a": 0.0, "tau": 0.0} if nova else {})}
    steps_equal, ranks_agree = True, all(g["ranks_agree"] for g in got)
    k = setting["num_clients"]
    for t, (ours_round, code_round) in enumerate(zip(rounds, got)):
        xmax = float(ours_round["x"].abs().max())
        scales, steps, ends = [], [], []
        for j, c in enumerate(ours_round["clients"]):
            e = next(e for e in log if e["round"] == t and e["client"] == c)
            mine, theirs = ours_round, code_round["clients"][c]
            n = int(mine["steps"][j])
            steps_equal &= theirs["steps"] == n
            cb = client_bound(n, momentum)
            ends.append(float(e["end"].abs().max()))
            row = {"round": t, "client": c, "steps": n,
                   "client_gap_over_bound": float((theirs["end"] - e["end"]).abs().max()) / ends[-1] / cb}  # fmt: skip
            worst["client"] = max(worst["client"], row["client_gap_over_bound"])
            s = mine["scale"][j]
            scales.append(s)
            steps.append(n)
            if nova:
                a = a_norm(n, e["lr"], momentum, setting["fednova"]["mu"])
                worst["a"] = max(worst["a"], abs(theirs["a"] - a) / a / A_RELATIVE)
                share_bound = s * (cb + 2 * n * EPS32) + 3 * EPS32 * float(mine["shares"][j].abs().max()) / xmax
                share_gap = float((theirs["share"] - mine["shares"][j]).abs().max()) / xmax
                worst["share"] = max(worst["share"], share_gap / share_bound)
                row.update(a_code=theirs["a"], a_ours=a, share_gap_over_bound=share_gap / share_bound)
            rows.append(row)
        spread = sum(float(sh.abs().max()) for sh in ours_round["shares"])
        if nova:
            gb = global_bound(scales + [spread / xmax], steps, momentum)
            tau_gap = abs(code_round["tau_eff"] - ours_round["tau_eff"]) / ours_round["tau_eff"]
            worst["tau"] = max(worst["tau"], tau_gap / ((k + 2) * EPS32))
        else:
            gb = mean_bound(scales, steps, momentum, ends, xmax, spread)
        x_new = ours_round["x_new"]
        worst["global"] = max(worst["global"], float((code_round["x_new"] - x_new).abs().max()) / xmax / gb)
    equal = steps_equal and ranks_agree and all(v <= 1 for v in worst.values())
    return {
        "rounds": setting["rounds"], "clients": k, "model": setting["model"],
        "steps": sorted({r["steps"] for r in rows}), "steps_equal": steps_equal, "ranks_agree": ranks_agree,
        **{f"{name}_gap_over_bound": value for name, value in worst.items()},
        "rows": rows, "status": "equal" if equal else "differs",
    }  # fmt: skip


def compare_fednova(checkout) -> list[dict]:
    return [{"case": label, **compare_case(checkout, setting)} for label, setting in fednova_settings().items()]
