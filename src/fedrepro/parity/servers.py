"""One server step of each method, the code's and fedrepro's, from the same client models (FedNova's normalised
averaging and server momentum; IMA's window average, below).

FedNova: the code's ``distoptim.FedNova`` optimiser runs unchanged in ``world`` gloo processes on the CPU (its
``average`` all-reduces tau_eff and the scaled cumulative updates across ranks, as in a real run). Every rank
starts from the same model, takes its own number of local steps on its own generated batch (plain SGD, momentum,
proximal term, weight decay, as set) and averages; two rounds, so the server momentum's state is compared too.
fedrepro's NormalisedAveraging and server optimiser then take the ranks' client models, sample sizes and step
counts and must give the code's global model. Everything runs in float64 (the code's tensors follow torch's
default dtype), so the same arithmetic in another order agrees to ~1e-15 and the bound, 1e-12 relative, is no
reading of float32 rounding."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from fedrepro.parity.shim import checkout_on_path

RELATIVE = 1e-12
SIZES = (300, 120, 500, 80)  # each rank's sample count n_i (the code's ratio n_i / n)
STEPS = ((3, 5, 2, 4), (4, 2, 6, 3))  # local steps per rank, round by round


def _fednova_rank(rank: int, world: int, checkout: str, init_file: str, out_dir: str) -> None:
    """One rank of the code's FedNova, every case in turn on one process group (spawning is the slow part)."""
    torch.set_default_dtype(torch.float64)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    with checkout_on_path(checkout):  # the whole rank: its average() calls .cuda()
        from distoptim.FedNova import FedNova

        for name, cfg in FEDNOVA_CASES.items():
            torch.manual_seed(0)  # the same initial model on every rank
            model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
            ratio = SIZES[rank] / sum(SIZES)
            opt = FedNova(
                model.parameters(),
                ratio=ratio,
                gmf=cfg["gmf"],
                mu=cfg["mu"],
                lr=cfg["lr"],
                momentum=cfg["momentum"],
                weight_decay=cfg["weight_decay"],
            )
            gen = torch.Generator().manual_seed(100 + rank)
            x, y = torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen)
            vector = lambda: torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()  # noqa: E731
            record = {"x0": vector(), "rounds": []}
            for steps in STEPS:
                for _ in range(steps[rank]):
                    opt.zero_grad()
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
                client = vector()
                opt.average()
                record["rounds"].append({"client": client, "steps": steps[rank], "global": vector()})
            torch.save(record, Path(out_dir) / f"{name}_rank{rank}.pt")
    torch.distributed.destroy_process_group()


FEDNOVA_CASES = {
    "sgd": {"lr": 0.05, "momentum": 0.0, "mu": 0.0, "gmf": 0.0, "weight_decay": 1e-4},
    "momentum": {"lr": 0.02, "momentum": 0.9, "mu": 0.0, "gmf": 0.0, "weight_decay": 1e-4},
    "proximal": {"lr": 0.05, "momentum": 0.0, "mu": 0.005, "gmf": 0.0, "weight_decay": 1e-4},
    "server_momentum": {"lr": 0.05, "momentum": 0.0, "mu": 0.0, "gmf": 0.9, "weight_decay": 1e-4},
    "hybrid": {"lr": 0.02, "momentum": 0.9, "mu": 0.0, "gmf": 0.9, "weight_decay": 1e-4},
}


def _ours_fednova(records: list[dict], cfg: dict) -> list[torch.Tensor]:
    from fedrepro.algorithms.fednova import LrScaledMomentum, NormalisedAveraging
    from fedrepro.parts import RoundUpdates
    from fedrepro.server import ServerSGD

    aggregate = NormalisedAveraging(cfg["momentum"], cfg["mu"], "auto")
    server = LrScaledMomentum(1.0, cfg["gmf"]) if cfg["gmf"] else ServerSGD(1.0)
    x, out = records[0]["x0"], []
    for t in range(len(STEPS)):
        clients = torch.stack([r["rounds"][t]["client"] for r in records])
        updates = RoundUpdates(
            t,
            torch.arange(len(records)),
            x - clients,
            torch.tensor(SIZES, dtype=torch.float64),
            torch.tensor([r["rounds"][t]["steps"] for r in records], dtype=torch.float64),
            torch.zeros(len(records)),
            cfg["lr"],
        )
        x = server(x, aggregate(x, updates), updates)
        out.append(x)
    return out


