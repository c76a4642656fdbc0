"""The papers' analysis figures (fedrepro.report.figures): the geometry and the closed forms they rest on,
the snapshots a run keeps for them, and every kind drawn from tiny real runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import make_partition
from fedrepro import cli, identity
from fedrepro.configure import expansion, paramsfile, schema, settings
from fedrepro.errors import FedreproError
from fedrepro.partitions import records as partition_records
from fedrepro.report import figures
from fedrepro.report.figures import fedlaw as fedlaw_figures, fednova as quad, ima
from fedrepro.run import checkpoint
from fedrepro.run.cohorts import sample_cohort

BASE = {
    "dataset": "fmnist",
    "model": "mlp",
    "num_clients": 4,
    "participation": 0.5,
    "rounds": 3,
    "batch_size": 64,
    "device": "cpu",
    "client": {"lr": 0.05},
    "partition": {"kind": "iid", "seed": 1},
    "evaluation": {"proxy_holdout": 20},
}
SNAP = {"rounds": [1, 2, -1], "clients": 2, "cosine_rounds": [2]}
PARAMS = {
    "title": "tiny figures",
    "quick": True,
    "experiments": {
        "tiny": {"base": BASE, "grid": {"algorithm": ["fedavg", "fedavg+ima", "fedlaw", "fedaware"]}},
        "tiny_snap": {"base": {**BASE, "snapshots": SNAP}, "grid": {"algorithm": ["fedavg"]}},
        "tiny_diverge": {"base": {**BASE, "client": {"lr": 1.0e6}}, "grid": {"algorithm": ["fedavg"]}},
        # FedAWARE Fig. 4's sweep, two alphas; the permutation warm-up sees every client by round 2, so the
        # momenta (and alpha) act from round 3 on
        "tiny_alpha": {
            "base": {**BASE, "rounds": 4, "cohort": {"warmup": "permutation"}},
            "grid": {
                "setting": [
                    {"algorithm": "fedaware", "fedaware": {"alpha": 0.3}},
                    {"algorithm": "fedaware", "fedaware": {"alpha": 0.7}},
                    {"algorithm": "fedaware", "fedaware": {"alpha": 0.3, "weights": "static"}},
                    {"algorithm": "fedaware", "fedaware": {"alpha": 0.7, "weights": "static"}},
                    {"algorithm": "fedavg", "participation": 1.0},
                ]
            },
        },
        # FedLAW section 4: FedAvg against adaptive GWS at two local-epoch counts (Figs. 2, 3, 10, 11)
        "tiny_gws": {
            "base": {
                **BASE,
                "fedlaw": {"variant": "adaptive_gws", "proxy_size": 20, "server_epochs": 2},
                "hessian": {"every": 3, "samples": 50, "k": 3, "steps": 6},
            },
            "grid": {"algorithm": ["fedavg", "fedlaw"], "local_epochs": [1, 2]},
        },
        "tiny_law": {
            "base": {
                **BASE,
                "algorithm": "fedlaw",
                "log_cohort_classes": True,
                "fedlaw": {"variant": "attentive", "proxy_size": 20, "server_epochs": 2, "log_client_weights": True},
            },
            "grid": {"seed": [1]},
        },
    },
}
TINY_OPTIONS = {"ima": {"window": 2, "start_round": 2}, "fedlaw": {"proxy_size": 20, "server_epochs": 2}}


def _train(run_setting: dict, out: Path, partition_dir: Path, data_root: Path, *extra: str) -> None:
    cli.main(
        [
            "train",
            "--setting",
            json.dumps(run_setting),
            "--partition",
            str(partition_dir),
            "--data-root",
            str(data_root),
            "--out",
            str(out),
            "--no-progress",
            "--threads",
            "1",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def tiny(tiny_data_root, tmp_path_factory):
    """Tiny real runs (generated Fashion-MNIST-format data, 4 clients, 3 rounds) and their manifest."""
    work = tmp_path_factory.mktemp("figures")
    (work / "data").mkdir()
    (work / "data" / "fmnist").symlink_to(tiny_data_root)  # <data root>/<dataset>, as the workflow lays it out
    params = json.loads(json.dumps(PARAMS))
    params["experiments"]["tiny"]["base"].update(TINY_OPTIONS)
    runs = expansion.expand(params)
    partition_dir = make_partition(tiny_data_root, work / "partition", num_clients=4)
    for run in expansion.unique_runs(runs).values():
        _train(run.setting, work / "runs" / run.id, partition_dir, tiny_data_root)
    manifest = expansion.manifest(params, runs, "tiny")
    return {
        "work": work,
        "manifest": manifest,
        "runs": runs,
        "partition": partition_dir,
        "context": figures.Context(work / "data", "cpu", True),
    }


def _draw(tiny, name: str, spec: dict) -> dict:
    spec = figures.check({name: spec}, tiny["manifest"]["experiments"])[name]
    return figures.draw(
        name, spec, tiny["manifest"], tiny["work"] / "runs", tiny["work"] / "fig" / f"{name}.png", tiny["context"]
    )


def _snap_run(tiny):
    return figures.select_runs(tiny["manifest"], tiny["work"] / "runs", {"experiment": "tiny_snap", "select": {}})[0]


# --------------------------------------------------------------------------- geometry


def test_plane_is_orthonormal_and_its_grid_reproduces_the_three_models_losses(tiny):
    run = _snap_run(tiny)
    stored = ima.snapshots(run)
    models = [stored[f"round_2_{k}"] for k in ("global", "client_0", "client_1")]
    origin, u, v = ima.plane(*models)
    assert float(u @ u) == pytest.approx(1, abs=1e-6) and float(v @ v) == pytest.approx(1, abs=1e-6)
    assert abs(float(u @ v)) < 1e-6
    evaluator = ima.Evaluator(run.setting, tiny["context"].data_root, "cpu")
    on_plane = [origin + s * u + t * v for s, t in (ima.coordinates(x, origin, u, v) for x in models)]
    for x, y in zip(models, on_plane):
        assert float((x.double() - y).norm()) < 1e-9 * float(x.norm()), "the plane does not pass through the model"
    want_loss, want_err = evaluator(models)
    got_loss, got_err = evaluator(on_plane)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-4)
    np.testing.assert_allclose(got_err, want_err, atol=1e-9)
    assert len(set(np.round(want_loss, 6))) == 3, "three distinct models"


def test_interpolation_ends_reproduce_the_end_models_losses(tiny):
    run = _snap_run(tiny)
    stored = ima.snapshots(run)
    a, b = stored["round_1_next"], stored["round_3_next"]
    evaluator = ima.Evaluator(run.setting, tiny["context"].data_root, "cpu")
    loss, error = ima.interpolate(evaluator, a, b, np.array([0.0, 1.0]))
    want_loss, want_error = evaluator([a, b])
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(error, want_error, atol=1e-9)
    assert want_loss[0] != pytest.approx(want_loss[1]), "the two end models differ"


def test_the_average_of_all_kept_client_models_is_fedavgs_next_global_model(tiny):
    """FedAvg with server lr 1 moves to the data-size-weighted mean of its cohort: the FMA of all m = K
    kept client models (their stored sizes) must be that round's next global model, and m = 1 the client."""
    run = _snap_run(tiny)
    stored = ima.snapshots(run)
    parts = partition_records.load(tiny["partition"])
    for r in (1, 2, 3):
        models, sizes, weighted = ima._clients_of_round(stored, r, run)
        cohort = sample_cohort(run.setting["seed"], r - 1, 4, 2)
        assert weighted and len(models) == 2
        assert sizes.tolist() == [len(parts[c]) for c in cohort], "the kept clients' data sizes"
        fma = ima.weighted_average(models, sizes)
        nxt = stored[f"round_{r}_next"].double()
        assert float((fma - nxt).norm()) < 1e-6 * float(nxt.norm())
        assert float((ima.weighted_average(models[:1], sizes[:1]) - models[0].double()).norm()) == 0
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 4.0])
    assert ima.weighted_average([a, b], np.array([1, 3])).tolist() == [0.25, 3.0], "n_k / n weights"


