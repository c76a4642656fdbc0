"""params/subsets/<paper>_official_protocol.yaml: each turns the official code's protocol on for its paper's
grid, for every method of a comparison alike, and changes nothing else."""

from __future__ import annotations

import pytest

from fedrepro import identity
from fedrepro.configure import expansion, paramsfile, settings
from fedrepro.configure.paramsfile import ROOT

# expanding IMA's 1,296 runs twice takes ~20 s
PAPERS = ["fedaware", "fedlaw", pytest.param("ima", marks=pytest.mark.slow), "fednova"]


def _runs(paper: str, official: bool) -> list[settings.Run]:
    files = [ROOT / "params" / f"{paper}.yaml"]
    if official:
        files.append(ROOT / "params" / "subsets" / f"{paper}_official_protocol.yaml")
    return expansion.expand(paramsfile.load_params_files(files))


# FedAWARE's code: these scripts use the FeedbackSampler and pair uploads with its unsorted draw; FedProx,
# FedDyn, SCAFFOLD and FedNova sample uniformly; FedCM is not in the code (the paper's protocol)
FEEDBACK_SAMPLER = {"fedavg", "fedavgm", "fedyogi", "fedams", "fedaware"}
AGNOSTIC = ["random_epochs", "random_batch"]  # the xAWARE script's -agnostic 1


def _switched(paper: str, setting: dict | None = None) -> dict:
    """The keys a subset switches, on every run of the paper's grid (FedAWARE's: per method)."""
    if paper == "fedaware":
        if setting is None:
            return {"cohort": {"warmup": None, "assignment": None}}
        code = setting["algorithm"] in FEEDBACK_SAMPLER
        return {"cohort": {"warmup": "permutation" if code else "none", "assignment": "code" if code else "per_client"}}
    # IMA: args.py's anchor momentum 0.5, but the code's Digit/PACS arguments keep the paper's 0.9
    momentum = 0.9 if setting is not None and setting["dataset"] in ("digit5", "pacs") else 0.5
    return {
        "ima": {"fedfa": {"momentum": momentum}, "ima": {"cyclic_lr_max": None}},
        "fedlaw": {"evaluation": {"proxy_holdout": 200}, "client": {"keep_momentum": True, "holdout": 0.3}},
        "fednova": {},
    }[paper]


def _left_out(paper: str, run: settings.Run) -> str | None:
    """Why the official-protocol subset runs no counterpart of this run of the paper's file; None: it must."""
    if paper == "fednova":
        if run.experiment == "fednova_fig5_synthetic":
            return "the authors' code has no synthetic problem (the subset's only: fednova_table1_*)"
        if run.setting["seed"] not in (1, 3):
            return "the launch script's seeds are 1 and 3"
    return None


def _without(setting: dict, switched: dict) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in setting.items()}
    for section, keys in switched.items():
        for key in keys:
            out.get(section, {}).pop(key, None)
    if "aware" in out.get("plugins", []):  # FedAWARE's xAWARE rows run the code's -agnostic 1
        out["plugins"] = [p for p in out["plugins"] if p not in AGNOSTIC]
        for section in AGNOSTIC:
            out.pop(section, None)
    if out.get("model") == "resnet18_gn32_code":  # FedAWARE's code's CIFAR-100 network (docs/parity.md)
        out["model"] = "resnet18_gn32"
    if out.get("partition", {}).get("kind") == "dirichlet_legacy":  # FedNova's code's draw (docs/parity.md)
        out["partition"] = {**out["partition"], "kind": "dirichlet"}
    if out.get("partition", {}).get("kind") == "dirichlet":  # a setting of dirichlet's own (long tails)
        out["partition"] = {k: v for k, v in out["partition"].items() if k != "long_tail_rho"}
    if out.get("dataset") == "cifar100" and out["partition"]["kind"] in ("pachinko", "inner_dirichlet"):
        out.pop("partition")  # IMA's notebook: FedLab's inner Dirichlet where the paper states Pachinko
    if "fedprox" in out:  # FedAWARE's code: FedProx's plain mean
        out["fedprox"] = {k: v for k, v in out["fedprox"].items() if k != "mean"}
    for section in ("fedlaw", "feddf", "fedbe", "serverft"):  # FedLAW's proxy size, server epochs and optimiser
        if section in out:
            for key in (
                "proxy_size",
                "server_epochs",
                "optimizer",
                "lr",
                "weight_decay",
                "swa_order",
                "teacher_statistics",
            ):
                out[section].pop(key, None)
    if out.get("algorithm") == "fedprox":  # FedLAW's code: FedProx without momentum and weight decay
        out["client"].pop("momentum", None)
        out["client"].pop("weight_decay", None)
    return out


