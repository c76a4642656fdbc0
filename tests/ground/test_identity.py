"""A run's code hash covers the files its training imports, found by reading imports, not from lists."""

import importlib
import os
import re
import shutil
import textwrap

import pytest

from fedrepro import identity


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A small package named like ours, so that ``from fedrepro...`` imports resolve inside it."""
    root = tmp_path / "fedrepro"
    files = {
        "__init__.py": "",
        "run/__init__.py": "",
        "run/trainer.py": "from fedrepro import algorithms, data\nfrom fedrepro.flat import Flat\n"
        "from fedrepro.run.provenance import run_provenance\n",
        "run/process.py": "import os\n",
        "run/jobs.py": "from fedrepro.run.trainer import Trainer\nfrom fedrepro.run import process\n",
        "run/provenance.py": "from fedrepro import __version__\n",
        "data.py": "import numpy\n\ndef load():\n    from . import vision  # lazy: still followed\n",
        "vision.py": "",
        "flat.py": "",
        "algorithms/__init__.py": "import importlib\n",
        "algorithms/fedavg.py": "from fedrepro.server import Mean\n",
        "algorithms/fedlaw.py": "from .proxy import ProxyTraining\n",
        "algorithms/proxy.py": "from ..server import Mean\n",
        "server.py": "",
        "configure/registry.py": "",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    monkeypatch.setattr(identity, "PACKAGE", root)
    return root


def test_closure_follows_absolute_relative_and_lazy_imports(package):
    assert identity.code_closure(
        (identity.RUN_ENTRY,) + identity.method_modules("fedlaw", []), identity.OUTSIDE_RUNS
    ) == [
        "__init__.py",
        "algorithms/__init__.py",
        "algorithms/fedlaw.py",
        "algorithms/proxy.py",
        "data.py",
        "flat.py",
        "run/__init__.py",
        "run/jobs.py",
        "run/process.py",
        "run/trainer.py",
        "server.py",
        "vision.py",
    ]
    # fedavg does not import the proxy module: editing it must not rerun FedAvg
    assert "algorithms/proxy.py" not in identity.code_closure(
        (identity.RUN_ENTRY,) + identity.method_modules("fedavg", [])
    )


def test_an_added_import_is_seen_without_editing_any_list(package):
    entries = (identity.RUN_ENTRY,) + identity.method_modules("fedavg", [])
    before = identity.files_hash(identity.code_closure(entries))
    assert "configure/registry.py" not in identity.code_closure(entries)
    method = package / "algorithms" / "fedavg.py"
    method.write_text(method.read_text() + "from fedrepro.configure import registry\n")
    os.utime(method, ns=(1, 1))  # a new stamp even on file systems with coarse mtimes
    assert "configure/registry.py" in identity.code_closure(entries)
    assert identity.files_hash(identity.code_closure(entries)) != before


def test_a_named_file_that_does_not_exist_is_an_error(package):
    with pytest.raises(FileNotFoundError, match="nosuchmethod"):
        identity.code_closure(identity.method_modules("nosuchmethod", []))


def test_a_family_package_dispatch_is_not_followed(package):
    """data/__init__.py imports every dataset family to look them up by name; a run follows only its own."""
    (package / "data.py").unlink()
    for name, text in {
        "data/__init__.py": "from fedrepro.data import fmnist, cifar\nfrom fedrepro.data.base import gather\n",
        "data/base.py": "",
        "data/fmnist.py": "from fedrepro.data.base import gather\n",
        "data/cifar.py": "import tarfile\n",
    }.items():
        (package / name).parent.mkdir(exist_ok=True)
        (package / name).write_text(text)
    files = identity.code_closure(("data/__init__.py", "data/fmnist.py"))
    assert {"data/__init__.py", "data/fmnist.py", "data/base.py"} <= set(files)
    assert "data/cifar.py" not in files


SETTINGS = [
    {"algorithm": "fedavg", "plugins": [], "dataset": "fmnist", "model": "mlp"},
    {"algorithm": "fedlaw", "plugins": [], "dataset": "cifar10", "model": "resnet20"},
    {"algorithm": "fedbe", "plugins": [], "dataset": "fmnist", "model": "lenet5"},
    {"algorithm": "fednova", "plugins": ["ima", "aware"], "dataset": "synthetic_1_1", "model": "logreg"},
]


def test_the_real_runs_depend_on_training_code_only():
    """Validation, reporting, tracking and provenance code may change without rerunning anything."""
    for setting in SETTINGS:
        files = set(identity.run_code(setting))
        assert {identity.RUN_ENTRY, "parts.py", f"algorithms/{setting['algorithm']}.py"} <= files
        assert {"run/trainer.py", "run/client.py", "run/batched.py", "run/observers.py", "schedule.py"} <= files
        assert {
            f"data/{identity.DATASETS[setting['dataset']]['family']}.py",
            f"models/{identity.MODELS[setting['model']]['family']}.py",
        } <= files
        assert (
            not {
                "configure/registry.py",
                "configure/expansion.py",
                "report/page.py",
                "tracking/live.py",
                "cli/__init__.py",
                "cli/run.py",
                "ops/plan.py",
                "run/provenance.py",
                "run/rundir.py",
                "identity.py",
                "partitions/records.py",
                "report/verification.py",
                "report/evidence.py",
                "ops/bench.py",
                "catalog.py",
                "run/hessian.py",
            }
            & files
        )
        others = {f"data/{d['family']}.py" for d in identity.DATASETS.values()} | {
            f"models/{m['family']}.py" for m in identity.MODELS.values()
        }
        used = {*identity.family_modules(setting["dataset"], setting["model"])}
        assert not (others - used) & files, "another dataset's or model's module is in the run's code"
    assert {"algorithms/proxy.py", "algorithms/feddf.py"} <= set(identity.run_code(SETTINGS[2]))
    code = set(identity.partition_code("fmnist", "dirichlet"))
    assert {
        "partitions/__init__.py",
        "partitions/base.py",
        "partitions/dirichlet.py",
        "data/__init__.py",
        "data/fmnist.py",
    } <= code
    assert not {"data/cifar.py", "partitions/iid.py", "partitions/shards.py", "partitions/records.py"} & code
    # a kind's code covers the helpers it uses: hybrid draws with the Dirichlet kind's draw
    assert "partitions/dirichlet.py" in identity.partition_code("fmnist", "hybrid")


MEMBERS_NOT_FAMILIES = {"__init__", "base", "domains", "records"}  # dispatch and shared helpers


@pytest.mark.parametrize("folder", ["data", "models", "partitions"])
def test_every_family_module_has_its_fragment_and_every_fragment_its_module(folder):
    """A dataset family, model family or partition kind is two files side by side, found by the catalog."""
    modules = {p.stem for p in (identity.PACKAGE / folder).glob("*.py")} - MEMBERS_NOT_FAMILIES
    fragments = {p.stem for p in (identity.PACKAGE / folder).glob("*.yaml")}
    assert modules == fragments
    declared = {
        "data": {d["family"] for d in identity.DATASETS.values()},
        "models": {m["family"] for m in identity.MODELS.values()},
        "partitions": set(identity.PARTITION_KINDS),
    }[folder]
    assert declared == modules


def test_a_family_serves_the_datasets_and_builds_the_models_its_fragment_declares():
    from fedrepro import data, models

    for dataset, facts in identity.DATASETS.items():
        assert data.family(dataset).__name__ == f"fedrepro.data.{facts['family']}", dataset
    for family in {m["family"] for m in identity.MODELS.values()}:
        module = importlib.import_module(f"{models.__name__}.{family}")
        assert set(module.BUILDERS) == {m for m, facts in identity.MODELS.items() if facts["family"] == family}, family


@pytest.fixture
def real_copy(tmp_path, monkeypatch):
    """A copy of the package that a test may edit, hashed as the package itself."""
    root = tmp_path / "fedrepro"
    shutil.copytree(identity.PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(identity, "PACKAGE", root)
    return root


def _hashes(settings=SETTINGS) -> list[str]:
    return [identity.code_hash(s["algorithm"], s["plugins"], s["dataset"], s["model"]) for s in settings]


def _edit(path, change) -> None:
    path.write_text(change(path.read_text()))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def _reformatted(text: str) -> str:
    """The same code with a comment before every return, a reworded docstring and more blank lines."""
    text = re.sub(r"^( +)return ", r"\1# why\n\1return  ", text, flags=re.M)
    return "# a comment\n" + text.replace('"""', '"""Reworded: ', 1).replace("\n\n", "\n\n\n") + "\n# trailing\n"


def test_comments_docstrings_and_blank_lines_rename_no_run(real_copy):
    before = _hashes()
    for setting in SETTINGS:
        for name in identity.run_code(setting):
            _edit(real_copy / name, _reformatted)
    assert _hashes() == before


def test_an_edit_of_another_method_dataset_or_model_renames_no_run(real_copy):
    fedavg = SETTINGS[0]
    before = _hashes([fedavg])
    for name in ("algorithms/fedprox.py", "data/cifar.py", "models/resnet.py", "run/provenance.py", "report/page.py"):
        _edit(real_copy / name, lambda text: text + "\nCHANGED = 1\n")
    assert _hashes([fedavg]) == before
    _edit(real_copy / "models" / "mlp.py", lambda text: text + "\nCHANGED = 1\n")
    assert _hashes([fedavg]) != before


def test_an_arithmetic_edit_in_the_trainer_renames_every_run(real_copy):
    before = _hashes()
    _edit(real_copy / "run" / "rows.py", lambda text: text.replace("LAST_ROUNDS = 10", "LAST_ROUNDS = 11"))
    assert all(a != b for a, b in zip(_hashes(), before))
    before = _hashes()
    _edit(
        real_copy / "run" / "trainer.py",
        lambda text: text.replace("torch.sub(x, self.model.flat", "torch.sub(self.model.flat, x"),
    )
    assert all(a != b for a, b in zip(_hashes(), before))


def test_a_partition_code_edit_renames_its_partitions_and_their_runs(real_copy):
    from fedrepro import identity
    from fedrepro.configure import settings

    setting = settings.resolve({"dataset": "fmnist", "model": "mlp"})
    partition, run = identity.partition_id(setting), identity.run_id(setting)
    _edit(
        real_copy / "partitions" / "dirichlet.py",
        lambda text: text.replace("DIRICHLET_SECONDS = 10.0", "DIRICHLET_SECONDS = 11.0"),
    )
    assert identity.partition_id(setting) != partition and identity.run_id(setting) != run
    partition, run = identity.partition_id(setting), identity.run_id(setting)
    for other in ("shards.py", "iid.py", "pachinko.py", "records.py"):  # another kind's module; the folder's writer
        _edit(real_copy / "partitions" / other, lambda text: text + "\nCHANGED = 1\n")
    assert (identity.partition_id(setting), identity.run_id(setting)) == (partition, run)


def test_a_run_hashes_its_own_dataset_and_model_facts_and_no_other(monkeypatch):
    """An edit to another entry of a fragment, or to a fact that only describes, renames no run."""
    from fedrepro import catalog
    from fedrepro.configure import settings

    setting = settings.resolve({"dataset": "fmnist", "model": "mlp"})
    run, partition = identity.run_id(setting), identity.partition_id(setting)
    monkeypatch.setitem(catalog.DATASETS["cifar10"], "num_classes", 11)  # another dataset of another family
    monkeypatch.setitem(catalog.MODELS["logreg"], "datasets", ["fmnist"])  # another model of the same family
    for descriptive in ("doc", "params", "rough_step_seconds"):
        monkeypatch.setitem(catalog.MODELS["mlp"], descriptive, "changed")
    monkeypatch.setitem(catalog.DATASETS["fmnist"], "doc", "changed")
    assert (identity.run_id(setting), identity.partition_id(setting)) == (run, partition)
    monkeypatch.setitem(catalog.MODELS["mlp"], "feature_classifier", True)  # a fact training reads
    assert identity.run_id(setting) != run and identity.partition_id(setting) == partition
    monkeypatch.setitem(catalog.DATASETS["fmnist"], "num_classes", 11)
    assert identity.partition_id(setting) != partition


def test_a_partition_kinds_readable_name_is_its_fragments():
    from fedrepro.configure import settings

    names = {
        "dirichlet": "dir0.5",
        "iid": "iid",
        "hybrid": "hyb10-0.5",
        "shards": "shards2",
        "inner_dirichlet": "idir0.5",
        "label_quantity": "labels2",
        "pachinko": "pa0.5b10",
    }
    for kind, name in names.items():
        dataset, model = ("cifar100", "cnn") if kind == "pachinko" else ("fmnist", "mlp")  # coarse labels
        setting = settings.resolve({"dataset": dataset, "model": model, "partition": {"kind": kind}})
        assert identity.partition_id(setting).startswith(f"{dataset}-{name}-n"), kind
    setting = settings.resolve({"dataset": "fmnist", "model": "mlp", "partition": {"long_tail_rho": 5}})
    assert identity.partition_id(setting).startswith("fmnist-dir0.5-lt5-n")


# What a module outside the run hash may import: other such modules, plain data (no code that computes), and
# the partitions' shared code, which every partition id hashes (and every run id its partition's id).
# plain: the fragments, the errors, and where an outside method lives (it reads files, computes nothing of a run)
PLAIN = {"__init__.py", "catalog.py", "errors.py", "external.py"}
PARTITION_GROUND = {"partitions/__init__.py", "partitions/base.py"}


@pytest.mark.parametrize("module", sorted(identity.OUTSIDE_RUNS))
def test_a_module_outside_the_run_hash_imports_no_code_that_computes(module):
    """Leaving a module out of the hash is safe only while it cannot bring code that computes with it."""
    assert identity._imports(module, *identity._stamp(module)) <= PLAIN | identity.OUTSIDE_RUNS | PARTITION_GROUND


def test_every_partition_id_hashes_the_partitions_shared_code():
    kinds = [
        p.stem for p in (identity.PACKAGE / "partitions").glob("*.py") if p.stem not in ("__init__", "base", "records")
    ]
    assert len(kinds) >= 9
    for kind in kinds:
        assert PARTITION_GROUND <= set(identity.partition_code("cifar10", kind)), kind


def test_a_fact_only_validation_reads_renames_no_run_and_one_training_reads_does(monkeypatch):
    """Adding a dataset to a model's list (or changing a split size) renames no run; an input shape does."""
    from fedrepro.configure import settings

    setting = settings.resolve({"algorithm": "fedavg"})
    before, partition = identity.run_id(setting), identity.partition_id(setting)
    monkeypatch.setitem(identity.MODELS["mlp"], "datasets", [*identity.MODELS["mlp"]["datasets"], "cifar10"])
    monkeypatch.setitem(identity.DATASETS["fmnist"], "models", ["cnn"])
    monkeypatch.setitem(identity.DATASETS["fmnist"], "train_size", 60001)
    assert (identity.run_id(setting), identity.partition_id(setting)) == (before, partition)
    monkeypatch.setitem(identity.DATASETS["fmnist"], "shape", [1, 28, 29])
    assert identity.run_id(setting) != before