def test_client_averages_ask_for_the_cohorts_models_when_one_was_kept(tiny):
    run = _snap_run(tiny)
    with pytest.raises(figures.MissingInput, match=r"kept 1 client model of round 2.*snapshots.clients"):
        ima._clients_of_round({"round_2_client_0": torch.zeros(3)}, 2, run)
    with pytest.raises(figures.MissingInput, match=r"no snapshot round_5_client_0"):
        ima._clients_of_round({"round_2_client_0": torch.zeros(3)}, 5, run)


def test_linear_cka_equals_the_kernel_hsic_form_and_ignores_rotation_scale_and_shift():
    """Oracle: CKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)) with linear kernels and the centring
    matrix H (Kornblith et al. 2019, Eq. 2), computed here the slow way on n x n Gram matrices."""
    gen = torch.Generator().manual_seed(0)
    a, b = (
        torch.randn(60, 7, generator=gen, dtype=torch.float64),
        torch.randn(60, 5, generator=gen, dtype=torch.float64),
    )
    b = b + 0.5 * a[:, :5]
    h = torch.eye(60, dtype=torch.float64) - 1.0 / 60

    def hsic(x, y):
        return float(torch.trace((x @ x.T) @ h @ (y @ y.T) @ h))

    want = hsic(a, b) / (hsic(a, a) * hsic(b, b)) ** 0.5
    assert ima.linear_cka(a, b) == pytest.approx(want, rel=1e-12)
    assert 0.05 < want < 0.95
    q, _ = torch.linalg.qr(torch.randn(7, 7, generator=gen, dtype=torch.float64))
    assert ima.linear_cka(a, 3.0 * a @ q + 2.0) == pytest.approx(1.0, rel=1e-12)
    assert ima.linear_cka(a, a.float()) == pytest.approx(1.0, rel=1e-6)


# --------------------------------------------------------------------------- the quadratic demo


def _heterogeneous():
    gen = torch.Generator().manual_seed(5)
    e = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    p = torch.tensor([0.1, 0.3, 0.05, 0.25, 0.2, 0.1], dtype=torch.float64)
    tau = torch.tensor([1.0, 30.0, 4.0, 60.0, 2.0, 12.0], dtype=torch.float64)
    return e, p, tau


def test_quadratic_fixed_points_at_a_fixed_lr_are_the_closed_forms():
    e, p, tau = _heterogeneous()
    lr = 0.02
    for method, limit in (("FedAvg", quad.fedavg_limit(e, p, tau, lr)), ("FedNova", quad.fednova_limit(e, p, tau, lr))):
        x = quad.simulate(method, e, p, lambda t: tau, [lr] * 4000)[-1]
        torch.testing.assert_close(x, limit, rtol=0, atol=1e-10)


def test_quadratic_fednova_reaches_the_true_minimiser_and_fedavg_the_biased_point():
    e, p, tau = _heterogeneous()
    x_star, biased = quad.true_minimiser(e, p), quad.fedavg_limit(e, p, tau)  # eq. (33)
    gap = float((biased - x_star).norm())
    assert gap > 0.2
    lrs = quad.lr_schedule({"lr": 0.05, "rounds": 6000, "decay_rounds": [600, 900, 1500], "decay": 5.0})
    x_nova = quad.simulate("FedNova", e, p, lambda t: tau, lrs)[-1]
    x_avg = quad.simulate("FedAvg", e, p, lambda t: tau, lrs)[-1]
    assert float((x_nova - x_star).norm()) < 0.01 * gap
    assert float((x_avg - biased).norm()) < 0.02 * gap


def test_fedprox_alpha_terms_by_hand():
    """FedNova Fig. 4, eqs. 8-10, for two clients with tau = 1 and 3, p = 1/2, alpha = 1/2: ||a_2||_1 = 1 + 1/2 + 1/4
    = 7/4, tau_eff = 11/8, w = (4/11, 7/11), chi^2 = (3/22)^2 (11/4 + 11/7) = 0.080357, slowdown 2 / (11/8) = 16/11,
    A = 2 (11/8) [(4/11)^2 + (7/11)^2 (21/16) / (49/16)] = 0.840909; alpha = 0 is FedAvg (w = tau_i / sum tau)."""
    from fedrepro.report.figures import fednova

    terms = fednova.fedprox_terms(0.5, [1, 3], [0.5, 0.5])
    assert terms["tau_eff"] == pytest.approx(11 / 8) and terms["w"] == pytest.approx([4 / 11, 7 / 11])
    assert terms["weight_bias"] == pytest.approx(0.0803571, rel=1e-6)
    assert terms["slowdown"] == pytest.approx(16 / 11) and terms["A"] == pytest.approx(0.8409091, rel=1e-6)
    fedavg = fednova.fedprox_terms(0.0, [1, 3], [0.5, 0.5])
    assert fedavg["w"] == pytest.approx([0.25, 0.75]) and fedavg["slowdown"] == pytest.approx(1.0)
    # alpha -> 0 approaches FedAvg continuously
    assert fednova.fedprox_terms(1e-9, [1, 3], [0.5, 0.5])["w"] == pytest.approx([0.25, 0.75], abs=1e-8)


