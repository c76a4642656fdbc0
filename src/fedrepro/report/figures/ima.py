"""IMA figures: loss/error landscapes on a plane through three models, 1-D interpolations, locality,
and the error of averages of m client models with their CKA similarity.

The plane through models a, b, c has origin a and the orthonormal basis u = (b - a)/|b - a|,
v = the part of (c - a) orthogonal to u, normalised; a point (s, t) is the model a + s u + t v, so
the three models sit at (0, 0), (|b - a|, 0) and ((c - a).u, (c - a).v). Every grid point is
evaluated on the whole test set with ``evaluation.evaluate`` (eval mode, large batches, on the run's
device), the function the runs are scored with.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedrepro.report.figures import MissingInput, described, finished, legend_outside
from fedrepro.report.figures.curves import over_rounds

MARKERS, MARKER_SYMBOLS = ("o", "^", "s"), ("\u25cb", "\u25b3", "\u25a1")  # circle, triangle, square
# landscape ``plane``: which snapshots of a round span it (snapshots.npz keys) and their names
PLANES = {"global_and_two_clients": (("global", "client_0", "client_1"), ["global", "client 1", "client 2"]),
          "three_clients": (("client_0", "client_1", "client_2"), ["client 1", "client 2", "client 3"])}
PLANE_TEXT = {"global_and_two_clients": "the global model of a round and two client models of that round",
              "three_clients": "three client models of a round (the paper's Fig. 1)"}


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
        from fedrepro import data, models
        from fedrepro.evaluation import evaluate
        from fedrepro.flat import FlatModel
        from fedrepro.run.process import pick_device

        if data_root is None:
            raise MissingInput("no data root given to evaluate models")
        self.device = pick_device(device)
        self.test = data.load(setting["dataset"], Path(data_root) / setting["dataset"], train=False,
                              preprocess=setting.get("preprocess"),
                              pretrained=setting.get("pretrained")).to(self.device)
        self.model = FlatModel(models.build(setting["model"], setting["dataset"], setting.get("pretrained")),
                               self.device)
        self.evaluate = evaluate

    def logits(self, x: torch.Tensor, samples: int) -> torch.Tensor:
        """The model's logits (eval mode, float64) on the first ``samples`` test images."""
        from fedrepro.evaluation import eval_mode

        self.model.flat.copy_(torch.as_tensor(x, device=self.device, dtype=self.model.flat.dtype))
        index = torch.arange(min(samples, len(self.test)), device=self.test.labels.device)
        with eval_mode(self.model.module), torch.no_grad():
            return self.model.module(self.test.batch(index)[0]).double().cpu()

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


def _triples(spec, run) -> list[tuple[str, list[str], list[torch.Tensor]]]:
    """(title, names, three models) of every plane the spec asks of the run: per listed round the plane
    ``spec['plane']`` names, and the plane through the post-step global models of the ``globals`` rounds."""
    stored = snapshots(run)
    triples = []
    keys, names = PLANES[spec["plane"]]
    for r in spec["rounds"]:
        r = _round(run, r)
        triples.append((f"round {r}", names, [_need(stored, f"round_{r}_{k}", run) for k in keys]))
    if spec["globals"]:
        rs = [_round(run, r) for r in spec["globals"]]
        if len(rs) != 3:
            raise MissingInput(f"globals lists {len(rs)} rounds; the plane needs 3")
        triples.append(("global models", [f"round {r}" for r in rs],
                        [_need(stored, f"round_{r}_next", run) for r in rs]))
    if not triples:
        raise MissingInput("the figure lists no rounds and no globals")
    return triples


def landscape(spec, runs, context):
    import matplotlib.pyplot as plt

    run = finished(runs)[0]
    triples = _triples(spec, run)
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
    return fig, (described("landscape", plane=PLANE_TEXT[spec["plane"]])
                 + f" ({run.setting['algorithm']}, {run.setting['dataset']} {run.setting['model']}, "
                 f"seed {run.setting['seed']}, {spec['resolution']}x{spec['resolution']} grid)")


