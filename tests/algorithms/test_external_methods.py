"""A method written outside fedrepro (examples/mymethod, pip-installed into a temporary folder): found by its
entry point or its module path, checked against the method API before any job, hashed into its runs' ids,
trained with its package recorded, put on a paper's tables with the paper's tuning budget, and compared in the
report with a stated paired test."""

from __future__ import annotations

import importlib
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ROOT, snakemake_cmd, subprocess_env, write_yaml
from fedrepro import external, identity
from fedrepro.configure import expansion, paramsfile, registry
from fedrepro.configure.schema import ConfigError
from fedrepro.configure.settings import resolve
from fedrepro.report import versus

EXAMPLE = ROOT / "examples" / "mymethod"
QUICK = {
    "dataset": "fmnist",
    "model": "mlp",
    "num_clients": 6,
    "participation": 0.5,
    "rounds": 2,
    "batch_size": 16,
    "device": "cpu",
}


def _forget(prefixes: tuple[str, ...]) -> None:
    """Drop what the registry admitted and Python imported of these outside modules (other tests see none)."""
    for name in [n for n, m in registry.OUTSIDE_MODULES.items() if m.startswith(prefixes)]:
        registry.OPTIONAL_SECTIONS.difference_update(registry.OUTSIDE.pop(name).get("schema") or {})
        registry.OUTSIDE_MODULES.pop(name)
        registry.ALGORITHMS.pop(name, None)
        registry.PLUGINS.pop(name, None)
    for alias in [n for n in registry.ALGORITHMS if n.startswith(prefixes)]:
        registry.ALGORITHMS.pop(alias)
    for module in [m for m in sys.modules if m.startswith(prefixes)]:
        del sys.modules[module]
    importlib.invalidate_caches()


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """examples/mymethod installed for real (pip, no dependencies, no build isolation) into a folder put on the
    path, so that importlib.metadata sees its entry point as it would in a virtual environment."""
    target = tmp_path_factory.mktemp("site")
    source = tmp_path_factory.mktemp("src") / "mymethod"
    shutil.copytree(EXAMPLE, source)  # pip builds in place: the project's folder stays clean
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    yield target
    sys.path.remove(str(target))
    _forget(("trimmedmean", "mymethod"))


@pytest.fixture
def on_path(tmp_path):
    """A folder on sys.path for method modules written by a test (named by module path)."""
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    sys.path.remove(str(tmp_path))
    _forget(tuple(p.name for p in tmp_path.iterdir() if p.is_dir()))


def test_found_by_its_entry_point_with_its_package_and_version(installed):
    assert external.entry_points()["trimmedmean"].value == "mymethod.trimmed"
    method = external.find("trimmedmean")
    assert (method.module, method.package, method.version, method.kind) == (
        "mymethod.trimmed",
        "mymethod",
        "0.1.0",
        "algorithm",
    )
    setting = resolve({**QUICK, "algorithm": "trimmedmean"})
    assert setting["trimmedmean"] == {"fraction": 0.1}  # the defaults of the fragment it ships as package data
    # named by its module path, the same module; a built-in run's setting has no section of it
    assert resolve({**QUICK, "algorithm": "mymethod.trimmed"})["trimmedmean"] == {"fraction": 0.1}
    assert "trimmedmean" not in resolve({**QUICK, "algorithm": "fedavg"})


def test_its_runs_are_named_by_its_own_code(installed):
    setting = resolve({**QUICK, "algorithm": "trimmedmean"})
    own, ours = identity.outside_code(["trimmedmean"])
    assert own is not None and "api.py" in ours  # what it imports of fedrepro is hashed as every run's code
    fedavg_like = identity.files_hash(identity.run_code(setting))
    assert identity.code_hash("trimmedmean", [], "fmnist", "mlp") != fedavg_like
    module = Path(installed) / "mymethod" / "trimmed.py"
    text, first = module.read_text(), identity.run_id(setting)
    try:
        module.write_text(text.replace("import torch\n", "import torch  # a comment renames nothing\n"))
        assert identity.run_id(setting) == first
        assert "ordered[cut : k - cut].mean(0)" in text  # the edit below must change the module
        module.write_text(text.replace("ordered[cut : k - cut].mean(0)", "ordered[cut : k - cut].median(0).values"))
        assert identity.run_id(setting) != first
    finally:
        module.write_text(text)
    assert identity.run_id(setting) == first


BROKEN = [
    ("no_build", lambda src: src.replace("def build(", "def make("), "no build(setting, ctx)"),
    (
        "old_api",
        lambda src: src.replace("API_VERSION = 1", "API_VERSION = 0"),
        "API_VERSION = 0, this fedrepro serves 1",
    ),
    ("no_version", lambda src: src.replace("API_VERSION = 1", ""), "API_VERSION = 1 missing"),
    ("arity", lambda src: src.replace("def build(setting, ctx", "def build(setting"), "build takes 1 argument"),
]