def test_fedprox_alpha_claim_holds_on_the_curves_and_fails_on_a_changed_value():
    """Fig. 4's claim in the paper's words: the weight bias falls with alpha, the slowdown rises, and alpha = 1
    gives objective consistency with tau_eff = 1. Each check is seen to fail on a changed curve."""
    from fedrepro.report.figures import KINDS, fednova

    curves = fednova.fedprox_alpha_curves(KINDS["fedprox_alpha"]["options"])
    checks = fednova.fedprox_alpha_checks(curves)
    assert [c["holds"] for c in checks] == [True, True, True]
    assert curves["slowdown"][-1] == pytest.approx(curves["tau"].mean())  # alpha = 1: tau_bar / 1
    for key, index, value in (("weight_bias", 30, 1.0), ("slowdown", 30, 0.5), ("tau_eff", -1, 2.0)):
        changed = {k: np.array(v, dtype=float) for k, v in curves.items()}
        changed[key][index] = value
        failing = [c["text"] for c in fednova.fedprox_alpha_checks(changed) if not c["holds"]]
        assert len(failing) == 1, (key, failing)
    assert "FEDPROX achieves objective consistency" in fednova.FEDPROX_ALPHA_CLAIM


def test_quadratic_fedprox_local_model_is_the_exact_gd_iterate():
    e, _, tau = _heterogeneous()
    x0 = torch.ones(3, dtype=torch.float64)
    lr, mu = 0.03, 1.0
    got = quad.local_models(x0, e, tau, lr, mu)
    for i in range(len(e)):
        x = x0.clone()
        for _ in range(int(tau[i])):
            x = x - lr * ((x - e[i]) + mu * (x - x0))
        torch.testing.assert_close(got[i], x, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- snapshots


def test_snapshots_do_not_change_the_run_and_survive_a_resume(tiny, tmp_path):
    plain = next(
        r
        for r in tiny["runs"]
        if r.experiment == "tiny" and r.setting["algorithm"] == "fedavg" and not r.setting["plugins"]
    )
    snap = next(r for r in tiny["runs"] if r.experiment == "tiny_snap")
    assert "snapshots" not in identity.identity_setting(plain.setting), (
        "an unused snapshots section must not change run identities"
    )
    runs = tiny["work"] / "runs"
    a, b = (pd.read_csv(runs / r.id / "metrics.csv").drop(columns=["seconds", "wall_time"]) for r in (plain, snap))
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert torch.equal(
        checkpoint.load(runs / plain.id / "model.pt")["x"], checkpoint.load(runs / snap.id / "model.pt")["x"]
    )
    stored = np.load(runs / snap.id / "snapshots.npz")
    assert {f"round_{r}_{k}" for r in (1, 2, 3) for k in ("global", "client_0", "client_1", "next", "sizes")} == set(
        stored.files
    )
    np.testing.assert_array_equal(stored["round_3_next"], checkpoint.load(runs / snap.id / "model.pt")["x"].numpy())
    np.testing.assert_array_equal(stored["round_2_global"], stored["round_1_next"])
    assert "round_2" in np.load(runs / snap.id / "cosines.npz").files
    out = tmp_path / "resumed"
    _train(snap.setting, out, tiny["partition"], tiny["work"] / "data" / "fmnist", "--stop-after", "2")
    _train(snap.setting, out, tiny["partition"], tiny["work"] / "data" / "fmnist")
    resumed = np.load(out / "snapshots.npz")
    assert set(resumed.files) == set(stored.files)
    for key in stored.files:
        np.testing.assert_array_equal(resumed[key], stored[key])


def test_snapshot_rounds_outside_the_run_are_refused_before_work():
    with pytest.raises(schema.ConfigError, match=r"snapshots.rounds = \[4\]: allowed are 1..3"):
        settings.resolve({**BASE, "snapshots": {"rounds": [4]}})


# --------------------------------------------------------------------------- every kind, drawn


SPECS = {
    "landscape": {"experiment": "tiny_snap", "rounds": [1, -1], "globals": [1, 2, 3], "resolution": 3},
    "landscape_rows": {
        "experiment": "tiny_snap",
        "rows": [{"label": "A", "select": {}}],
        "rounds": [-1],
        "globals": [1, 2, 3],
        "plane": "global_and_two_clients",
        "resolution": 3,
    },
    "interpolation": {
        "experiment": "tiny",
        "points": 5,
        "between": [{"algorithm": "fedavg", "plugins": []}, {"algorithm": "fedavg", "plugins": ["ima"]}],
    },
    "locality": {"experiment": "tiny"},
    "client_averages": {"experiment": "tiny_snap", "rounds": [2, -1], "cka_samples": 50},
    "coherence": {"experiment": "tiny"},
    "fedlaw_weights": {"experiment": "tiny", "select": {"algorithm": "fedlaw"}},
    "elud": {"experiment": "tiny"},
    "cosines": {"experiment": "tiny_snap", "rounds": [1, 2]},
    "coherence_lud": {"experiment": "tiny"},
    "quadratic": {"rounds": 50, "decay_rounds": [20], "clients": 5, "dim": 3},
    "fedprox_alpha": {"alphas": [0.001, 0.01, 0.1, 0.5, 1.0]},
    "loss_curves": {"experiment": "tiny"},
    "split_dynamics": {"experiment": "tiny"},
    "momentum_ablation": {"experiment": "tiny_alpha"},
    "gws_sweep": {"experiment": "tiny_gws", "axis": "local_epochs"},
    "gws_norms": {"experiment": "tiny_gws", "select": {"algorithm": "fedlaw", "local_epochs": 2}},
    "gws_ratio": {"experiment": "tiny_gws"},
    "model_norm": {"experiment": "tiny_gws", "select": {"local_epochs": 2}},
    "sharpness": {"experiment": "tiny_gws", "select": {"local_epochs": 2}},
    "sweep_accuracy": {"experiment": "tiny_gws", "axis": "local_epochs"},
    "client_weights": {"experiment": "tiny_law"},
    "accuracy": {"experiment": "tiny_gws"},
    "cohort_classes": {"experiment": "tiny_law"},
}


def _plotted(fig) -> list[np.ndarray]:
    """The finite data arrays a figure draws: line y values, scatter offsets, images and meshes."""
    arrays = []
    for ax in fig.axes:
        arrays += [np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines()]
        arrays += [np.asarray(c.get_offsets(), dtype=float) for c in ax.collections if len(c.get_offsets())]
        arrays += [np.asarray(c.get_array(), dtype=float) for c in ax.collections if c.get_array() is not None]
        arrays += [np.asarray(im.get_array(), dtype=float) for im in ax.get_images()]
    return [a[np.isfinite(a)] for a in arrays if np.isfinite(a).sum() >= 2]


def test_every_declared_kind_is_drawn_by_the_function_of_its_name():
    """A kind is its family's ``<family>.yaml`` entry plus the function of its name in ``<family>.py``."""
    import importlib

    assert {"landscape", "coherence", "elud", "quadratic"} <= set(figures.KINDS)
    for kind, declaration in figures.KINDS.items():
        module = importlib.import_module(f"fedrepro.report.figures.{declaration['family']}")
        assert callable(getattr(module, kind, None)), f"{declaration['family']}.py has no function {kind}"
        assert set(declaration["choices"]) <= set(declaration["options"]), kind
    assert figures.NO_RUNS == {"quadratic", "fedprox_alpha"}
    assert figures.EVALUATES == {"landscape", "landscape_rows", "interpolation", "client_averages"}


def test_a_kind_is_found_from_its_declaration_and_a_second_or_malformed_one_is_refused(tmp_path):
    (tmp_path / "one.yaml").write_text("spiral:\n  shows: a spiral\n  options: {turns: 3}\n  reads_runs: false\n")
    assert figures.declared(tmp_path) == {
        "spiral": {
            "family": "one",
            "shows": "a spiral",
            "options": {"turns": 3},
            "choices": {},
            "reads_runs": False,
            "evaluates": False,
            "shapes": {},
        }
    }
    (tmp_path / "two.yaml").write_text("spiral:\n  shows: another spiral\n")
    with pytest.raises(FedreproError, match="two.yaml: figure kind spiral is declared in one.yaml too"):
        figures.declared(tmp_path)
    (tmp_path / "two.yaml").write_text("wave:\n  shows: a wave\n  evalutes: true\n")
    with pytest.raises(FedreproError, match="two.yaml: figure kind wave declares"):
        figures.declared(tmp_path)


@pytest.mark.parametrize("kind", sorted(set(figures.KINDS) - {"fixed_gamma"}))
def test_every_kind_draws_its_image_from_tiny_runs(tiny, kind, monkeypatch):
    """Each kind draws data, not a blank canvas or a notice: the figure holds finite data arrays that
    vary, and the PNG is a real picture (its size, many non-white pixels, several colours)."""
    from matplotlib.figure import Figure
    from matplotlib.image import imread

    saved = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), savefig(fig, *a, **k))[1])
    record = _draw(tiny, kind, {"kind": kind, "reproduces": "Fig. X", **SPECS[kind]})
    assert record["drawn"], record["reason"]
    assert "Reproduces Fig. X" in record["caption"] and "Quick profile" in record["caption"]
    (fig,) = saved
    arrays = _plotted(fig)
    assert arrays and any(np.ptp(a) > 0 for a in arrays), f"{kind}: the figure draws no varying data"
    png = tiny["work"] / "fig" / f"{kind}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(png)[..., :3]
    assert pixels.shape[0] >= 150 and pixels.shape[1] >= 200, pixels.shape
    assert (pixels < 0.9).any(axis=2).mean() > 0.01, f"{kind}: the image is nearly blank"
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20, f"{kind}: too few colours for a plot"


