"""What a run and a partition are: content hashes of their resolved settings, of the code they run and of
the facts they read.

Light by design (the standard library and the YAML-only catalog): the Snakefile names thousands of runs before
any job starts. The code a run depends on is read from the imports of the files that run it, not from a
hand-kept list that goes stale when someone adds an import:

    run        the run wing from its entry (run/jobs.py; the batched and Hessian modules only where the setting
               can execute them) + the method's and plug-ins' modules + the run's dataset and model families,
               and what they import; the partition's code enters through the partition id
    partition  its kind's module (partitions/<kind>.py) + data/__init__.py (the labels it splits) + the
               dataset's family, and what they import (partitions/__init__.py, the shared helpers of base.py)

A family package (data/, models/, algorithms/, partitions/) dispatches to its members by name; where its
``__init__`` imports a member, that import is not followed. A run covers the members it uses (named above)
and what they import, so editing another method's, dataset's or model's module renames no run. Of the
fragments (fedrepro.catalog) a run hashes its own dataset's and model's facts that training reads, and a
partition its dataset's, so an edit to another entry, or to a fact that only describes or that only validation
reads (a doc, a model's datasets, a split size), renames none.

Code is hashed as its syntax tree without docstrings (``normalised``): comments, docstrings, blank lines
and formatting do not rename runs; a changed expression does. Modules that name, record or lay out files
(``OUTSIDE_RUNS``) are left out: they say where a run came from and where its files lie, never what it
computes (a test holds them to importing nothing that computes).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from fedrepro import catalog, external
from fedrepro.catalog import DATASETS, MODELS, PARTITION_KINDS, training_facts

PACKAGE = Path(__file__).resolve().parent
PARTITION_ENTRY = ("data/__init__.py",)
FAMILY_PACKAGES = ("data", "models", "algorithms", "partitions")
# Naming (this module), provenance, record files, the run folder's layout and the partition folder's: what a
# summary records about its origin may grow a field, and a helper may move, without renaming and retraining
# every run. A run's partition code enters through its partition id, which hashes the kind's own closure.
# The catalog reads the fragments into dicts: what training reads of them, its own dataset's and model's
# facts, a run hashes as facts (catalog.training_facts), so the reader is no part of it.
OUTSIDE_RUNS = frozenset(
    {"identity.py", "run/provenance.py", "records.py", "run/rundir.py", "partitions/records.py", "catalog.py"}
)
RUN_ENTRY = "run/jobs.py"  # what a training job executes: training a run and keeping a parent's fork state
# Modules of the run wing that a run executes only when its setting asks for them: the batched path (a round's
# clients as one computation, taken on CUDA, so never by a run of device: cpu unless its step_graph asks for the
# static-shape step), the static-shape step (step_graph static or compile) and the Hessian estimate
# (hessian.every > 0). Another run's name does not hash them, so an edit there renames only the runs that
# can execute them. Each entry: the files, and whether a setting can execute them.
OPTIONAL_RUN_CODE = {
    "batched": (
        ("run/batched.py", "run/batchable.py", "run/batched_draws.py"),
        lambda s: s.get("device") != "cpu" or _step_graph(s),
    ),
    "step_graph": (("run/static_step.py",), lambda s: _step_graph(s)),
    "hessian": (("run/hessian.py",), lambda s: bool(s.get("hessian", {}).get("every"))),
}


def _step_graph(setting: dict) -> bool:
    return setting.get("step_graph", "none") != "none"


def stable_hash(obj: Any, length: int = 10) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


# --------------------------------------------------------------------------- the code a run depends on


def _module_file(dotted: str) -> str | None:
    """``fedrepro.algorithms.proxy`` -> ``algorithms/proxy.py`` (or a package's ``__init__.py``)."""
    parts = dotted.split(".")
    if parts[0] != PACKAGE.name:
        return None
    rel = Path(*parts[1:]) if len(parts) > 1 else Path()
    if (PACKAGE / rel).with_suffix(".py").is_file() and len(parts) > 1:
        return str(rel.with_suffix(".py"))
    if (PACKAGE / rel / "__init__.py").is_file():
        return str(rel / "__init__.py")
    return None


def _package_inits(name: str) -> list[str]:
    """Importing ``a/b/c.py`` runs ``__init__.py``, ``a/__init__.py``, ``a/b/__init__.py`` first."""
    inits, folder = ["__init__.py"], Path(name).parent
    for depth in range(1, len(folder.parts) + 1):
        inits.append(str(Path(*folder.parts[:depth]) / "__init__.py"))
    return [i for i in inits if (PACKAGE / i).is_file()]


@functools.lru_cache(maxsize=1024)
def _named(name: str, mtime_ns: int, size: int) -> frozenset[str]:
    """The package files that file ``name`` names in its import statements, those inside functions too (cached on
    its stamp, so edits are seen); not the package inits Python runs first."""
    tree = ast.parse((PACKAGE / name).read_text(), filename=name)
    here = [PACKAGE.name, *Path(name).parent.parts]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (
                ".".join(here[: len(here) - node.level + 1]) + ("." + node.module if node.module else "")
                if node.level
                else (node.module or "")
            )
            # `from pkg import x`: the module pkg.x when there is one, else the name x of pkg
            targets = [f"{base}.{alias.name}" if _module_file(f"{base}.{alias.name}") else base for alias in node.names]
        else:
            continue
        found.update(f for f in map(_module_file, targets) if f is not None)
    found.discard(name)
    return frozenset(found)


def named_imports(name: str) -> frozenset[str]:
    """The package files ``name`` imports by name (the import graph tests/project/test_import_rules.py checks)."""
    return _named(name, *_stamp(name))


@functools.lru_cache(maxsize=1024)
def _imports(name: str, mtime_ns: int, size: int) -> frozenset[str]:
    """The package files that importing file ``name`` runs: those it names and their package inits."""
    found = {init for file in _named(name, mtime_ns, size) for init in (file, *_package_inits(file))}
    found.discard(name)
    return frozenset(found)


def _stamp(name: str) -> tuple[int, int]:
    stat = (PACKAGE / name).stat()
    return stat.st_mtime_ns, stat.st_size


def _dispatched(importer: str, imported: str) -> bool:
    """A family package's ``__init__`` importing one of its members: a dispatch table, not code every run runs."""
    package = Path(importer).parent
    return (
        str(package) in FAMILY_PACKAGES
        and Path(importer).name == "__init__.py"
        and Path(imported).parent == package
        and Path(imported).name != "__init__.py"
    )


def code_closure(entries: tuple[str, ...], outside: frozenset[str] = frozenset()) -> list[str]:
    """The package files that ``entries`` (paths relative to the package) run, their imports included;
    ``outside`` files are neither included nor followed (an entry is always included)."""
    seen: set[str] = set()
    todo = [e for entry in entries for e in (entry, *_package_inits(entry))]
    named = set(todo)
    while todo:
        name = todo.pop()
        if name in seen or (name in outside and name not in named):
            continue
        if not (PACKAGE / name).is_file():
            raise FileNotFoundError(f"{PACKAGE / name}: named as code a run depends on, but there is no such file")
        seen.add(name)
        todo.extend(i for i in _imports(name, *_stamp(name)) - seen if not _dispatched(name, i))
    return sorted(seen)


def files_hash(names: list[str]) -> str:
    return _files_hash(tuple(names), tuple(_stamp(n) for n in names))


@functools.lru_cache(maxsize=512)
def _files_hash(names: tuple, stamps: tuple) -> str:
    # cached on (name, mtime, size): expanding a grid of a thousand runs reads each file once
    digest = hashlib.sha256()
    for name, stamp in zip(names, stamps):
        digest.update(name.encode())
        digest.update(_normalised(name, *stamp).encode())
    return digest.hexdigest()[:12]


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


@functools.lru_cache(maxsize=1024)
def _normalised(name: str, mtime_ns: int, size: int) -> str:
    """The file's syntax tree without docstrings, positions, comments or formatting."""
    tree = ast.parse((PACKAGE / name).read_text(), filename=name)
    return ast.dump(_without_docstrings(tree), annotate_fields=False, include_attributes=False)


def normalised(name: str) -> str:
    return _normalised(name, *_stamp(name))


def method_modules(algorithm: str, plugins: list[str]) -> tuple[str, ...]:
    """The built-in methods' modules (an outside method's code is hashed by ``outside_code``)."""
    return tuple(f"algorithms/{name}.py" for name in [algorithm, *plugins] if external.find(name) is None)


def outside_code(names: list[str]) -> tuple[str | None, tuple[str, ...]]:
    """(the hash of the outside methods' own code, the package files it imports) for the methods ``names``
    that live outside fedrepro: each module and the modules of its own top-level package that it imports,
    normalised as the package's files are and named by module path (not by where it is installed)."""
    methods = [m for m in map(external.find, names) if m is not None]
    if not methods:
        return None, ()
    own: dict[str, Path] = {}
    ours: set[str] = set()
    todo = [(m.module, m) for m in methods]
    while todo:
        module, method = todo.pop()
        if module in own:
            continue
        own[module] = method.file
        for name in external.imported_modules(method):
            if _module_file(name):
                ours.add(_module_file(name))
            elif name.split(".")[0] == module.split(".")[0] and name not in own:
                try:
                    spec = importlib.util.find_spec(name)
                except (ImportError, ValueError):  # a name inside a module (`from pkg.mod import f`), not a module
                    spec = None
                if spec is not None and spec.origin and spec.origin.endswith(".py"):
                    todo.append((name, external.Method(name, name, Path(spec.origin), {}, None, None)))
    digest = hashlib.sha256()
    for module in sorted(own):
        digest.update(module.encode())
        tree = ast.parse(own[module].read_text(), filename=str(own[module]))
        digest.update(ast.dump(_without_docstrings(tree), annotate_fields=False, include_attributes=False).encode())
    return digest.hexdigest()[:12], tuple(sorted(ours))


def family_modules(dataset: str, model: str | None = None) -> tuple[str, ...]:
    """The members of the data and model packages a run of ``dataset`` (and ``model``) uses."""
    return (f"data/{DATASETS[dataset]['family']}.py",) + ((f"models/{MODELS[model]['family']}.py",) if model else ())


def run_code(setting: dict) -> list[str]:
    """The package files a run of this setting can execute (its partition's code: through its partition id):
    the run wing from its entry, the method's and plug-ins' modules, the dataset's and model's families, an
    outside method's imports of fedrepro, and what they import, the optional modules (``OPTIONAL_RUN_CODE``)
    only where the setting asks for them."""
    return code_closure(
        _entries(setting["algorithm"], setting["plugins"], setting["dataset"], setting["model"]),
        OUTSIDE_RUNS | unused_run_code(setting),
    )


def _entries(algorithm: str, plugins: list[str], dataset: str, model: str) -> tuple:
    return (
        (RUN_ENTRY,)
        + method_modules(algorithm, plugins)
        + family_modules(dataset, model)
        + tuple(outside_code([algorithm, *plugins])[1])
    )


def unused_run_code(setting: dict) -> frozenset[str]:
    return frozenset(f for files, used in OPTIONAL_RUN_CODE.values() if not used(setting) for f in files)


def code_hash(
    algorithm: str, plugins: list[str], dataset: str, model: str, unused: frozenset[str] = frozenset()
) -> str:
    """Hash of every package file a run of this method (with these plug-ins, data and model) executes, and of an
    outside method's own code; ``unused``: the optional modules it does not execute (unused_run_code)."""
    ours = files_hash(code_closure(_entries(algorithm, plugins, dataset, model), OUTSIDE_RUNS | unused))
    outside, _ = outside_code([algorithm, *plugins])
    return ours if outside is None else stable_hash({"fedrepro": ours, "outside": outside}, 12)


def run_code_hash(setting: dict) -> str:
    """The hash of the code a run of this setting executes (run_code)."""
    return code_hash(
        setting["algorithm"], setting["plugins"], setting["dataset"], setting["model"], unused_run_code(setting)
    )


def partition_code(dataset: str, kind: str) -> list[str]:
    """The package files a partition of this kind of this dataset executes."""
    return code_closure(PARTITION_ENTRY + (f"partitions/{kind}.py",) + family_modules(dataset), OUTSIDE_RUNS)


def partition_code_hash(dataset: str, kind: str) -> str:
    return files_hash(partition_code(dataset, kind))


# --------------------------------------------------------------------------- names


def _fmt(value: float) -> str:
    return f"{value:g}"


def partition_setting(setting: dict) -> dict:
    return {"dataset": setting["dataset"], "num_clients": setting["num_clients"], **setting["partition"]}


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file (kind ``file`` partitions), cached on its stamp so a grid reads it once."""
    stat = Path(path).stat()
    return _file_sha256(str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _file_sha256(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def without_path(part: dict) -> dict:
    """A partition setting as its identity: a file partition is its content hash, wherever the file lies."""
    return {k: v for k, v in part.items() if k != "path"} if part.get("kind") == "file" else part


def partition_identity(part: dict) -> dict:
    """A partition setting as its identity: a file partition is its content hash, wherever the file lies, and
    a long tail of rho 1 is the whole training set, as without the key."""
    part = without_path(part)
    return {k: v for k, v in part.items() if k != "long_tail_rho"} if part.get("long_tail_rho") == 1 else part


def identity_setting(setting: dict) -> dict:
    """The resolved run setting as its name hashes it: the values that cannot change what the run computes
    left out, so that adding an option (off by default) renames no run; a file partition's path left out (its
    content hash stays). The run trains with the whole setting (fedrepro.configure.settings.resolve)."""
    out = {**setting, "partition": partition_identity(setting["partition"])}
    neutral = {
        "hessian": not out.get("hessian", {}).get("every"),  # off
        "log_cohort_classes": not out.get("log_cohort_classes"),  # off
        "step_graph": not _step_graph(out),  # the batched path's step as it is
        "corruption": not out.get("corruption", {}).get("fraction"),  # no corrupted client
        "snapshots": not any(out.get("snapshots", {}).get(k) for k in ("rounds", "cosine_rounds")),  # none kept
        "preprocess": not DATASETS[out["dataset"]].get("preprocess"),  # only CIFAR has per-paper transforms
        "pretrained": not MODELS[out["model"]].get("pretrained"),  # only pretrained models read weights
        "batchnorm": not MODELS[out["model"]].get("batchnorm"),  # only BatchNorm models read it
    }
    out = {k: v for k, v in out.items() if not neutral.get(k)}
    for section, defaults in catalog.omitted_at_default().items():
        if section in out:
            out[section] = {k: v for k, v in out[section].items() if k not in defaults or v != defaults[k]}
    if "evaluation" in out and not out["evaluation"].get("validation"):  # scored on the test set
        out["evaluation"] = {k: v for k, v in out["evaluation"].items() if k != "validation"}
    return out


def partition_id(setting: dict) -> str:
    part = setting["partition"]
    key = {
        **partition_identity(partition_setting(setting)),
        "code": partition_code_hash(setting["dataset"], part["kind"]),
        "data": training_facts(DATASETS[setting["dataset"]]),
    }
    desc = PARTITION_KINDS[part["kind"]]["name"].format_map(part)  # the kind's readable name (its fragment)
    if part.get("long_tail_rho", 1) != 1:
        desc += f"-lt{_fmt(part['long_tail_rho'])}"
    return f"{setting['dataset']}-{desc}-n{setting['num_clients']}-{stable_hash(key, 8)}"


def run_id(setting: dict) -> str:
    """``<readable name>-<hash>``, the hash over the resolved setting and the code the run depends on.

    Both partitions and runs are content-addressed this way, so nothing upstream of a finished
    run is ever recomputed in place: a changed setting or an edited method is a new path. (Snakemake
    skips jobs downstream of an in-place rerun whose inputs are all ``ancient``, and the inputs must
    be ``ancient`` so that files restored by ``dvc pull`` with new mtimes rerun nothing.)"""
    algo = "+".join([setting["algorithm"], *setting["plugins"]])
    partition = partition_id(setting)
    desc = partition.rsplit("-", 2)[0]
    # the partition's id holds its code's hash: a changed split renames the runs that train on it
    identity = {
        "setting": identity_setting(setting),
        "partition": partition,
        "code": run_code_hash(setting),
        "facts": {
            "data": training_facts(DATASETS[setting["dataset"]]),
            "model": training_facts(MODELS[setting["model"]]),
        },
    }
    return f"{algo}-{desc}-{setting['model']}-s{setting['seed']}-{stable_hash(identity)}"