def test_the_optional_run_modules_and_the_catalog_are_code_only_where_executed(real_copy):
    """A run of device cpu without the Hessian executes neither the batched path nor the Hessian estimate;
    the catalog's reader is no run's code (the facts it reads are hashed as facts)."""
    from fedrepro.configure import settings

    plain = settings.resolve({"algorithm": "fedavg", "device": "cpu"})
    hessian = settings.resolve({"algorithm": "fedavg", "device": "cpu", "hessian": {"every": 5}})
    batched = settings.resolve({"algorithm": "fedavg"})  # device auto: batched on CUDA
    before = {k: identity.run_id(s) for k, s in (("plain", plain), ("hessian", hessian), ("batched", batched))}
    _edit(real_copy / "run" / "hessian.py", lambda text: text + "\nCHANGED = 1\n")
    _edit(real_copy / "catalog.py", lambda text: text + "\nCHANGED = 1\n")
    after = {k: identity.run_id(s) for k, s in (("plain", plain), ("hessian", hessian), ("batched", batched))}
    assert after["plain"] == before["plain"] and after["batched"] == before["batched"]
    assert after["hessian"] != before["hessian"]
    _edit(real_copy / "run" / "batched.py", lambda text: text + "\nCHANGED = 1\n")
    assert identity.run_id(plain) == before["plain"] and identity.run_id(batched) != before["batched"]