def test_the_elud_figure_draws_each_runs_e_lud(tiny, monkeypatch):
    """The data behind a curve: every run's e-LUD series from its metrics.csv is a line of the figure
    (one seed per method, so the line is the run's own series)."""
    from matplotlib.figure import Figure

    saved = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), savefig(fig, *a, **k))[1])
    assert _draw(tiny, "elud_data", {"kind": "elud", "experiment": "tiny"})["drawn"]
    lines = [np.asarray(line.get_ydata(), dtype=float) for ax in saved[0].axes for line in ax.get_lines()]
    runs = figures.select_runs(tiny["manifest"], tiny["work"] / "runs", {"experiment": "tiny", "select": {}})
    assert len(runs) == 4
    for run in runs:
        series = pd.read_csv(tiny["work"] / "runs" / run.id / "metrics.csv")["e_lud"].to_numpy()
        assert any(len(y) == len(series) and np.allclose(y, series, rtol=1e-9) for y in lines), run.id


def test_loss_curves_draw_the_logged_rounds_of_the_global_loss_or_the_local_one(tiny):
    from fedrepro.report.figures import fednova

    runs = figures.finished(
        figures.select_runs(
            tiny["manifest"], tiny["work"] / "runs", {"experiment": "tiny", "select": {"algorithm": "fedavg"}}
        )
    )
    logged = runs[0].metrics.dropna(subset=["global_train_loss"])["round"].tolist()
    assert logged == [1, 3]  # every 20 rounds by default, plus the first and the last of the 3
    for column in ("global_train_loss", "train_loss"):
        record = _draw(tiny, f"loss_{column}", {"kind": "loss_curves", "experiment": "tiny", "column": column})
        assert record["drawn"] and record["caption"].startswith(fednova.LOSS_COLUMNS[column].split(" (")[0])


def test_fixed_gamma_without_such_runs_says_so(tiny):
    record = _draw(tiny, "gamma", {"kind": "fixed_gamma", "experiment": "tiny"})
    assert not record["drawn"] and "fixed fedlaw.gamma" in record["reason"]


