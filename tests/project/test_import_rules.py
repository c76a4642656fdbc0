"""The package's import graph: no cycles, and no import that runs back up a layer.

Read from the source (imports inside functions included), not from what happens to be loaded. A package's
``__init__`` that dispatches to its members (data/, models/, algorithms/) is below nothing: a member reaching
back into it would make a cycle, which this test refuses."""

from __future__ import annotations

import pytest

from fedrepro import identity

PACKAGE = identity.PACKAGE

# The layers, top first: a module may import its own layer's modules and those of the layers below it.
LAYERS = {
    "command line": {"cli/*", "__main__.py"},
    "reports": {"report/*"},
    "tracking": {"tracking/*"},
    "operations": {"ops/*", "parity/*"},  # parity: drives the authors' code beside ours; no run imports it
    "settings": {"configure/*"},
    # the run wing: never the settings (a job receives a resolved setting)
    "run": {"run/*"},
    "methods": {"algorithms/*", "api.py"},
    "inputs": {"data/*", "models/*", "partitions/*"},
    "ground": {
        "__init__.py",
        "parts.py",
        "server.py",
        "server_optim.py",
        "minnorm.py",
        "flat.py",
        "functional.py",
        "identity.py",
        "catalog.py",
        "errors.py",
        "external.py",
        "records.py",
        "streams.py",
        "metrics.py",
        "evaluation.py",
        "schedule.py",
    },
}


def _layer(name: str) -> str:
    for layer, members in LAYERS.items():
        if name in members or any(m.endswith("/*") and name.startswith(m[:-1]) for m in members):
            return layer
    raise AssertionError(f"{name}: in no layer of tests/project/test_import_rules.py; place it in one")


def graph() -> dict[str, set[str]]:
    """Each module's imports by name (identity.named_imports: imports inside functions too, not the package inits
    Python runs first, so a member importing its package's base module is no cycle through the package)."""
    return {
        str(p.relative_to(PACKAGE)): set(identity.named_imports(str(p.relative_to(PACKAGE))))
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle():
    assert cycles(graph()) == []


def test_no_import_runs_back_up_a_layer():
    order = list(LAYERS)
    upward = [
        f"{a} ({_layer(a)}) imports {b} ({_layer(b)})"
        for a, targets in graph().items()
        for b in targets
        if order.index(_layer(b)) < order.index(_layer(a))
    ]
    assert upward == []


def test_the_checks_see_a_cycle_and_an_upward_import():
    assert cycles({"a.py": {"b.py"}, "b.py": {"c.py"}, "c.py": {"a.py"}, "d.py": {"a.py"}}) == [
        ["a.py", "b.py", "c.py"]
    ]
    assert "configure/settings.py" in identity.named_imports("configure/tuning.py")
    assert "parts.py" in identity.named_imports("algorithms/ima.py")
    assert _layer("algorithms/fedavg.py") == "methods" and _layer("run/trainer.py") == "run"


def test_the_settings_wing_imports_no_torch():
    """What a run is, before any job, is known without torch: the Snakefile and `fedrepro expand` load it all."""
    import subprocess
    import sys

    modules = sorted(p.stem for p in (PACKAGE / "configure").glob("*.py") if p.stem != "__init__")
    code = (
        f"import sys, importlib\nfor m in {modules!r}:\n    importlib.import_module('fedrepro.configure.' + m)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:1] or 'NO TORCH')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(PACKAGE.parent)},
    )
    assert len(modules) > 5 and out.stdout.strip().splitlines()[-1] == "NO TORCH", out.stdout + out.stderr


@pytest.mark.parametrize("name", ["--version", "expand"])
def test_the_command_line_imports_no_torch_to_answer(name, tmp_path):
    """`fedrepro --version` and expanding a params file answer without loading torch (seconds and memory)."""
    import subprocess
    import sys

    params = tmp_path / "p.yaml"
    params.write_text("experiments:\n  a: {base: {num_clients: 4, rounds: 2}, grid: {seed: [1]}}\n")
    argv = ["--version"] if name == "--version" else ["expand", "--configfile", str(params)]
    # argparse's --version exits (status 0); any other status is a failed command, not an answer
    code = (
        "import sys; from fedrepro import cli\ntry:\n    cli.main(sys.argv[1:])\n    status = 0\n"
        "except SystemExit as done:\n    status = done.code or 0\n"
        "print('exit', status, 'TORCH' if 'torch' in sys.modules else 'NO TORCH')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(PACKAGE.parent)},
    )
    assert out.stdout.strip().splitlines()[-1] == "exit 0 NO TORCH", out.stdout + out.stderr


MAX_MODULE_LINES = 400  # a module a reader takes in at a glance; a longer one is split along its concepts


def test_no_module_is_over_400_lines():
    long = {
        str(p.relative_to(identity.PACKAGE)): n
        for p in identity.PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
