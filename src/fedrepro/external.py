"""Methods from outside fedrepro: a module of the user's own package, found before any job starts.

A method or plug-in outside fedrepro is what a built-in one is, a module and its settings fragment:

    mypkg/trimmed.py     API_VERSION = 1; build(setting, ctx) -> fedrepro.api.Algorithm   (a plug-in: apply)
    mypkg/trimmed.yaml   kind, schema, requires, refuses, tune: as algorithms/<name>.yaml (package data),
                         or FRAGMENT = {...}, a literal dict in the module itself

A setting names it by its entry point (``[project.entry-points."fedrepro.methods"] trimmed = "mypkg.trimmed"``)
or by its module path (``algorithm: mypkg.trimmed``). It is read here without being imported: its syntax tree
is checked against the method API (``check``) and hashed into its runs' ids (fedrepro.identity), its fragment
joins the registry's, and its package's name and version go into its runs' summaries. Light by design (the
standard library and YAML), as identity and the registry that use it.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from fedrepro.errors import FedreproError

API_VERSION = 1  # the method API's version (docs/methods.md): a method module declares the one it was written for
GROUP = "fedrepro.methods"  # the entry-point group methods are found by
FRAGMENT_KEYS = {"kind", "schema", "requires", "refuses", "fork", "tune", "doc"}
ENTRY = {
    "algorithm": ("build", 2, "build(setting, ctx) returning a fedrepro.api.Algorithm"),
    "plugin": ("apply", 3, "apply(algorithm, setting, ctx) changing the host's Algorithm"),
}
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


class MethodError(FedreproError, ValueError):
    """An outside method that cannot run: not found, or not written to the method API. One line, naming what."""


@dataclass(frozen=True)
class Method:
    name: str  # as a setting names it: the entry point's name or the module path
    module: str  # the module's dotted path
    file: Path  # its source
    fragment: dict  # its settings fragment
    package: str | None  # the distribution that installs it (None: a module on the path, installed by none)
    version: str | None

    @property
    def kind(self) -> str:
        return self.fragment["kind"]

    @property
    def where(self) -> str:
        installed = f", {self.package} {self.version}" if self.package else ""
        return f"method '{self.name}' (module {self.module}{installed})"


def entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """The installed methods by name: the ``fedrepro.methods`` entry points of every distribution."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUP)}


def is_builtin(name: str) -> bool:
    return (Path(__file__).resolve().parent / "algorithms" / f"{name}.py").is_file()


def find(name: str) -> Method | None:
    """The outside method a setting names (an entry point, else a dotted module path), checked against the API;
    None when the name is neither (a built-in name, or unknown: the registry then says which names exist)."""
    if is_builtin(name):
        return None
    points = entry_points()
    if name in points:
        if points[name].attr:
            raise MethodError(
                f"entry point '{name}' = '{points[name].value}' in group {GROUP}: name a module "
                f"(mypkg.mymethod), not an object in it"
            )
        return _found(name, points[name].module, points[name].dist)
    if _MODULE.fullmatch(name):
        return _found(name, name, None)
    return None


def _found(name: str, module: str, dist) -> Method:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as err:
        raise MethodError(
            f"method '{name}': module {module} cannot be found ({err}); is its package installed?"
        ) from None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise MethodError(
            f"method '{name}': no module {module} with Python source (is its package installed, or "
            f"its folder on PYTHONPATH?)"
        )
    file = Path(spec.origin).resolve()
    package, version = (dist.name, dist.version) if dist is not None else _distribution(module)
    beside = file.with_suffix(".yaml")
    stamps = (file.stat().st_mtime_ns, beside.stat().st_mtime_ns if beside.is_file() else None)
    return _checked(name, module, str(file), stamps, package, version)


def _distribution(module: str) -> tuple[str | None, str | None]:
    names = importlib.metadata.packages_distributions().get(module.split(".")[0], [])
    if not names:
        return None, None
    return names[0], importlib.metadata.version(names[0])