def test_adaptive_gws_logs_the_two_terms_of_eq_4_and_the_model_norm(tiny):
    """gws_norm = |1 - gamma| ||x|| and global_grad_norm = gamma ||sum_i lambda_i Delta_i|| (eta_g = 1) add up,
    as vectors, to the server step x - x_new (Eq. 4); the last round's model_norm is the saved model's norm."""
    runs = figures.select_runs(tiny["manifest"], tiny["work"] / "runs", {"experiment": "tiny_gws", "select": {}})
    gws = [r for r in runs if r.setting["algorithm"] == "fedlaw"]
    assert len(gws) == 2
    for run in runs:
        saved = checkpoint.load(run.folder.model)["x"]
        assert run.metrics["model_norm"].iloc[-1] == pytest.approx(float(saved.norm()), rel=1e-5)
    for run in gws:
        m = run.metrics
        assert (m["gamma"] != 1.0).any(), "adaptive GWS learns gamma"
        # triangle inequality of the two terms: |a - b| <= ||step|| <= a + b
        a, b = m["gws_norm"], m["global_grad_norm"]
        # ||(1 - gamma_t) x_t||, x_t the model the previous round's step left (its model_norm)
        expected = ((1 - m["gamma"]).abs() * m["model_norm"].shift(1)).to_numpy()[1:]
        assert (a >= 0).all() and a.to_numpy()[1:] == pytest.approx(expected, rel=1e-4)
        assert ((m["step_norm"] <= a + b + 1e-4) & (m["step_norm"] >= (a - b).abs() - 1e-4)).all()
        assert m["global_grad_norm"].to_numpy() == pytest.approx((m["gamma"] * m["global_norm"]).to_numpy(), rel=1e-4)


def test_the_logged_hessian_eigenvalues_are_those_of_the_rounds_global_model(tiny, tiny_data_root):
    """Rounds 1 and 3 (every 3) log the Lanczos estimate; round 3's model is the saved one: recomputing on the
    same 50 training samples (the run's seed) gives the logged values, and top1 / top3 is the ratio."""
    import torch.nn.functional as F

    from fedrepro import data, models
    from fedrepro.functional import FunctionalModel
    from fedrepro.run import hessian

    run = figures.select_runs(
        tiny["manifest"],
        tiny["work"] / "runs",
        {"experiment": "tiny_gws", "select": {"algorithm": "fedlaw", "local_epochs": 2}},
    )[0]
    m = run.metrics
    assert m["hessian_top1"].notna().tolist() == [True, False, True]
    assert (m["hessian_top1"].dropna() >= m["hessian_topk"].dropna()).all()
    assert m["hessian_ratio"].dropna().to_numpy() == pytest.approx(
        (m["hessian_top1"] / m["hessian_topk"]).dropna().to_numpy()
    )
    train = data.load("fmnist", tiny_data_root, train=True)
    index = torch.randperm(len(train), generator=torch.Generator().manual_seed(run.setting["seed"]))[:50]
    x, y = train.batch(index)
    module = models.build("mlp", "fmnist").eval()
    net, w = FunctionalModel(module), checkpoint.load(run.folder.model)["x"]
    values, _ = hessian.top_eigen(lambda v: F.cross_entropy(net(v, x), y), w, 3, 6, run.setting["seed"])
    assert m["hessian_top1"].iloc[-1] == pytest.approx(float(values[0]), rel=1e-4)
    assert m["hessian_topk"].iloc[-1] == pytest.approx(float(values[-1]), rel=1e-4)


def test_the_cohorts_class_distribution_is_the_lambda_weighted_mean_of_its_clients(tiny):
    """Def. 5.2: D_cohort = sum_i lambda_i D_i over the round's cohort (lambda_client_<id>, nan when not
    sampled), D_i each client's class shares from summary.json's counts; the TV distance is to the data-size
    weighted distribution of all clients."""
    [run] = figures.select_runs(tiny["manifest"], tiny["work"] / "runs", {"experiment": "tiny_law", "select": {}})
    counts = np.asarray(run.summary["client_class_counts"], dtype=float)
    shares = counts / counts.sum(1, keepdims=True)
    overall = counts.sum(0) / counts.sum()
    m = run.metrics
    # a client never sampled has no column
    lam = m.reindex(columns=[f"lambda_client_{i}" for i in range(len(counts))]).fillna(0.0).to_numpy()
    assert (lam > 0).sum(1).tolist() == [2, 2, 2]  # participation 0.5 of 4 clients
    cohort = lam @ shares
    logged = m[[f"cohort_class_{c}" for c in range(counts.shape[1])]].to_numpy()
    assert logged == pytest.approx(cohort, abs=1e-5)
    assert m["cohort_class_tv"].to_numpy() == pytest.approx(0.5 * np.abs(cohort - overall).sum(1), abs=1e-5)


def test_gws_figures_pair_fedavg_with_adaptive_gws_by_setting(tiny):
    record = _draw(tiny, "sweep", {"kind": "gws_sweep", "experiment": "tiny_gws", "axis": "local_epochs"})
    assert record["drawn"] and "gain of adaptive GWS over FedAvg" in record["caption"]
    pairs = fedlaw_figures._gws_pairs(
        figures.select_runs(tiny["manifest"], tiny["work"] / "runs", {"experiment": "tiny_gws", "select": {}}),
        "local_epochs",
    )
    assert sorted(pairs["x"]) == [1, 1, 2, 2] and set(pairs["method"]) == {"fedavg", "gws"}
    # one value of the axis is no line: the figure says so instead of drawing points
    record = _draw(tiny, "one", {"kind": "gws_sweep", "experiment": "tiny_gws", "axis": "alpha"})
    assert not record["drawn"] and "two values of alpha" in record["reason"]
    record = _draw(tiny, "none", {"kind": "gws_ratio", "experiment": "tiny"})
    assert not record["drawn"] and "adaptive_gws" in record["reason"]
    with pytest.raises(schema.ConfigError, match=r"figures.f.axis = 'rounds': allowed are local_epochs, alpha"):
        figures.check({"f": {"kind": "gws_sweep", "experiment": "tiny", "axis": "rounds"}}, {"tiny": {}})


def test_middle_rounds_are_90_to_110_or_the_middle_tenth_of_a_short_run():
    long = pd.DataFrame({"round": range(1, 201), "v": range(1, 201)})
    assert list(fedlaw_figures.middle_rounds(long, "v")) == list(range(90, 111))
    short = pd.DataFrame({"round": range(1, 21), "v": range(1, 21)})
    assert list(fedlaw_figures.middle_rounds(short, "v")) == [9, 10, 11]


