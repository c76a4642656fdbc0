"""IMA figures: loss/error landscapes on a plane through three models, 1-D interpolations, locality.

The plane through models a, b, c has origin a and the orthonormal basis u = (b - a)/|b - a|,
v = the part of (c - a) orthogonal to u, normalised; a point (s, t) is the model a + s u + t v, so
the three models sit at (0, 0), (|b - a|, 0) and ((c - a).u, (c - a).v). Every grid point is
evaluated on the whole test set with ``engine.evaluate`` (eval mode, large batches, on the run's
device), the function the runs are scored with.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedrepro.figures import MissingInput, finished, legend_outside
from fedrepro.figures.curves import over_rounds

SHOWS = {
    "landscape": "Test loss (nats) and test error (%) of the models on the plane through three models: the "
                 "global model of a round and two client models of that round (rows per round), and three "
                 "global models of the last rounds; markers are the models themselves",
    "interpolation": "Test loss (nats) and test error (%) along the straight line between two models "
                     "(0 and 1 are the end models; beyond them, extrapolation)",
    "locality": "Locality: mean L2 distance ||x - x_i|| between the global model and the cohort's client "
                "models after local training, over rounds, per method",
}


MARKERS, MARKER_SYMBOLS = ("o", "^", "s"), ("\u25cb", "\u25b3", "\u25a1")  # circle, triangle, square


def plane(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor):
    """(origin, u, v): an orthonormal basis of the plane through a, b and c, with origin a."""
    a, b, c = (m.double() for m in (a, b, c))  # float32 would leave |u| - 1 ~ 1e-6 over a million weights
    u = b - a
    if float(u.norm()) == 0:
        raise MissingInput("two of the three models are identical: they span no plane")
    u = u / u.norm()
    w = (c - a) - ((c - a) @ u) * u
    if float(w.norm()) <= 1e-12 * float((c - a).norm() + 1):
        raise MissingInput("the three models lie on one line: they span no plane")
    return a, u, w / w.norm()


def coordinates(x: torch.Tensor, origin, u, v) -> tuple[float, float]:
    return float((x.double() - origin) @ u), float((x.double() - origin) @ v)


class Evaluator:
    """The run's model and test set, loaded once; ``__call__`` scores flat parameter vectors."""

    def __init__(self, setting: dict, data_root: Path | None, device: str = "auto"):
        from fedrepro import data, engine, models
        from fedrepro.flat import FlatModel

        if data_root is None:
            raise MissingInput("no data root given to evaluate models")
        self.device = engine.pick_device(device)
        self.test = data.load(setting["dataset"], Path(data_root) / setting["dataset"], train=False,
                              preprocess=setting.get("preprocess"), pretrained=setting.get("pretrained")).to(self.device)
        self.model = FlatModel(models.build(setting["model"], setting["dataset"], setting.get("pretrained")),
                               self.device)
        self.evaluate = engine.evaluate

    def __call__(self, vectors) -> tuple[np.ndarray, np.ndarray]:
        """(test loss in nats, test error in %) of every vector."""
        losses, errors = [], []
        self.model.module.eval()
        for x in vectors:
            self.model.flat.copy_(torch.as_tensor(x, device=self.device, dtype=self.model.flat.dtype))
            acc, loss = self.evaluate(self.model.module, self.test)
            losses.append(loss)
            errors.append(100.0 * (1.0 - acc))
        return np.array(losses), np.array(errors)


def grid(points: list[tuple[float, float]], resolution: int, margin: float):
    s = np.array([p[0] for p in points])
    t = np.array([p[1] for p in points])
    pad_s, pad_t = margin * (np.ptp(s) or 1.0), margin * (np.ptp(t) or 1.0)
    return (np.linspace(s.min() - pad_s, s.max() + pad_s, resolution),
            np.linspace(t.min() - pad_t, t.max() + pad_t, resolution))


def surface(evaluator: Evaluator, models: list[torch.Tensor], resolution: int, margin: float) -> dict:
    """Loss and error on a resolution x resolution grid over the plane through three models."""
    origin, u, v = plane(*models)
    points = [coordinates(x, origin, u, v) for x in models]
    ss, tt = grid(points, resolution, margin)
    vectors = (origin + s * u + t * v for t in tt for s in ss)
    loss, error = evaluator(vectors)
    return {"s": ss, "t": tt, "loss": loss.reshape(len(tt), len(ss)), "error": error.reshape(len(tt), len(ss)),
            "points": points}


def snapshots(run) -> dict[str, torch.Tensor]:
    path = run.folder.snapshots
    if not path.exists():
        raise MissingInput(f"run {run.id} kept no model snapshots; list the rounds in its setting's "
                           f"snapshots.rounds (docs/figures.md)")
    stored = np.load(path)
    return {k: torch.from_numpy(stored[k]) for k in stored.files}


def _round(run, r: int) -> int:
    return r if r > 0 else run.setting["rounds"] + 1 + r