@functools.lru_cache(maxsize=64)
def _checked(name: str, module: str, file: str, stamps: tuple, package, version) -> Method:
    """Cached on the module's and its fragment's stamps: an edit is seen."""
    tree = ast.parse(Path(file).read_text(), filename=file)
    method = Method(name, module, Path(file), {}, package, version)
    fragment = _fragment(method, tree)
    method = Method(name, module, Path(file), fragment, package, version)
    problems = check(tree, fragment)
    if problems:
        raise MethodError(
            f"{method.where} does not meet the method API {API_VERSION}: {'; '.join(problems)} (docs/methods.md)"
        )
    return method


def _fragment(method: Method, tree: ast.Module) -> dict:
    """``<module>.yaml`` beside the module, else its literal ``FRAGMENT`` dict."""
    beside = method.file.with_suffix(".yaml")
    if beside.is_file():
        fragment = yaml.safe_load(beside.read_text()) or {}
    else:
        literal = _assigned(tree).get("FRAGMENT")
        if literal is None:
            raise MethodError(
                f"{method.where}: no settings fragment: put {beside.name} beside {method.file.name} "
                f"(package data) or a FRAGMENT = {{...}} dict in it"
            )
        try:
            fragment = ast.literal_eval(literal)
        except ValueError:
            raise MethodError(f"{method.where}: FRAGMENT must be a literal dict (no names, no calls)") from None
    if not isinstance(fragment, dict):
        raise MethodError(f"{method.where}: its fragment is a mapping, not {type(fragment).__name__}")
    return fragment


def _assigned(tree: ast.Module) -> dict[str, ast.expr]:
    """The module's top-level ``NAME = value`` statements."""
    return {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def check(tree: ast.Module, fragment: dict) -> list[str]:
    """What a method module and its fragment lack against the method API, each in a few words (none: it meets it)."""
    problems = []
    unknown = sorted(set(fragment) - FRAGMENT_KEYS)
    if unknown:
        problems.append(f"fragment key(s) {', '.join(unknown)} unknown (allowed: {', '.join(sorted(FRAGMENT_KEYS))})")
    kind = fragment.get("kind")
    if kind not in ENTRY:
        return problems + [f"fragment kind must be algorithm or plugin, not {kind!r}"]
    version = _assigned(tree).get("API_VERSION")
    if not (isinstance(version, ast.Constant) and version.value == API_VERSION):
        found = ast.literal_eval(version) if isinstance(version, ast.Constant) else None
        problems.append(
            f"API_VERSION = {API_VERSION} missing"
            if found is None
            else f"API_VERSION = {found!r}, this fedrepro serves {API_VERSION}"
        )
    function, arity, what = ENTRY[kind]
    defined = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    if function not in defined:
        problems.append(f"no {what}")
    elif len(defined[function].args.args) != arity:
        problems.append(
            f"{function} takes {len(defined[function].args.args)} argument(s), the API passes {arity}: {what}"
        )
    for section, sub in (fragment.get("schema") or {}).items():
        if not isinstance(sub, dict) or sub.get("type") != "object" or "default" not in sub:
            problems.append(f"schema section '{section}' must be {{type: object, default: {{}}, properties: ...}}")
    return problems


def imported_modules(method: Method) -> list[str]:
    """The absolute dotted names the method's module imports (relative imports resolved against its package)."""
    tree = ast.parse(method.file.read_text(), filename=str(method.file))
    package = method.module.rsplit(".", 1)[0].split(".")
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = (
                ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                if node.level
                else node.module or ""
            )
            names.extend([base, *(f"{base}.{alias.name}" for alias in node.names)])
    return names


def provenance(names: list[str]) -> dict:
    """What a summary records of the outside methods a run executes: module, package and version; {} for none."""
    found = {name: find(name) for name in names}
    packages = {
        name: {"module": m.module, "package": m.package, "version": m.version}
        for name, m in found.items()
        if m is not None
    }
    return {"method_packages": packages} if packages else {}