def test_a_run_without_snapshots_gets_a_clear_message_not_a_crash(tiny):
    record = _draw(
        tiny, "nosnap", {"kind": "landscape", "experiment": "tiny", "select": {"algorithm": "fedavg"}, "rounds": [1]}
    )
    assert not record["drawn"]
    assert "kept no model snapshots" in record["reason"] and "snapshots.rounds" in record["reason"]
    assert (tiny["work"] / "fig" / "nosnap.png").exists()
    record = _draw(tiny, "noround", {"kind": "landscape", "experiment": "tiny_snap", "rounds": [1], "globals": []})
    assert record["drawn"]
    record = _draw(tiny, "cos", {"kind": "cosines", "experiment": "tiny_snap", "rounds": [3]})
    assert not record["drawn"] and "cosine_rounds" in record["reason"]


def test_a_figure_of_a_diverged_run_says_so(tiny):
    diverged = figures.select_runs(
        tiny["manifest"], tiny["work"] / "runs", {"experiment": "tiny_diverge", "select": {}}
    )
    assert diverged[0].summary["status"] == "diverged"
    for kind in ("elud", "landscape"):
        record = _draw(tiny, f"div_{kind}", {"kind": kind, "experiment": "tiny_diverge"})
        assert not record["drawn"] and record["reason"].startswith("diverged")
        assert "Not drawn: diverged" in record["caption"]


def test_bad_figure_specs_are_refused_with_the_key_and_what_is_allowed():
    with pytest.raises(schema.ConfigError, match=r"figures.f.kind = 'heatmap': allowed are .*landscape"):
        figures.check({"f": {"kind": "heatmap"}}, {"tiny": {}})
    with pytest.raises(schema.ConfigError, match=r"figures.f.experiment = 'nope'"):
        figures.check({"f": {"kind": "elud", "experiment": "nope"}}, {"tiny": {}})
    with pytest.raises(
        schema.ConfigError, match=r"figures.f.column = 'loss': allowed are global_train_loss, train_loss"
    ):
        figures.check({"f": {"kind": "loss_curves", "experiment": "tiny", "column": "loss"}}, {"tiny": {}})
    with pytest.raises(schema.ConfigError, match=r"unknown keys \['grid'\]"):
        figures.check({"f": {"kind": "elud", "experiment": "tiny", "grid": 3}}, {"tiny": {}})


def test_the_cli_draws_a_figure_and_the_report_embeds_it(tiny, tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(tiny["manifest"]))
    folder = tmp_path / "figures"
    cli.main(
        [
            "figures",
            "--name",
            "elud",
            "--spec",
            json.dumps({"kind": "elud", "experiment": "tiny"}),
            "--manifest",
            str(manifest),
            "--runs-dir",
            str(tiny["work"] / "runs"),
            "--out",
            str(folder / "elud.png"),
        ]
    )
    assert json.loads((folder / "elud.json").read_text())["drawn"]
    from fedrepro.report import page

    out = page.build(
        manifest,
        tiny["work"] / "runs",
        tmp_path / "partitions",
        tmp_path / "tiny.html",
        tmp_path / "page_figures",
        folder,
    )
    html = out.read_text()
    assert "The papers' analysis figures" in html and "e-LUD" in html
    assert (tmp_path / "page_figures" / "paper.elud.png").exists()


def test_the_hybrid_partitions_groups_log_their_coherence_and_the_figure_draws_them(tiny_data_root, tmp_path):
    """Each group's coherence is the mean off-diagonal cosine of its clients' block of the round's cosine
    matrix (full participation: the cohort is clients 0..3 in order; balanced = 0, 1)."""
    work = tmp_path
    (work / "data").mkdir()
    (work / "data" / "fmnist").symlink_to(tiny_data_root)
    hybrid = {"kind": "hybrid", "alpha_balanced": 10.0, "alpha": 0.1, "min_size": 1, "balance": False, "seed": 1}
    params = {
        "title": "hybrid",
        "experiments": {
            "hyb": {"base": {**BASE, "participation": 1.0, "partition": hybrid}, "grid": {"algorithm": ["fedavg"]}}
        },
    }
    runs = expansion.expand(params)
    parts = make_partition(tiny_data_root, work / "partition", num_clients=4, **hybrid)
    run = runs[0]
    _train(run.setting, work / "runs" / run.id, parts, tiny_data_root)
    metrics = pd.read_csv(work / "runs" / run.id / "metrics.csv")
    cosine = np.load(work / "runs" / run.id / "cosines.npz")["round_1"]
    assert metrics.loc[0, "coherence_balanced"] == pytest.approx(cosine[0, 1], abs=1e-5)
    assert metrics.loc[0, "coherence_imbalanced"] == pytest.approx(cosine[2, 3], abs=1e-5)
    assert metrics.loc[0, "coherence_balanced"] != pytest.approx(metrics.loc[0, "coherence"], abs=1e-4)
    manifest = expansion.manifest(params, runs, "hybrid")
    spec = figures.check({"c": {"kind": "coherence", "experiment": "hyb"}}, manifest["experiments"])["c"]
    record = figures.draw(
        "c", spec, manifest, work / "runs", work / "fig" / "c.png", figures.Context(work / "data", "cpu")
    )
    assert record["drawn"] and "dashed balanced, dotted imbalanced" in record["caption"]
    spec = figures.check({"m": {"kind": "cosines", "experiment": "hyb", "rounds": [1]}}, manifest["experiments"])["m"]
    record = figures.draw(
        "m", spec, manifest, work / "runs", work / "fig" / "m.png", figures.Context(work / "data", "cpu")
    )
    assert record["drawn"] and "part the balanced clients 0-1 from the imbalanced ones" in record["caption"]