@pytest.mark.parametrize("name,breaks,says", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_method_not_written_to_the_api_is_refused_before_any_job_in_one_line(on_path, name, breaks, says):
    package = on_path / f"broken_{name}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "method.py").write_text(breaks((EXAMPLE / "mymethod" / "trimmed.py").read_text()))
    (package / "method.yaml").write_text(
        (EXAMPLE / "mymethod" / "trimmed.yaml").read_text().replace("trimmedmean", f"trimmed_{name}")
    )
    params = {"experiments": {"e": {"base": QUICK, "grid": {"algorithm": [f"broken_{name}.method"], "seed": [1]}}}}
    with pytest.raises(ConfigError) as err:
        expansion.expand(paramsfile.validate(params, "params.schema.yaml", "test.yaml"))
    message = str(err.value).splitlines()[0]
    assert says in message and f"broken_{name}.method" in message and "method API 1" in message, message


def test_a_method_without_a_fragment_or_with_a_taken_section_is_refused(on_path):
    package = on_path / "nofragment"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "m.py").write_text((EXAMPLE / "mymethod" / "trimmed.py").read_text())
    with pytest.raises(ConfigError, match=r"no settings fragment: put m.yaml beside m.py"):
        resolve({**QUICK, "algorithm": "nofragment.m"})
    (package / "m.py").write_text(
        (EXAMPLE / "mymethod" / "trimmed.py").read_text().replace("trimmedmean", "client")
        + "\nFRAGMENT = {'kind': 'algorithm', 'schema': {'client': {'type': 'object', "
        "'default': {}}}}\n"
    )
    with pytest.raises(ConfigError, match=r"section 'client' is one of fedrepro's already"):
        resolve({**QUICK, "algorithm": "nofragment.m"})


def _datasets(sizes):
    from fedrepro import data

    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (sum(sizes), 1, 28, 28), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, 10, (sum(sizes),), generator=gen)
    return data.TensorDataset(images, labels, 0.2860, 0.3530), data.TensorDataset(
        images[:50], labels[:50], 0.2860, 0.3530
    )


def test_it_trains_and_its_summary_records_its_package(installed, tmp_path):
    from fedrepro import models
    from fedrepro.run.trainer import Trainer

    setting = resolve({**QUICK, "algorithm": "trimmedmean", "trimmedmean": {"fraction": 0.34}})
    sizes = [20, 14, 17, 12, 15, 16]
    bounds = np.cumsum([0] + sizes)
    parts = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]
    trainer = Trainer(
        setting,
        tmp_path / "run",
        None,
        None,
        datasets=_datasets(sizes),
        parts=parts,
        module=models.build("mlp", "fmnist"),
    )
    summary = trainer.run(progress=False)
    assert summary["status"] == "finished"
    assert summary["method_packages"] == {
        "trimmedmean": {"module": "mymethod.trimmed", "package": "mymethod", "version": "0.1.0"}
    }
    # the code of its own module, beside the fedrepro files a CPU run of it executes
    assert summary["code_hash"] == identity.code_hash(
        "trimmedmean", [], "fmnist", "mlp", identity.unused_run_code(setting)
    )
    assert identity.outside_code(["trimmedmean"])[0] is not None
    assert [r["trimmed_per_side"] for r in trainer.rows] == [1, 1]  # its own part ran: 3 clients, 1 cut per side


def _tunings(path: str, **overlay) -> tuple[list, dict]:
    params = paramsfile.load_params(ROOT / path)
    params.update(overlay)
    tunings: dict = {}
    return expansion.expand(params, tunings), tunings


def _block_of(tunings: dict, method: str) -> dict:
    blocks = [t for t in tunings.values() if t["when"]["algorithm"] == method]
    assert blocks, f"no tuning of {method}"
    return blocks[0]