@pytest.mark.parametrize("paper", PAPERS)
def test_the_subset_switches_its_keys_on_every_run_and_changes_nothing_else(paper):
    official = _runs(paper, True)
    switched = _switched(paper)
    for run in official:
        for section, keys in _switched(paper, run.setting).items():
            if section not in run.setting:  # a method's section, on a run of another method
                continue
            expected = dict(keys)
            if section == "client" and "keep_momentum" in keys:  # nothing to keep without momentum (FedProx)
                expected["keep_momentum"] = run.setting["client"]["momentum"] > 0
            if run.experiment == "fedlaw_fig8_proxy_size" and section == "evaluation":  # the size it sweeps
                expected["proxy_holdout"] = run.setting["evaluation"]["proxy_holdout"]
            if "cyclic_lr_max" in keys:  # null resolves to the code's lr_max: the client lr at t_s, lr * decay^t_s
                c, t_s = run.setting["client"], run.setting["ima"]["start_round"]
                expected["cyclic_lr_max"] = pytest.approx(c["lr"] * c["lr_decay"] ** t_s, rel=1e-12)
            assert {k: run.setting[section][k] for k in keys} == expected, run.id
    kept = {
        (r.experiment, identity.stable_hash(_without(r.setting, switched)))
        for r in _runs(paper, False)
        if _left_out(paper, r) is None
    }
    official_keys = {(r.experiment, identity.stable_hash(_without(r.setting, switched))) for r in official}
    # exactly the paper's grid points, up to the switched keys: none goes missing, none is added, but for
    # the ones _left_out names with the reason
    assert sorted(kept - official_keys) == [], "paper runs the subset dropped"
    assert sorted(official_keys - kept) == [], "runs the subset added that the paper's file lacks"


def test_fedlaw_official_protocol_holds_out_the_codes_2_percent_for_every_method():
    runs = [r for r in _runs("fedlaw", True) if r.experiment == "fedlaw_table3_cifar10"]
    assert {r.setting["evaluation"]["proxy_holdout"] for r in runs} == {200}
    proxy_methods = [r for r in runs if r.setting["algorithm"] in ("fedlaw", "feddf", "fedbe", "serverft")]
    assert proxy_methods and all(r.setting[r.setting["algorithm"]]["proxy_size"] == 200 for r in proxy_methods)
    assert all(r.setting[r.setting["algorithm"]]["server_epochs"] == 20 for r in proxy_methods)
    teachers = [r for r in runs if r.setting["algorithm"] in ("feddf", "fedbe")]
    assert any(r.setting["model"] == "resnet20" for r in teachers)
    assert all(r.setting[r.setting["algorithm"]]["teacher_statistics"] == "code" for r in teachers)


def test_fednova_official_protocol_runs_the_launch_scripts_seeds():
    runs = _runs("fednova", True)
    assert {r.setting["seed"] for r in runs} == {1, 3}
    assert {r.experiment for r in runs} == {"fednova_table1_e2", "fednova_table1_u25"}


def test_fedaware_official_protocol_does_per_method_what_each_script_does():
    runs = _runs("fedaware", True)
    table = [r for r in runs if r.experiment == "fedaware_table2_cifar10"]
    by = {"+".join([r.setting["algorithm"], *r.setting["plugins"]]): r.setting for r in table}
    assert by["fedaware"]["cohort"] == {"warmup": "permutation", "assignment": "code"}
    assert by["fedavg"]["cohort"] == {"warmup": "permutation", "assignment": "code"}
    assert by["fedprox"]["cohort"] == {"warmup": "none", "assignment": "per_client"}
    assert by["fedprox"]["fedprox"]["mean"] == "uniform"
    assert by["feddyn"]["cohort"]["warmup"] == "none"
    aware = [name for name in by if "aware" in name.split("+")[1:] and not name.startswith("fedcm")]
    assert len(aware) == 5 and all(set(by[n]["plugins"]) == {"aware", *AGNOSTIC} for n in aware)
    assert by["fedcm+aware"]["plugins"] == ["aware"]  # FedCM is not in the code: the paper's protocol
    assert all(
        by[name]["random_epochs"] == {"low": 2, "high": 5} and by[name]["random_batch"] == {"low": 10} for name in aware
    )
    raw = [name for name in by if "+" not in name]
    assert all(not by[name]["plugins"] for name in raw)
    assert all(r.setting["cohort"]["assignment"] == "code" for r in runs if r.experiment.startswith("fedaware_fig"))


def test_ima_official_protocol_does_not_reseed_and_splits_cifar100_as_the_notebook():
    """IMA's code never reseeds per client (seed_torch reseeds only with test=True, which no call passes)."""
    params = paramsfile.load_params_files(
        [ROOT / "params" / "ima.yaml", ROOT / "params" / "subsets" / "ima_official_protocol.yaml"]
    )
    params["experiments"] = {
        name: params["experiments"][name] for name in ("ima_table1_fmnist", "ima_table1_cifar100_vgg")
    }
    runs = expansion.expand(params)
    assert runs and all(r.setting["client"]["shuffle"] == "fresh" for r in runs)
    # and partitions CIFAR-100 as its notebook does: FedLab's balanced inner Dirichlet(0.5), partition seed 1
    c100 = [r for r in runs if r.setting["dataset"] == "cifar100"]
    assert c100 and all(r.setting["partition"] == {"kind": "inner_dirichlet", "seed": 1, "alpha": 0.5} for r in c100)