def test_attentive_law_logs_lambda_per_client_and_after_an_early_stop_aggregates_as_fedavg(tiny_data_root, tmp_path):
    """Fig. 5 middle and right: lambda_client_<id> is the round's lambda by client id; with learn_rounds 2
    rounds 1-2 learn lambda and round 3 uses the data sizes n_i / sum_j n_j of its cohort, gamma 1."""
    from fedrepro.partitions import records as partition_records

    work = tmp_path
    (work / "data").mkdir()
    (work / "data" / "fmnist").symlink_to(tiny_data_root)
    hybrid = {"kind": "hybrid", "alpha_balanced": 10.0, "alpha": 0.1, "min_size": 1, "balance": False, "seed": 1}
    law = {"variant": "attentive", "proxy_size": 20, "server_epochs": 3, "server_lr": 0.5, "log_client_weights": True}
    params = {
        "title": "early",
        "experiments": {
            "e": {
                "base": {**BASE, "participation": 1.0, "partition": hybrid, "algorithm": "fedlaw", "fedlaw": law},
                "grid": {"fedlaw.learn_rounds": [0, 2]},
            }
        },
    }
    runs = expansion.expand(params)
    parts = make_partition(tiny_data_root, work / "partition", num_clients=4, **hybrid)
    sizes = np.array([len(p) for p in partition_records.load(parts)], dtype=float)
    for run in runs:
        _train(run.setting, work / "runs" / run.id, parts, tiny_data_root)
    manifest = expansion.manifest(params, runs, "early")
    done = {
        r.setting["fedlaw"]["learn_rounds"]: r
        for r in figures.select_runs(manifest, work / "runs", {"experiment": "e", "select": {}})
    }
    columns = [f"lambda_client_{i}" for i in range(4)]
    for run in done.values():
        m = run.metrics
        assert m[columns].sum(axis=1).to_numpy() == pytest.approx(np.ones(3), abs=1e-5)
        assert m["weights_max"].to_numpy() == pytest.approx(m[columns].max(axis=1).to_numpy(), abs=1e-6)
    stopped, always = done[2].metrics, done[0].metrics
    assert stopped.loc[2, columns].to_numpy(dtype=float) == pytest.approx(sizes / sizes.sum(), abs=1e-6)
    assert stopped.loc[2, "gamma"] == 1.0
    assert always.loc[2, columns].to_numpy(dtype=float) != pytest.approx(sizes / sizes.sum(), abs=1e-3)
    # the first two rounds are the same run until the stop
    assert stopped.loc[:1, columns].to_numpy() == pytest.approx(always.loc[:1, columns].to_numpy(), abs=1e-6)
    from fedrepro.report.figures.curves import method

    assert method(done[2]) == "fedlaw (attentive, learned until round 2)" and method(done[0]) == "fedlaw (attentive)"
    captions = {}
    for name, kind in (("w", "client_weights"), ("a", "accuracy")):
        spec = figures.check({name: {"kind": kind, "experiment": "e"}}, manifest["experiments"])[name]
        record = figures.draw(
            name, spec, manifest, work / "runs", work / "fig" / f"{name}.png", figures.Context(work / "data", "cpu")
        )
        assert record["drawn"], record["reason"]
        captions[kind] = record["caption"]
    assert "parts the balanced clients (above) from the imbalanced ones" in captions["client_weights"]


# --------------------------------------------------------------------------- the workflow