def test_add_method_puts_it_on_every_method_axis_with_the_papers_tuning_budget(installed):
    runs, tunings = _tunings("params/ima.yaml", add_method="trimmedmean", only="ima_table1_fmnist")
    ima = _block_of(tunings, "trimmedmean")
    # IMA tunes its baselines over 3 values at seed 101, without +ima: the method gets its first 3 candidates
    fedprox = _block_of(tunings, "fedprox")
    assert len(ima["grid"]["setting"]) == len(fedprox["grid"]["fedprox.mu"]) == 3
    assert (ima["seeds"], ima["without"], ima["criterion"]) == (
        fedprox["seeds"],
        fedprox["without"],
        fedprox["criterion"],
    )
    assert ima["grid"]["setting"] == [{"trimmedmean": {"fraction": f}} for f in (0.1, 0.2, 0.0)]
    _, tunings = _tunings("params/fedaware.yaml", add_method="trimmedmean", only="fedaware_table2_cifar10")
    aware = _block_of(tunings, "trimmedmean")
    assert len(aware["grid"]["setting"]) == 4 and aware["when"] == {"algorithm": "trimmedmean", "plugins": []}
    # the quick grid: on fmnist_quick's method axis (3 splits x 2 seeds), not on the one-method figures experiment
    runs, tunings = _tunings("params/default.yaml", add_method="trimmedmean")
    added = [r for r in runs if r.setting["algorithm"] == "trimmedmean"]
    assert {r.experiment for r in added} == {"fmnist_quick"} and len(added) == 6 and not tunings
    manifest = expansion.manifest(
        paramsfile.load_params(ROOT / "params/default.yaml") | {"add_method": "trimmedmean"}, runs, "default"
    )
    assert manifest["added_methods"] == ["trimmedmean"]
    runs, _ = _tunings("params/default.yaml", add_method="trimmedmean", add_method_to="fmnist_quick_figures")
    assert not [r for r in runs if r.setting["algorithm"] == "trimmedmean"]
    with pytest.raises(ConfigError, match="add_method_to: table9 matches no experiment"):
        _tunings("params/default.yaml", add_method="trimmedmean", add_method_to="table9")


def test_the_paired_test_and_the_profile_against_a_float64_oracle():
    from scipy import stats

    ours = {1: 71.0, 2: 74.5, 3: 70.25, 4: 73.0}
    theirs = {1: 69.5, 2: 72.0, 3: 70.0, 4: 71.25, 9: 80.0}  # seed 9 has no pair: left out
    d = [ours[s] - theirs[s] for s in (1, 2, 3, 4)]
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    p = 2 * stats.t.sf(abs(mean / (sd / 2)), 3)
    got = versus.paired(ours, theirs, lower=False)
    # the same float64 formula in another order: a few dozen roundings of 1.1e-16 each
    assert got["seeds"] == 4 and abs(got["mean_diff"] - mean) <= 1e-12 and abs(got["p"] - p) <= 1e-12 * p
    assert got["outcome"] == ("win" if p < versus.ALPHA else "tie") == "win"
    assert versus.paired(theirs, ours, lower=False)["outcome"] == "loss"
    assert versus.paired(ours, theirs, lower=True)["outcome"] == "loss"  # rounds to a target: fewer is better
    assert versus.paired({1: 70.0}, {1: 60.0}, lower=False)["outcome"] == "tie"  # one seed: no test
    gaps = versus.profile([{"a": 70.0, "b": 69.0, "c": 60.0}, {"a": 50.0, "b": 52.0}])
    assert gaps == {"a": [0.0, 2.0], "b": [0.0, 1.0], "c": [10.0]}
    assert [versus.within(gaps["a"], t) for t in (0.0, 1.9, 2.0)] == [0.5, 0.5, 1.0]


@pytest.mark.slow
def test_one_command_runs_it_on_the_quick_grid_and_the_report_compares_it(installed, tmp_path, fmnist_data):
    """snakemake --configfile params/default.yaml --config add_method=trimmedmean, on a few rounds of one split."""
    quick = paramsfile.read_yaml(ROOT / "params" / "default.yaml")
    exp = quick["experiments"]["fmnist_quick"]
    exp["base"].update({"rounds": 2, "device": "cpu"})
    exp["grid"] = {
        "algorithm": ["fedavg", "fednova"],
        "partition": [{"kind": "dirichlet", "alpha": 0.5}],
        "seed": [1, 2],
    }
    quick = {**quick, "experiments": {"fmnist_quick": exp}, "tracking": {"enabled": False}}
    quick.pop("figures")
    params = fmnist_data.params_file(write_yaml(tmp_path / "default.yaml", quick), tmp_path / "params")
    env = subprocess_env(fmnist=fmnist_data, PYTHONPATH=f"{ROOT / 'src'}:{installed}")
    work = tmp_path / "work"
    done = subprocess.run(
        snakemake_cmd(
            work,
            "--configfile",
            str(params),
            "--config",
            "add_method=trimmedmean",
            "--workflow-profile",
            str(ROOT / "workflow/profiles/ci"),
            "--cores",
            "2",
        ),
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in (work / "results" / "runs").glob("trimmedmean-*/summary.json")]
    assert len(summaries) == 2 and all(s["method_packages"]["trimmedmean"]["version"] == "0.1.0" for s in summaries)
    page = (work / "reports" / "default.html").read_text()
    assert "Your method against each table: trimmedmean" in page and versus.TEST in page
    assert "trimmedmean</b> vs fedavg" in page and "trimmedmean</b> vs fednova" in page
    assert "performance profile" in page