def _need(stored: dict, key: str, run) -> torch.Tensor:
    if key not in stored:
        kept = sorted({int(k.split("_")[1]) for k in stored})
        raise MissingInput(f"run {run.id} has no snapshot {key} (it kept rounds {kept}); add the round to "
                           f"snapshots.rounds")
    return stored[key]


def landscape(spec, runs, context):
    import matplotlib.pyplot as plt

    run = finished(runs)[0]
    stored = snapshots(run)
    triples = []
    for r in spec["rounds"]:
        r = _round(run, r)
        triples.append((f"round {r}", ["global", "client 1", "client 2"],
                        [_need(stored, f"round_{r}_{k}", run) for k in ("global", "client_0", "client_1")]))
    if spec["globals"]:
        rs = [_round(run, r) for r in spec["globals"]]
        if len(rs) != 3:
            raise MissingInput(f"globals lists {len(rs)} rounds; the plane needs 3")
        triples.append(("global models", [f"round {r}" for r in rs],
                        [_need(stored, f"round_{r}_next", run) for r in rs]))
    if not triples:
        raise MissingInput("the figure lists no rounds and no globals")
    evaluator = Evaluator(run.setting, context.data_root, context.device)
    fig, axes = plt.subplots(len(triples), 2, figsize=(11, 3.9 * len(triples)), squeeze=False,
                             layout="constrained")
    for row, (title, names, models) in zip(axes, triples):
        surf = surface(evaluator, models, spec["resolution"], spec["margin"])
        for ax, key, unit in zip(row, ("loss", "error"), ("test loss (nats)", "test error (%)")):
            contour = ax.contourf(surf["s"], surf["t"], surf[key], levels=20, cmap="viridis")
            fig.colorbar(contour, ax=ax, label=unit)
            for (s, t), marker in zip(surf["points"], MARKERS):
                ax.plot(s, t, marker, color="white", mec="black", ms=8)
            # the markers are named in the title, where no legend box can hide a model
            key_text = ", ".join(f"{symbol} {name}" for symbol, name in zip(MARKER_SYMBOLS, names))
            ax.set_title(f"{title} ({key_text}): {unit}", fontsize=9)
            ax.set_xlabel("distance along u (L2, parameter space)")
            ax.set_ylabel("distance along v (L2)")
    return fig, (SHOWS["landscape"] + f" ({run.setting['algorithm']}, {run.setting['dataset']} {run.setting['model']}, "
                 f"seed {run.setting['seed']}, {spec['resolution']}x{spec['resolution']} grid)")


def interpolate(evaluator: Evaluator, a: torch.Tensor, b: torch.Tensor, alphas: np.ndarray):
    """(loss, error) at (1 - alpha) a + alpha b for every alpha."""
    return evaluator((1 - float(al)) * a + float(al) * b for al in alphas)


def _final_model(run) -> torch.Tensor:
    from fedrepro import checkpoint

    path = run.folder.model
    if not path.exists():
        raise MissingInput(f"run {run.id} has no {path.name}")
    return checkpoint.load(path)["x"]


def interpolation(spec, runs, context):
    """``between``: two partial settings, the final models of their first matching runs (IMA Fig. 7c);
    ``rounds``: the global models of those rounds of one run, each to the last (IMA Fig. 5b)."""
    import matplotlib.pyplot as plt

    from fedrepro import paper

    done = finished(runs)
    alphas = np.linspace(-spec["extend"], 1 + spec["extend"], spec["points"])
    lines = []
    if spec["between"]:
        ends = []
        for match in spec["between"]:
            chosen = [r for r in done if paper.matches(r.setting, match)]
            if not chosen:
                raise MissingInput(f"no finished run matches {match}")
            ends.append(chosen[0])
        a, b = (_final_model(r) for r in ends)
        names = [r.label for r in ends]
        lines.append((f"{names[0]} (0) to {names[1]} (1)", a, b))
        setting = ends[0].setting
    else:
        run = done[0]
        stored = snapshots(run)
        rs = [_round(run, r) for r in spec["rounds"]]
        if len(rs) < 2:
            raise MissingInput("interpolation needs two models: list two 'between' settings or two or more rounds")
        last = _need(stored, f"round_{rs[-1]}_next", run)
        for r in rs[:-1]:
            lines.append((f"round {r} (0) to round {rs[-1]} (1)", _need(stored, f"round_{r}_next", run), last))
        setting = run.setting
    evaluator = Evaluator(setting, context.data_root, context.device)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    for name, a, b in lines:
        loss, error = interpolate(evaluator, a, b, alphas)
        axes[0].plot(alphas, loss, label=name)
        axes[1].plot(alphas, error, label=name)
    for ax, unit in zip(axes, ("test loss (nats)", "test error (%)")):
        ax.set_xlabel("interpolation coefficient alpha")
        ax.set_ylabel(unit)
        for x in (0, 1):
            ax.axvline(x, color="gray", lw=0.6, ls=":")
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig, SHOWS["interpolation"] + f" ({setting['dataset']} {setting['model']})"


def locality(spec, runs, context):
    fig, _ = over_rounds(runs, "update_norm_mean", "mean ||x - x_i|| (L2, parameter space)")
    return fig, SHOWS["locality"]
