"""A run's code hash covers the files its training imports, found by reading imports, not from lists."""
import os
import textwrap

import pytest

from fedrepro import identity


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A small package named like ours, so that ``from fedrepro...`` imports resolve inside it."""
    root = tmp_path / "fedrepro"
    files = {
        "__init__.py": "",
        "engine.py": "from fedrepro import algorithms, data\nfrom fedrepro.flat import Flat\n"
                     "from fedrepro.provenance import run_provenance\n",
        "provenance.py": "from fedrepro import __version__\n",
        "data.py": "import numpy\n\ndef load():\n    from . import vision  # lazy: still followed\n",
        "vision.py": "",
        "flat.py": "",
        "algorithms/__init__.py": "import importlib\n",
        "algorithms/fedavg.py": "from fedrepro.server import Mean\n",
        "algorithms/fedlaw.py": "from .proxy import ProxyTraining\n",
        "algorithms/proxy.py": "from ..server import Mean\n",
        "server.py": "",
        "registry.py": "",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    monkeypatch.setattr(identity, "PACKAGE", root)
    return root


def test_closure_follows_absolute_relative_and_lazy_imports(package):
    assert identity.code_closure(identity.RUN_ENTRY + identity.method_modules("fedlaw", [])) == [
        "__init__.py", "algorithms/__init__.py", "algorithms/fedlaw.py", "algorithms/proxy.py", "data.py",
        "engine.py", "flat.py", "server.py", "vision.py"]
    # fedavg does not import the proxy module: editing it must not rerun FedAvg
    assert "algorithms/proxy.py" not in identity.code_closure(identity.RUN_ENTRY + identity.method_modules("fedavg", []))


def test_an_added_import_is_seen_without_editing_any_list(package):
    entries = identity.RUN_ENTRY + identity.method_modules("fedavg", [])
    before = identity.code_hash("fedavg", [])
    assert "registry.py" not in identity.code_closure(entries)
    method = package / "algorithms" / "fedavg.py"
    method.write_text(method.read_text() + "from fedrepro import registry\n")
    os.utime(method, ns=(1, 1))  # a new stamp even on file systems with coarse mtimes
    assert "registry.py" in identity.code_closure(entries)
    assert identity.code_hash("fedavg", []) != before


def test_a_named_file_that_does_not_exist_is_an_error(package):
    with pytest.raises(FileNotFoundError, match="nosuchmethod"):
        identity.code_hash("nosuchmethod", [])


def test_the_real_runs_depend_on_training_code_only():
    """Validation, reporting and tracking code may change without rerunning anything."""
    for algorithm, plugins in [("fedavg", []), ("fedlaw", []), ("fedbe", []), ("fednova", ["ima", "aware"])]:
        files = identity.code_closure(identity.RUN_ENTRY + identity.method_modules(algorithm, plugins))
        assert {"engine.py", "client.py", "parts.py", f"algorithms/{algorithm}.py"} <= set(files)
        assert not {"registry.py", "config.py", "report.py", "tracking.py", "cli.py", "plan.py"} & set(files)
    assert {"algorithms/proxy.py", "algorithms/feddf.py"} <= set(
        identity.code_closure(identity.RUN_ENTRY + identity.method_modules("fedbe", [])))
    assert {"partition.py", "data/__init__.py", "data/fmnist.py"} <= set(identity.code_closure(identity.PARTITION_ENTRY))


def test_a_record_only_module_is_left_out_so_a_new_record_renames_no_run(package):
    """Where a run came from (commit, versions, CPU) is recorded, not computed: editing it reruns nothing."""
    before = identity.code_hash("fedavg", [])
    assert "provenance.py" not in identity.code_closure(identity.RUN_ENTRY + identity.method_modules("fedavg", []))
    provenance = package / "provenance.py"
    provenance.write_text(provenance.read_text() + "CPU = 'recorded'\n")
    os.utime(provenance, ns=(2, 2))
    assert identity.code_hash("fedavg", []) == before
    engine = package / "engine.py"  # while an edit of code that computes still renames the run
    engine.write_text(engine.read_text() + "\n")
    os.utime(engine, ns=(3, 3))
    assert identity.code_hash("fedavg", []) != before


@pytest.mark.parametrize("module", sorted(identity.RECORD_ONLY))
def test_a_record_only_module_imports_no_code_that_computes(module):
    """Leaving a module out of the hash is safe only while it cannot bring code that computes with it."""
    assert identity._imports(module, *identity._stamp(module)) <= {"__init__.py"}