def compare_fednova(checkout) -> list[dict]:
    """Each case: the code's ranks (gloo, CPU), then fedrepro from their client models; the largest relative gap
    of the global models over the two rounds, and whether the ranks agreed among themselves."""
    import torch.multiprocessing as mp

    rows = []
    world = len(SIZES)
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            _fednova_rank,
            args=(world, str(checkout), os.path.join(tmp, "init"), tmp),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        kept = {name: [torch.load(Path(tmp) / f"{name}_rank{r}.pt") for r in range(world)] for name in FEDNOVA_CASES}
    for name, cfg in FEDNOVA_CASES.items():
        records = kept[name]
        torch.set_default_dtype(torch.float64)
        try:
            ours = _ours_fednova(records, cfg)
        finally:
            torch.set_default_dtype(torch.float32)
        code = [records[0]["rounds"][t]["global"] for t in range(len(STEPS))]
        ranks_agree = all(torch.equal(r["rounds"][t]["global"], code[t]) for r in records for t in range(len(STEPS)))
        gap = max(float((a - b).abs().max() / a.abs().max()) for a, b in zip(code, ours))
        moved = min(
            float((code[t] - (records[0]["x0"] if t == 0 else code[t - 1])).abs().max()) for t in range(len(STEPS))
        )
        rows.append(
            {
                "method": "fednova",
                "case": name,
                **cfg,
                "ranks": world,
                "rounds": len(STEPS),
                "relative_gap": gap,
                "ranks_agree": ranks_agree,
                "smallest_step": moved,
                "status": "equal" if gap <= RELATIVE and ranks_agree and moved > 0 else "differs",
            }
        )
    return rows


# --------------------------------------------------------------------------- IMA's window average

IMA_STUBS = ("utils.tSNE", "leaf.dataloader")  # imported by utils.global_test, absent at HEAD
IMA_CLIENTS = (7, 2, 5, 1, 4, 9)  # sample counts of the six clients
IMA_ROUNDS = 9


def _ima_rounds(checkout, window: int, start: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The code's ``aggregation(..., agg_mode='ima')`` over IMA_ROUNDS rounds of generated client models (three
    of six clients a round), and fedrepro's FedAvg step (server lr 1) followed by +ima's WindowAverage on the
    same client models; both in float64. Returns (code's global models, ours)."""
    from fedrepro.algorithms.ima import WindowAverage
    from fedrepro.parts import RoundUpdates
    from fedrepro.server import ServerSGD

    with checkout_on_path(checkout, stubs=IMA_STUBS):
        from utils.aggregator import aggregation

        torch.manual_seed(0)
        code_model = torch.nn.Linear(4, 3).double()
        dict_users = {k: list(range(n)) for k, n in enumerate(IMA_CLIENTS)}
        window_models = [[] for _ in range(window)]
        post, x = WindowAverage(window, start), torch.nn.utils.parameters_to_vector(code_model.parameters()).detach()
        code_out, ours_out = [], []
        for t in range(IMA_ROUNDS):
            index = [(t + j) % len(IMA_CLIENTS) for j in (0, 2, 3)]
            gen = torch.Generator().manual_seed(1000 + t)
            clients = [None] * len(IMA_CLIENTS)
            vectors = []
            for k in index:
                m = torch.nn.Linear(4, 3).double()
                v = x + 0.1 * torch.randn(x.shape, generator=gen, dtype=torch.float64)
                torch.nn.utils.vector_to_parameters(v, m.parameters())
                clients[k], vectors = m, vectors + [v]
            window_models = aggregation(
                index,
                code_model,
                clients,
                dict_users,
                t=t,
                t_start=start,
                global_models=window_models,
                window_size=window,
                agg_mode="ima",
                args=None,
                testset=[],
            )
            code_out.append(torch.nn.utils.parameters_to_vector(code_model.parameters()).detach().clone())
            updates = RoundUpdates(
                t,
                torch.tensor(index),
                x - torch.stack(vectors),
                torch.tensor([float(IMA_CLIENTS[k]) for k in index], dtype=torch.float64),
                torch.zeros(3),
                torch.zeros(3),
                0.01,
            )
            x = post(ServerSGD(1.0)(x, updates.weighted_mean(), updates), updates)
            ours_out.append(x.clone())
            # the next round starts from the code's global model on both sides, so a difference shows where it arises
            x = code_out[-1].clone()
    return code_out, ours_out


def compare_ima(checkout) -> list[dict]:
    """Window 3 from round 4 (t_s >= P, as every table: t_s = 0.75 R, P = 5), and from round 1 (t_s < P): the
    code averages only once its window has filled (t >= P), fedrepro from t_s with the models it has."""
    rows = []
    for window, start in ((3, 4), (3, 1)):
        code, ours = _ima_rounds(checkout, window, start)
        gaps = [float((a - b).abs().max() / a.abs().max()) for a, b in zip(code, ours)]
        differing = [t for t, g in enumerate(gaps) if g > RELATIVE]
        rows.append(
            {
                "method": "ima",
                "case": f"window {window}, t_s {start}",
                "rounds": IMA_ROUNDS,
                "relative_gap": max(gaps),
                "rounds_differing": differing,
                "status": "equal" if not differing else "differs",
            }
        )
    return rows