def landscape_rows(spec, runs, context):
    """IMA Fig. 10: one row per setup (``rows``: label and partial setting), one column per plane (the listed
    rounds' client planes, then the last global models'), the test loss (or error) of each plane. A row whose
    run is missing or lacks a snapshot says why in its place; the figure is not drawn only when no row is."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    from fedrepro.report import paper

    quantity = spec["quantity"]
    unit = {"loss": "test loss (nats)", "error": "test error (%)"}[quantity]
    planned = []  # per row: (label, run, triples) or (label, reason)
    for row in spec["rows"]:
        try:
            chosen = [r for r in runs if paper.matches(r.setting, row["select"])]
            if not chosen:
                raise MissingInput(f"no run matches {row['select']}")
            run = finished(chosen)[0]
            planned.append((row["label"], run, _triples(spec, run)))
        except MissingInput as err:
            planned.append((row["label"], None, str(err)))
    if all(run is None for _, run, _ in planned):
        raise MissingInput("; ".join(f"{label}: {reason}" for label, _, reason in planned))
    columns = max(len(t) for _, run, t in planned if run is not None)
    fig, axes = plt.subplots(len(planned), columns, figsize=(4.3 * columns, 3.5 * len(planned)), squeeze=False,
                             layout="constrained")
    drawn = []
    for ax_row, (label, run, triples) in zip(axes, planned):
        ax_row[0].set_ylabel(f"{label}\nv (L2)", fontsize=9, fontweight="bold")
        if run is None:
            for ax in ax_row:
                ax.set_frame_on(False)
                ax.set_xticks([])
                ax.set_yticks([])
            ax_row[0].text(0.0, 0.5, f"not drawn: {triples}", transform=ax_row[0].transAxes, fontsize=9,
                           color="darkred", va="center")
            continue
        drawn.append(f"{label}: {run.setting['algorithm']} seed {run.setting['seed']}")
        evaluator = Evaluator(run.setting, context.data_root, context.device)
        for ax, (title, names, models) in zip(ax_row, triples):
            surf = surface(evaluator, models, spec["resolution"], spec["margin"])
            contour = ax.contourf(surf["s"], surf["t"], surf[quantity], levels=20, cmap="viridis")
            bar = fig.colorbar(contour, ax=ax, pad=0.01, aspect=25)
            bar.locator = MaxNLocator(5)
            bar.formatter = ScalarFormatter(useOffset=False)  # an offset label would crowd the next panel
            bar.update_ticks()
            bar.ax.tick_params(labelsize=7)
            for (s, t), marker in zip(surf["points"], MARKERS):
                ax.plot(s, t, marker, color="white", mec="black", ms=7)
            # the three models' plain average lies on their plane, at the mean of their coordinates
            centre = np.mean(surf["points"], axis=0)
            ax.plot(*centre, "x", color="white", mew=2, ms=9)
            ax.set_title(f"{title}: " + ", ".join(f"{m} {n}" for m, n in zip(MARKER_SYMBOLS, names)) + ", \u00d7 mean",
                         fontsize=8)
            ax.set_xlabel("u (L2)", fontsize=8)
            ax.tick_params(labelsize=7)
        for ax in ax_row[len(triples):]:
            ax.axis("off")
    fig.suptitle(f"{unit} on planes through three models, one row per setup", fontsize=10)
    shows = described("landscape_rows", quantity=unit, plane=PLANE_TEXT[spec["plane"]])
    return fig, shows + f" ({'; '.join(drawn)}; {spec['resolution']}x{spec['resolution']} grid)"


def interpolate(evaluator: Evaluator, a: torch.Tensor, b: torch.Tensor, alphas: np.ndarray):
    """(loss, error) at (1 - alpha) a + alpha b for every alpha."""
    return evaluator((1 - float(al)) * a + float(al) * b for al in alphas)


def _final_model(run) -> torch.Tensor:
    from fedrepro.run import checkpoint

    path = run.folder.model
    if not path.exists():
        raise MissingInput(f"run {run.id} has no {path.name}")
    return checkpoint.load(path)["x"]


def interpolation(spec, runs, context):
    """``between``: two partial settings, the final models of their first matching runs (IMA Fig. 7c);
    ``rounds``: the global models of those rounds of one run, each to the last (IMA Fig. 5b)."""
    import matplotlib.pyplot as plt

    from fedrepro.report import paper

    done = finished(runs)
    alphas = np.linspace(-spec["extend"], 1 + spec["extend"], spec["points"])
    lines = []
    if spec["between"]:
        # for_each {key: values}: one line per value, merged into both ends (IMA Fig. 7c: every method)
        (key, values), = (spec["for_each"] or {None: [None]}).items()
        missing = []
        for value in values:
            ends = []
            for match in spec["between"]:
                match = match if key is None else {**match, key: value}
                chosen = [r for r in done if paper.matches(r.setting, match)]
                if not chosen:
                    missing.append(str(match))
                    break
                ends.append(chosen[0])
            if len(ends) < 2:
                continue
            a, b = (_final_model(r) for r in ends)
            names = [r.label for r in ends]
            lines.append((f"{names[0]} (0) to {names[1]} (1)", a, b))
            setting = ends[0].setting
        if not lines:
            raise MissingInput(f"no finished run matches {missing[0]}")
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
    shows = described("interpolation") + f" ({setting['dataset']} {setting['model']})"
    if spec["between"] and spec["for_each"] and missing:
        shows += f"; not drawn, no finished run: {', '.join(missing)}"
    return fig, shows


def locality(spec, runs, context):
    fig, _ = over_rounds(runs, "update_norm_mean", "mean ||x - x_i|| (L2, parameter space)")
    return fig, described("locality")


def weighted_average(models: list[torch.Tensor], sizes: np.ndarray) -> torch.Tensor:
    """The FMA of the given client models: sum_k n_k x_k / sum_k n_k (float64)."""
    w = torch.as_tensor(np.asarray(sizes, dtype=np.float64))
    return (torch.stack([m.double() for m in models]) * (w / w.sum())[:, None]).sum(0)


def linear_cka(a: torch.Tensor, b: torch.Tensor) -> float:
    """Linear CKA (Kornblith et al. 2019) of two (samples x features) representations of the same inputs:
    ||B'A||_F^2 / (||A'A||_F ||B'B||_F) after centring each feature; 1 for representations equal up to
    an orthogonal map and an isotropic scale."""
    a, b = a.double() - a.double().mean(0), b.double() - b.double().mean(0)
    return float((b.T @ a).norm() ** 2 / ((a.T @ a).norm() * (b.T @ b).norm()))


def _clients_of_round(stored: dict, r: int, run) -> tuple[list[torch.Tensor], np.ndarray, bool]:
    models = []
    while f"round_{r}_client_{len(models)}" in stored:
        models.append(stored[f"round_{r}_client_{len(models)}"])
    if len(models) < 2:
        _need(stored, f"round_{r}_client_0", run)
        raise MissingInput(f"run {run.id} kept {len(models)} client model of round {r}; averages of m models need "
                           f"the cohort's (set snapshots.clients to the cohort size)")
    sizes = stored.get(f"round_{r}_sizes")
    # snapshots written before the sizes were kept: weigh the models equally, and say so
    return models, (np.ones(len(models)) if sizes is None else sizes.numpy()), sizes is not None


def client_averages(spec, runs, context):
    """IMA Fig. 4: how the error of the FMA of m client models falls with m, and how alike the models are."""
    import matplotlib.pyplot as plt

    done = finished(runs)
    evaluator = Evaluator(done[0].setting, context.data_root, context.device)
    colours = plt.cm.viridis(np.linspace(0, 0.9, max(1, len(spec["rounds"]))))
    styles = ["-", "--", ":", "-."]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8), layout="constrained")
    equal_weights = []
    for i, run in enumerate(done):
        stored = snapshots(run)
        cka_rounds, cka = [], []
        for colour, r in zip(colours, [_round(run, r) for r in spec["rounds"]]):
            models, sizes, weighted = _clients_of_round(stored, r, run)
            if not weighted:
                equal_weights.append(run.label)
            _, errors = evaluator(weighted_average(models[:m], sizes[:m]) for m in range(1, len(models) + 1))
            left.plot(range(1, len(models) + 1), errors, styles[i % len(styles)], color=colour, marker=".",
                      label=f"{run.label}, round {r}")
            outputs = [evaluator.logits(m, spec["cka_samples"]) for m in models]
            pairs = [linear_cka(outputs[j], outputs[k])
                     for j in range(len(outputs)) for k in range(j + 1, len(outputs))]
            cka_rounds.append(r)
            cka.append(float(np.mean(pairs)))
        right.plot(cka_rounds, cka, styles[i % len(styles)], marker="o", color="black", label=run.label)
    from matplotlib.ticker import MaxNLocator
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_xlabel("number m of client models averaged")
    left.set_ylabel("test error (%)")
    right.set_xlabel("round")
    right.set_ylabel("mean linear CKA of client logits")
    right.set_ylim(0, 1.02)
    legend_outside(left)
    right.legend(fontsize=8)
    shows = described("client_averages") + f" ({done[0].setting['dataset']} {done[0].setting['model']})"
    if equal_weights:
        shows += f"; equal weights for {', '.join(sorted(set(equal_weights)))} (snapshots without data sizes)"
    return fig, shows
