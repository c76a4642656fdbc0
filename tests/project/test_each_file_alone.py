"""scripts/test_each.py, the runner of `make test` and CI: each file in its own process, forked after the
third-party imports only, so a file that leans on another file's import of a fedrepro module still fails."""

from __future__ import annotations

import ast
import subprocess
import sys

from conftest import ROOT, subprocess_env

PASSES = "import fedrepro.data.cifar\n\n\ndef test_imports_what_it_uses():\n    assert fedrepro.data.cifar\n"
LEANS = "import fedrepro\n\n\ndef test_uses_a_submodule_it_does_not_import():\n    assert fedrepro.data.cifar\n"


def test_a_file_that_uses_a_module_it_does_not_import_fails_alone(tmp_path):
    (tmp_path / "test_passes.py").write_text(PASSES)
    (tmp_path / "test_leans.py").write_text(LEANS)
    files = [str(tmp_path / "test_passes.py"), str(tmp_path / "test_leans.py")]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "test_each.py"), *files],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"ok   {files[0]}" in proc.stdout
    assert f"FAIL {files[1]}" in proc.stdout
    assert "has no attribute 'data'" in proc.stdout
    assert "1 of 2 test files fail alone" in proc.stdout


def test_the_runner_imports_no_fedrepro_module_before_forking():
    import importlib.util

    spec = importlib.util.spec_from_file_location("test_each", ROOT / "scripts" / "test_each.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.WARM_IMPORTS and not [m for m in module.WARM_IMPORTS if m.split(".")[0] in ("fedrepro", "conftest")]


def test_no_test_file_imports_another():
    """A helper two files share lives in conftest.py: a file importing another test file runs that file's
    module-level code and binds the two files' folders together."""
    files = sorted((ROOT / "tests").rglob("test_*.py"))
    stems = {p.stem for p in files}
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in stems]
    assert len(files) > 50 and not found, found
