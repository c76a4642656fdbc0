"""The reproducible environment: requirements.lock against pyproject.toml, the Makefile's install from it,
and the container recipes (docs/environment.md)."""

from __future__ import annotations

import re
import tomllib

from conftest import ROOT

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_entries(text: str) -> dict[str, dict]:
    """{normalised name: {version, hashes}} of a pip requirements file with hashes."""
    entries: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        match = PIN.match(line)
        if match:
            current = entries.setdefault(_name(match[1]), {"version": match[2], "hashes": 0})
        elif current is not None and line.strip().startswith("--hash=sha256:"):
            current["hashes"] += 1
        elif not line.startswith(" "):
            current = None
    return entries


def pyproject_pins(pyproject: dict) -> dict[str, str]:
    project = pyproject["project"]
    specs = project["dependencies"] + [s for extra in project["optional-dependencies"].values() for s in extra]
    pins = {}
    for spec in specs:
        name, version = spec.split("==")
        pins[_name(name)] = version.strip()
    return pins


def stale_pins(pins: dict[str, str], entries: dict[str, dict]) -> list[str]:
    """pyproject.toml's pins the lock lacks or holds at another version: `make lock` was not run."""
    return [
        f"{name}=={version} (lock: {entries[name]['version'] if name in entries else 'absent'})"
        for name, version in sorted(pins.items())
        if entries.get(name, {}).get("version") != version
    ]


def test_the_lock_holds_every_pin_of_pyproject_at_its_version_with_hashes():
    entries = lock_entries((ROOT / "requirements.lock").read_text())
    pins = pyproject_pins(tomllib.loads((ROOT / "pyproject.toml").read_text()))
    assert {"torch", "snakemake", "pytest", "pytest-xdist", "snakefmt"} <= set(pins)
    assert not stale_pins(pins, entries), "requirements.lock is stale: run `make lock`"
    assert len(entries) > len(pins)  # the dependencies' dependencies are pinned too
    assert not [n for n, e in entries.items() if not e["hashes"]], "every locked package needs its hashes"


def test_a_stale_lock_is_told():
    entries = lock_entries(
        "torch==2.15.0 \\\n    --hash=sha256:aa\n    # via fedrepro\npytest==9.1.0 \\\n    --hash=sha256:bb\n"
    )
    assert entries == {"torch": {"version": "2.15.0", "hashes": 1}, "pytest": {"version": "9.1.0", "hashes": 1}}
    assert stale_pins({"torch": "2.15.0", "pytest": "9.2.0", "snakefmt": "2.1.0"}, entries) == [
        "pytest==9.2.0 (lock: 9.1.0)",
        "snakefmt==2.1.0 (lock: absent)",
    ]


def test_make_setup_installs_from_the_lock_only():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("$(VENV)/.installed:") :].split("\n\n")[0]
    assert "pip install -q --require-hashes -r $(UV_LOCK)" in recipe  # the installer, by hash
    assert "uv pip install --python $(BIN)/python -q --compile-bytecode --require-hashes -r $(LOCK)" in recipe
    assert "--no-deps" in recipe and "-e ." in recipe
    assert "'.[test]'" not in recipe  # resolving again would bypass the lock


def test_the_installer_is_the_version_make_lock_uses():
    version = re.search(r"^UV_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), flags=re.MULTILINE).group(1)
    (entry,) = lock_entries((ROOT / "requirements-uv.lock").read_text()).items()
    assert entry[0] == "uv" and entry[1]["version"] == version and entry[1]["hashes"] >= 1


def _lint_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("lint_workflow", ROOT / "scripts" / "lint_workflow.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LINT_OUTPUT = """Lints for snakefile /x/workflow/rules/train.smk:
    * Mixed rules and functions in same snakefile.:
      Small one-liner functions used only once should be defined as lambda

Lints for rule download (line 6, /x/workflow/rules/data.smk):
    * Shell command directly uses variable FEDREPRO from outside of the rule:
      It is recommended to pass all files as input and output, and non-file
"""


def test_the_lint_check_fails_on_a_warning_the_snakefile_does_not_explain():
    lint = _lint_script()
    assert lint.unexplained(LINT_OUTPUT) == []
    other = LINT_OUTPUT.replace("variable FEDREPRO", "variable SOMETHING").replace("train.smk", "report.smk")
    assert lint.unexplained(other) == [
        "Lints for snakefile /x/workflow/rules/report.smk: Mixed rules and functions in same snakefile.",
        "Lints for rule download (line 6, /x/workflow/rules/data.smk): Shell command directly uses variable "
        "SOMETHING from outside of the rule",
    ]
    snakefile = (ROOT / "Snakefile").read_text()
    for variable in ("FEDREPRO", "TRACK_LIVE", "MIRRORS", "DATA_ROOT", "data_root", "paper_figures"):
        assert variable in snakefile[snakefile.index("`snakemake --lint` warnings left on purpose") :]


def test_ci_runs_the_format_and_lint_checks_before_the_tests():
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.index("make lint") < ci.index("make test")
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\nlint:") :].split("\n\n")[0]
    assert "snakefmt --check Snakefile workflow/rules/*.smk" in recipe and "scripts/lint_workflow.py" in recipe


def test_the_container_recipes_install_the_lock_with_its_hashes():
    for recipe in ("workflow/container/Dockerfile", "workflow/container/fedrepro.def"):
        text = (ROOT / recipe).read_text()
        assert "--require-hashes -r /opt/fedrepro/requirements.lock" in text, recipe
        assert "python:3.11" in text  # the interpreter the lock was made for
    assert 'container: "fedrepro.sif"' in (ROOT / "Snakefile").read_text()


def test_the_citation_file_has_cffs_required_keys_and_the_packages_version():
    import yaml

    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert {"cff-version", "message", "title", "authors"} <= set(citation)
    assert all("name" in a or "family-names" in a for a in citation["authors"])
    assert citation["version"] == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
