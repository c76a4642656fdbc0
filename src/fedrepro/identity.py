"""What a run and a partition are: content hashes of their resolved settings and of the code they run.

Light by design (the standard library only): the Snakefile names thousands of runs before any job
starts. The code a run depends on is read from the imports of the files that run it, not from a
hand-kept list that goes stale when someone adds an import:

    run        engine.py + the method's module + each plug-in's module, and what they import
    partition  partition.py + data/__init__.py (the labels it splits), and what they import

Imports are followed inside the package only, including those inside functions; a module loaded by
name (``importlib.import_module``) is not followed, which is why the method's module is named here.
A record-only module (``RECORD_ONLY``) is left out: it says where a run came from, never what it computes.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import json
import math
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent
RUN_ENTRY = ("engine.py",)
PARTITION_ENTRY = ("partition.py", "data/__init__.py")
# What a run's summary records about its origin (commit, versions, machine) may grow a field without renaming
# and retraining every run. Such a module imports nothing of the package but its __init__ (a test holds it
# to that), so leaving it out cannot leave out code that computes.
RECORD_ONLY = frozenset({"provenance.py"})


def stable_hash(obj: Any, length: int = 10) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def cohort_size(setting: dict) -> int:
    return math.floor(setting["participation"] * setting["num_clients"] + 1e-9)


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
def _imports(name: str, mtime_ns: int, size: int) -> frozenset[str]:
    """The package files that file ``name`` imports (cached on its stamp, so edits are seen)."""
    tree = ast.parse((PACKAGE / name).read_text(), filename=name)
    here = [PACKAGE.name, *Path(name).parent.parts]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1]) + ("." + node.module if node.module else "") \
                if node.level else (node.module or "")
            # `from pkg import x` imports the module pkg.x when there is one, else the name x of pkg
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            file = _module_file(target)
            if file is not None:
                found.add(file)
                found.update(_package_inits(file))
    found.discard(name)
    return frozenset(found)


def _stamp(name: str) -> tuple[int, int]:
    stat = (PACKAGE / name).stat()
    return stat.st_mtime_ns, stat.st_size


def code_closure(entries: tuple[str, ...]) -> list[str]:
    """The package files that ``entries`` (paths relative to the package) run, their imports included."""
    seen: set[str] = set()
    todo = [e for entry in entries for e in (entry, *_package_inits(entry))]
    while todo:
        name = todo.pop()
        if name in seen or name in RECORD_ONLY:
            continue
        if not (PACKAGE / name).is_file():
            raise FileNotFoundError(f"{PACKAGE / name}: named as code a run depends on, but there is no such file")
        seen.add(name)
        todo.extend(_imports(name, *_stamp(name)) - seen)
    return sorted(seen)


def files_hash(names: list[str]) -> str:
    return _files_hash(tuple(names), tuple(_stamp(n) for n in names))


@functools.lru_cache(maxsize=512)
def _files_hash(names: tuple, stamps: tuple) -> str:
    # cached on (name, mtime, size): expanding a grid of a thousand runs reads each file once
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode())
        digest.update((PACKAGE / name).read_bytes())
    return digest.hexdigest()[:12]


def method_modules(algorithm: str, plugins: list[str]) -> tuple[str, ...]:
    return tuple(f"algorithms/{name}.py" for name in [algorithm, *plugins])


def code_hash(algorithm: str, plugins: list[str]) -> str:
    """Hash of every package file a run of this method (with these plug-ins) executes."""
    return files_hash(code_closure(RUN_ENTRY + method_modules(algorithm, plugins)))


def partition_code_hash() -> str:
    return files_hash(code_closure(PARTITION_ENTRY))


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


def identity_setting(setting: dict) -> dict:
    """The run setting as its identity (a file partition's path left out: its content hash stays)."""
    if setting["partition"].get("kind") != "file":
        return setting
    return {**setting, "partition": without_path(setting["partition"])}


def partition_id(setting: dict) -> str:
    part = setting["partition"]
    key = {**without_path(partition_setting(setting)), "code": partition_code_hash()}
    desc = {"file": f"file{part.get('sha256', '')[:8]}", "iid": "iid", "dirichlet": f"dir{_fmt(part.get('alpha', 0))}",
            "inner_dirichlet": f"idir{_fmt(part.get('alpha', 0))}",
            "hybrid": f"hyb{_fmt(part.get('alpha_balanced', 0))}-{_fmt(part.get('alpha', 0))}",
            "shards": f"shards{part.get('classes_per_client')}", "natural": "natural",
            "label_quantity": f"labels{part.get('classes_per_client')}",
            "pachinko": f"pa{_fmt(part.get('alpha', 0))}b{_fmt(part.get('beta', 0))}"}[part["kind"]]
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
    desc = partition_id(setting).rsplit("-", 2)[0]
    identity = {"setting": identity_setting(setting), "code": code_hash(setting["algorithm"], setting["plugins"])}
    return f"{algo}-{desc}-{setting['model']}-s{setting['seed']}-{stable_hash(identity)}"