def test_the_quick_default_draws_figures_of_every_paper(tmp_path):
    from conftest import ROOT, job_counts, run_snakemake

    params = paramsfile.load_params(ROOT / "params" / "default.yaml")
    specs = figures.check(params["figures"], params["experiments"])
    assert {figures.family(s["kind"]) for s in specs.values()} == {"ima", "fedlaw", "fedaware", "fednova"}
    proc = run_snakemake(tmp_path, "-n", "--configfile", str(ROOT / "params" / "default.yaml"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert job_counts(proc.stdout + proc.stderr)["figure"] == len(specs)


WORKFLOW = {
    "title": "tiny figures workflow",
    "quick": True,
    "data": {"root": "data", "mirrors": {"fmnist": ["/usr/share/datasets/fashion-mnist/"]}},
    "tracking": {"enabled": False},
    "experiments": {
        "tiny": {
            "base": {
                **BASE,
                "partition": {"kind": "dirichlet", "alpha": 0.5, "seed": 1, "min_size": 10},
                "snapshots": {"rounds": [1, 3]},
            },
            "grid": {"algorithm": ["fedavg"]},
        }
    },
    "figures": {
        "land": {"kind": "landscape", "experiment": "tiny", "rounds": [1, 3], "resolution": 3},
        "coh": {"kind": "coherence", "experiment": "tiny"},
        "quad": {"kind": "quadratic", "rounds": 30, "decay_rounds": [10]},
    },
}


@pytest.mark.slow
def test_figure_rules_run_on_a_tiny_workflow_and_the_page_embeds_them(tmp_path, fmnist_data):
    from conftest import run_snakemake, subprocess_env, write_yaml

    params = write_yaml(tmp_path / "tiny.yaml", fmnist_data.params(WORKFLOW))
    proc = run_snakemake(tmp_path, "--configfile", str(params), "--cores", "2", env=subprocess_env(fmnist=fmnist_data))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in WORKFLOW["figures"]:
        record = json.loads((tmp_path / "results" / "figures" / "tiny" / f"{name}.json").read_text())
        assert record["drawn"], record
        assert (tmp_path / "reports" / "tiny_figures" / f"paper.{name}.png").exists()
    html = (tmp_path / "reports" / "tiny.html").read_text()
    assert html.count('<figure id="figure-') == len(WORKFLOW["figures"])


def test_interpolation_for_each_method_draws_a_line_per_method_and_names_the_missing(tiny):
    record = _draw(
        tiny,
        "interp_each",
        {
            "kind": "interpolation",
            "experiment": "tiny",
            "points": 3,
            "between": [{"plugins": []}, {"plugins": ["ima"]}],
            "for_each": {"algorithm": ["fedavg", "fedaware"]},
        },
    )
    assert record["drawn"], record["reason"]
    assert "no finished run: {'plugins': ['ima'], 'algorithm': 'fedaware'}" in record["caption"]
    record = _draw(
        tiny,
        "interp_none",
        {
            "kind": "interpolation",
            "experiment": "tiny",
            "points": 3,
            "between": [{"plugins": []}, {"plugins": ["ima"]}],
            "for_each": {"algorithm": ["fedaware"]},
        },
    )
    assert not record["drawn"] and "no finished run matches" in record["reason"]
    with pytest.raises(schema.ConfigError, match=r"for_each = .*one key and its list of values"):
        figures.check(
            {"f": {"kind": "interpolation", "experiment": "tiny", "for_each": {"a": [1], "b": [2]}}}, {"tiny": {}}
        )


def test_the_landscape_plane_through_three_client_models(tiny_data_root, tmp_path, monkeypatch):
    """IMA Fig. 1's plane: three client models of one round (full participation keeps three of four)."""
    planes = []
    surface = ima.surface
    monkeypatch.setattr(
        ima, "surface", lambda evaluator, models, *a: planes.append(models) or surface(evaluator, models, *a)
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "fmnist").symlink_to(tiny_data_root)
    params = {
        "title": "three",
        "quick": True,
        "experiments": {
            "three": {
                "base": {**BASE, "participation": 1.0, "rounds": 2, "snapshots": {"rounds": [2], "clients": 3}},
                "grid": {"algorithm": ["fedavg"]},
            }
        },
    }
    runs = expansion.expand(params)
    partition_dir = make_partition(tiny_data_root, tmp_path / "partition", num_clients=4)
    _train(runs[0].setting, tmp_path / "runs" / runs[0].id, partition_dir, tiny_data_root)
    manifest = expansion.manifest(params, runs, "three")
    spec = figures.check(
        {"p": {"kind": "landscape", "experiment": "three", "rounds": [2], "plane": "three_clients", "resolution": 3}},
        manifest["experiments"],
    )["p"]
    record = figures.draw(
        "p",
        spec,
        manifest,
        tmp_path / "runs",
        tmp_path / "fig" / "p.png",
        figures.Context(tmp_path / "data", "cpu", True),
    )
    assert record["drawn"], record["reason"]
    assert "three client models of a round" in record["caption"]
    stored = np.load(tmp_path / "runs" / runs[0].id / "snapshots.npz")
    assert len(planes) == 1 and all(
        np.array_equal(np.asarray(m), stored[f"round_2_client_{i}"]) for i, m in enumerate(planes[0])
    )
    with pytest.raises(schema.ConfigError, match=r"plane = 'four': allowed are global_and_two_clients, three_clients"):
        figures.check({"f": {"kind": "landscape", "experiment": "three", "plane": "four"}}, manifest["experiments"])


def test_fig10_rows_draw_each_setups_own_planes_and_a_missing_setup_says_so_in_its_row(
    tiny_data_root, tmp_path, monkeypatch
):
    """IMA Fig. 10: one row per setup (here the MLP and the CNN on FMNIST), each plane through its own run's
    three client models (or the last three global models), and the cross at the three models' mean."""
    planes = []
    surface = ima.surface
    monkeypatch.setattr(
        ima, "surface", lambda evaluator, models, *a: planes.append(models) or surface(evaluator, models, *a)
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "fmnist").symlink_to(tiny_data_root)
    params = {
        "title": "rows",
        "quick": True,
        "experiments": {
            "rows": {
                "base": {**BASE, "participation": 1.0, "rounds": 3, "snapshots": {"rounds": [1, 2, 3], "clients": 3}},
                "grid": {"model": ["mlp", "cnn"]},
            }
        },
    }
    runs = expansion.expand(params)
    partition_dir = make_partition(tiny_data_root, tmp_path / "partition", num_clients=4)
    for run in runs:
        _train(run.setting, tmp_path / "runs" / run.id, partition_dir, tiny_data_root)
    manifest = expansion.manifest(params, runs, "rows")
    rows = [
        {"label": "MLP, FMNIST", "select": {"model": "mlp"}},
        {"label": "CNN, FMNIST", "select": {"model": "cnn"}},
        {"label": "ResNet-18", "select": {"model": "resnet18_gn2"}},
    ]

    def draw(name, **options):
        spec = figures.check(
            {
                name: {
                    "kind": "landscape_rows",
                    "experiment": "rows",
                    "rows": rows,
                    "rounds": [1, -1],
                    "globals": [1, 2, 3],
                    "resolution": 3,
                    **options,
                }
            },
            manifest["experiments"],
        )[name]
        return figures.draw(
            name,
            spec,
            manifest,
            tmp_path / "runs",
            tmp_path / "fig" / f"{name}.png",
            figures.Context(tmp_path / "data", "cpu", True),
        )

    from matplotlib.figure import Figure

    saved = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), savefig(fig, *a, **k))[1])
    record = draw("fig10")
    assert record["drawn"], record["reason"]
    assert "MLP, FMNIST: fedavg seed 1; CNN, FMNIST: fedavg seed 1" in record["caption"]
    by_model = {r.setting["model"]: np.load(tmp_path / "runs" / r.id / "snapshots.npz") for r in runs}
    wanted = [[f"round_{r}_client_{i}" for i in range(3)] for r in (1, 3)] + [[f"round_{r}_next" for r in (1, 2, 3)]]
    assert len(planes) == 6  # two setups x (two client planes + one global plane); the ResNet row has no run
    for plane, (model, keys) in zip(planes, [(m, k) for m in ("mlp", "cnn") for k in wanted]):
        assert all(np.array_equal(np.asarray(x), by_model[model][key]) for x, key in zip(plane, keys)), (model, keys)
    axes = np.array(saved[0].axes[:9]).reshape(3, 3)  # the 3 x 3 panels come first, then the colour bars
    for ax, models in zip(axes[:2].ravel(), planes):
        origin, u, v = ima.plane(*models)
        mean = sum(m.double() for m in models) / 3
        cross = [line for line in ax.get_lines() if line.get_marker() == "x"][0]
        assert (cross.get_xdata()[0], cross.get_ydata()[0]) == pytest.approx(ima.coordinates(mean, origin, u, v))
    assert "not drawn: no run matches {'model': 'resnet18_gn2'}" in axes[2, 0].texts[0].get_text()
    assert "ResNet-18" in axes[2, 0].get_ylabel()

    rows[:] = rows[2:]
    record = draw("none")
    assert not record["drawn"] and "ResNet-18: no run matches" in record["reason"]
    for bad in ([], [{"label": "x"}], [{"label": "x", "select": {}, "extra": 1}]):
        with pytest.raises(schema.ConfigError, match=r"figures.f.rows = .*a non-empty list of \{label, select\}"):
            figures.check({"f": {"kind": "landscape_rows", "experiment": "rows", "rows": bad}}, manifest["experiments"])
    with pytest.raises(schema.ConfigError, match=r"quantity = 'accuracy': allowed are loss, error"):
        figures.check(
            {"f": {"kind": "landscape_rows", "experiment": "rows", "rows": rows, "quantity": "accuracy"}},
            manifest["experiments"],
        )
