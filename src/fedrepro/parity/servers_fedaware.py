"""FedAWARE's server step, the code's and fedrepro's, over four rounds of the same uploads: the per-client
momenta, the code's pairing of uploads with the sampler's unsorted draw, FedAvg's warm-up step until every client
has been sampled, then the min-norm point of the normalised momenta and the server's step.

The code: ``fedaware.py``'s ``Server_MomentumGradientCache`` (its ``global_update``, unchanged) with ``utils.py``'s
``FeedbackSampler`` and ``FedAWARE_Projector`` and ``min_norm_solvers.py``'s Frank-Wolfe solver. ``fedaware.py``
is a script that trains at import, so its definitions alone are executed (the imports, functions and classes
before its first other statement, compiled from the file as it is); ``settings`` and ``agnews_dataset``, which
load data sets and tokenizers the server never calls, are placeholders. It needs the code's requirement FedLab
(``fedlab==1.3.0``, with ``munch``) importable.

Twelve clients of unequal sizes, four a round (``-sample_ratio`` 1/3): rounds 0-2 are the sampler's exploration
(its shuffled list, here our ``warmup`` permutation put in the sampler in place of its ``random.shuffle``; its set
arithmetic is its own), round 3 a uniform draw (numpy's global ``choice``, seeded). fedrepro's FedAWARE is built
by its registry from the setting ``params/fedaware.yaml`` with ``params/subsets/fedaware_official_protocol.yaml``
resolves (``cohort.assignment: code``, ``warmup: permutation``), its momenta held in float64 for the comparison.
Upload j is credited to ``code_pairing``'s j-th id in the exploration rounds (so our pairing is tested against the
code's sampler) and to the code's draw in the uniform round (the two programs draw it from other generators).
Each round starts from the code's global model on both sides.

Bounds. The momenta and FedAvg's warm-up step are the same arithmetic up to order: 1e-12 relative. The min-norm
step is not: the code stops Frank-Wolfe when lambda moves by less than 1e-5 (L1), we solve to a duality gap.
For the min-norm point p* of a convex hull and any p in it, <p*, p - p*> >= 0, so ||p - p*||^2 <= ||p||^2 -
||p*||^2 <= g(p), the Frank-Wolfe duality gap at p. So the two directions d (in the normalised momenta's units)
differ by at most sqrt(g_code) + sqrt(g_ours) in L2, hence in every entry, and the models by eta_g times that;
each solver's gap is computed here from its own lambda on the same Gram matrix (plus 1e-12 of the model's scale for
rounding)."""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import random
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from fedrepro import streams
from fedrepro.algorithms import BuildContext
from fedrepro.parity.shim import checkout_on_path

RELATIVE = 1e-12
SIZES = (40, 310, 95, 180, 60, 520, 75, 230, 150, 45, 390, 120)  # the twelve clients' sample counts
K, ROUNDS = 4, 4
PROTOCOL = ("params/fedaware.yaml", "params/subsets/fedaware_official_protocol.yaml")
STUBS = ("pynvml", "torch.utils.tensorboard")  # imported at the top by FedLab and fedaware.py, never called
REPLACE = ("settings", "agnews_dataset")  # the checkout's data-set modules: data and tokenizers, never called
PLACEHOLDERS = {"model": ["LinearReg"]}  # utils.py imports it; HEAD's model.py no longer defines it


@functools.lru_cache(maxsize=1)
def our_setting() -> dict:
    from fedrepro.configure import expansion, paramsfile

    runs = expansion.expand(paramsfile.load_params_files([str(paramsfile.ROOT / p) for p in PROTOCOL]))
    return next(
        r.setting
        for r in runs
        if r.experiment == "fedaware_table2_cifar10"
        and r.setting["algorithm"] == "fedaware"
        and not r.setting["plugins"]
    )


def definitions(path: Path, name: str) -> types.ModuleType:
    """The module's imports, functions and classes, executed from its own source up to its first other
    top-level statement (fedaware.py's script part: argument parsing, data loading, training)."""
    tree = ast.parse(path.read_text(), str(path))
    body = []
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Expr)):
            break
        body.append(node)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), module.__dict__)  # noqa: S102
    return module


def _gap(gram: torch.Tensor, lam: torch.Tensor) -> float:
    """Frank-Wolfe's duality gap of lambda for min lambda^T M lambda on the simplex: 2 (lam^T M lam - min M lam)."""
    u = gram @ lam
    return max(float(2 * (lam @ u - u.min())), 0.0)


def _unit_gram(momenta: torch.Tensor) -> torch.Tensor:
    norms = momenta.norm(dim=1)
    unit = momenta / torch.where(norms > 0, norms, torch.ones_like(norms))[:, None]
    return unit @ unit.T


def require_fedlab() -> None:
    """FedAWARE's code imports FedLab (its requirements.txt); refuse before any work starts without it."""
    try:
        importlib.import_module("fedlab")
        importlib.import_module("munch")
    except ImportError:
        raise SystemExit(
            "parity fedaware: the code needs FedLab importable: pip install --no-deps fedlab==1.3.0 munch "
            "(or pip install --target DIR ... and put DIR on PYTHONPATH)"
        ) from None


def _ours(setting: dict, dim: int):
    from fedrepro.algorithms import fedaware

    ctx = BuildContext(len(SIZES), dim, torch.device("cpu"), torch.tensor(SIZES, dtype=torch.float64))
    algorithm = fedaware.build(setting, ctx)
    momenta = algorithm.aggregator.momenta
    momenta.momenta, momenta.sizes = momenta.momenta.double(), momenta.sizes.double()
    return algorithm


def run(checkout, assignment: str = "code", perturb=None) -> dict:
    """The four rounds; ``assignment``: ``code`` credits uploads as our ``cohort.assignment: code`` does,
    ``per_client`` to their senders (the paper). ``perturb`` (tests): applied to our new global model."""
    from fedrepro.parts import RoundUpdates
    from fedrepro.run.cohorts import code_pairing

    setting = copy.deepcopy(our_setting())
    setting["cohort"]["assignment"] = assignment
    seed, alpha, glr = setting["seed"], setting["fedaware"]["alpha"], setting["server"]["lr"]
    checkout = Path(checkout)
    with checkout_on_path(checkout, stubs=STUBS, placeholders=PLACEHOLDERS, replace=REPLACE):
        utils = importlib.import_module("utils")
        code = definitions(checkout / "fedaware.py", "fedaware")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
        random.seed(seed)
        np.random.seed(seed)
        sampler = utils.FeedbackSampler(len(SIZES), np.ones(len(SIZES)) / len(SIZES))
        sampler.explore = [int(i) for i in streams.rng("warmup", seed).permutation(len(SIZES))]  # our shuffle
        handler = code.Server_MomentumGradientCache(model=model, global_round=ROUNDS, sample_ratio=K / len(SIZES))
        handler.num_clients = len(SIZES)
        weights = np.asarray(SIZES, dtype=float) / sum(SIZES)
        handler.setup_optim(sampler, alpha, SimpleNamespace(glr=glr, alpha=alpha, weights=weights, projection=0))
        x = handler.model_parameters.clone()
        ours = _ours(setting, len(x))
        gen = torch.Generator().manual_seed(1)
        common = torch.randn(len(x), generator=gen, dtype=torch.float64)
        rows = []
        for t in range(ROUNDS):
            uploaders = handler.sample_clients(K)  # ascending ids: the order clients train and upload in
            drawn = np.asarray(sampler.last_sampled[0])  # the unsorted draw global_update pairs uploads with
            explored = sampler.explored
            deltas = 0.1 * common + 0.05 * torch.randn(K, len(x), generator=gen, dtype=torch.float64)
            handler.global_update([[x - delta] for delta in deltas])
            code_x = handler.model_parameters.clone()
            ours_pairing = code_pairing(seed, t, len(SIZES), K, setting["cohort"]["warmup"])
            if assignment == "per_client":
                credited = np.asarray(uploaders)
            else:
                credited = ours_pairing if t < 3 else drawn  # round 3: the code's draw (another generator)
            updates = RoundUpdates(
                t,
                torch.as_tensor(credited),
                deltas.clone(),
                torch.tensor([float(SIZES[i]) for i in credited], dtype=torch.float64),
                torch.zeros(K),
                torch.zeros(K),
                0.01,
            )
            ours_x = ours.server_step(x, updates)
            if perturb is not None:
                ours_x = perturb(ours_x)
            code_m = torch.stack(handler.projector.momentum)
            ours_m = ours.aggregator.momenta.momenta
            row = {
                "round": t,
                "uploaders": [int(i) for i in uploaders],
                "code_draw": drawn.tolist(),
                "pairing_equal": bool(np.array_equal(ours_pairing, drawn)) if t < 3 else None,
                "momenta_gap": float((code_m - ours_m).abs().max() / code_m.abs().max()),
                "model_gap": float((code_x - ours_x).abs().max()),
                "model_scale": float(code_x.abs().max()),
                "step": float((code_x - x).abs().max()),
                "min_norm": bool(explored),
            }
            if explored:  # the min-norm step: each solver's duality gap on its own normalised momenta's Gram matrix
                code_lam = torch.as_tensor(handler.projector.feedback, dtype=torch.float64)
                row["fw_gap_code"] = _gap(_unit_gram(code_m), code_lam)
                row["fw_gap_ours"] = _gap(_unit_gram(ours_m), updates.info["lambda"])
                row["bound"] = glr * (row["fw_gap_code"] ** 0.5 + row["fw_gap_ours"] ** 0.5) + RELATIVE * float(
                    code_x.abs().max()
                )
            else:
                row["bound"] = RELATIVE * float(code_x.abs().max())
            rows.append(row)
            x = code_x.clone()
    return {
        "rows": rows,
        "equal": all(
            r["momenta_gap"] <= RELATIVE and r["model_gap"] <= r["bound"] and r["pairing_equal"] is not False
            for r in rows
        )
        and min(r["step"] for r in rows) > 0,
    }


def compare_fedaware(checkout) -> list[dict]:
    torch.set_default_dtype(torch.float64)
    require_fedlab()
    try:
        out = []
        for assignment, case in (
            ("code", "FedAWARE, the code's pairing (cohort.assignment: code)"),
            ("per_client", "FedAWARE, uploads credited to their senders (paper; assignment: per_client)"),
        ):
            result = run(checkout, assignment)
            rows = result["rows"]
            out.append(
                {
                    "method": "fedaware",
                    "case": case,
                    "clients": list(SIZES),
                    "rounds": ROUNDS,
                    "relative_gap": max(r["model_gap"] / r["model_scale"] for r in rows),
                    "largest_model_gap": max(r["model_gap"] for r in rows),
                    "largest_momenta_gap": max(r["momenta_gap"] for r in rows),
                    "by_round": rows,
                    "status": "equal" if result["equal"] else "differs",
                }
            )
        return out
    finally:
        torch.set_default_dtype(torch.float32)
