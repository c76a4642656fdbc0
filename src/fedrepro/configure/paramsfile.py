"""Params files read: YAML's safe subset with no repeated key and no alias bomb, validated against the params
schema, merged as Snakemake merges several ``--configfile``; and the names and paths they give, refused when
unsafe."""

from __future__ import annotations

import copy
import functools
import os
import re
from pathlib import Path
from typing import Any

import yaml

from fedrepro.configure.schema import ConfigError, validate
from fedrepro.configure.settings import deep_merge

# the project's folder, under which params files, results and reports lie
ROOT = Path(__file__).resolve().parents[3]


# Names that become file names and reach shell commands: experiments (report figures), params files
# (reports, logs), runs. A safe set means no quoting mistake can turn one into a command or a path
# outside its folder.
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
SAFE_EXPERIMENT = re.compile(r"[A-Za-z0-9_]+")


def check_name(name: str, what: str, pattern: re.Pattern = SAFE_NAME) -> str:
    if not isinstance(name, str) or not pattern.fullmatch(name) or ".." in name:
        raise ConfigError(
            f"{what} {name!r} is not allowed: use letters, digits and "
            f"{'_' if pattern is SAFE_EXPERIMENT else '_ . + -'} only"
        )
    return name


def data_root(params: dict) -> str:
    """``data.root``, refused when it would put data outside the project without saying so: empty
    (``/fmnist`` at the file system root), or relative and climbing out with ``..``. An absolute path
    is the user's explicit choice. Braces would be read as Snakemake wildcards."""
    root = params.get("data", {}).get("root", "data")
    problem = None
    if not isinstance(root, str) or not root.strip():
        problem = "must name a folder (empty would write at the file system root)"
    elif any(c in root for c in "{}\n\r\0"):
        problem = "must not contain braces, newlines or NUL"
    elif not os.path.isabs(root) and os.path.normpath(root).split(os.sep)[0] == "..":
        problem = "a relative path must stay inside the project; give an absolute path to go elsewhere"
    if problem:
        raise ConfigError(f"setting 'data.root' = {root!r} is not allowed: {problem}")
    return root


def selected_experiments(params: dict) -> dict:
    """The experiments ``only`` names (exact names or shell patterns such as ``ima_table1_*``);
    all of them when ``only`` is absent; with the methods ``add_method`` adds on their method axes. ``only``
    comes from the file or from ``--config only=a,b``."""
    import fnmatch

    from fedrepro.configure import overlay

    experiments = overlay.apply(params, dict(params["experiments"]))  # add_method: a method on the method axes
    only = params.get("only")
    if not only:
        return experiments
    patterns = [p.strip() for p in (only.split(",") if isinstance(only, str) else only) if p.strip()]
    unmatched = [p for p in patterns if not fnmatch.filter(params["experiments"], p)]
    if unmatched:
        raise ConfigError(
            f"only: {', '.join(unmatched)} matches no experiment; experiments: {', '.join(params['experiments'])}"
        )
    return {name: exp for name, exp in experiments.items() if any(fnmatch.fnmatchcase(name, p) for p in patterns)}


# libyaml's parser where PyYAML was built with it (PyPI's wheels are): the same documents, several times faster
# (the papers' numbers, 95 kB, parse in 0.8 s instead of 6.4 s); the constructors stay PyYAML's Python ones
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_shipped_yaml(path: str | Path) -> Any:
    """A YAML file of the project's own (the papers' numbers, the explanations): parsed once per version of
    the file in a process, a fresh copy each call, so a caller may change what it gets."""
    path = Path(path).resolve()
    stat = path.stat()
    return copy.deepcopy(_parsed(path, stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=16)
def _parsed(path: Path, mtime_ns: int, size: int) -> Any:
    return yaml.load(path.read_text(), Loader=_SAFE_LOADER)


class _StrictLoader(_SAFE_LOADER):
    """YAML's safe subset, refusing a key given twice in one mapping (YAML says it is an error;
    PyYAML lets the last one win silently)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` then an override is no repeat
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"key '{key}' is given twice", key_node.start_mark
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep)


# A params file is a few hundred values; aliases may repeat a block, but not blow it up to millions.
MAX_YAML_NODES = 100_000


def _expanded_size(root: yaml.Node, path: Path) -> int:
    """The number of values the document has once every alias is expanded, counted over the node graph
    (each distinct node once, so an alias bomb costs no more than its text); an alias inside the block it
    names (a cycle) or an expansion beyond MAX_YAML_NODES is a ConfigError before anything is built."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:  # iterative: a deep document must not hit Python's recursion limit either
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = 1
            continue
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else node.value
        if children_done:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[key] > MAX_YAML_NODES:
                raise ConfigError(
                    f"{path}, line {node.start_mark.line + 1}: its aliases expand to more than "
                    f"{MAX_YAML_NODES} values (an alias bomb?); write the values out or repeat fewer"
                )
            continue
        if key in open_nodes:
            raise ConfigError(
                f"{path}, line {node.start_mark.line + 1}: an alias refers to a block that contains "
                f"it (a recursive alias, e.g. `&a [*a]`); a params file must be a tree"
            )
        open_nodes.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in open_nodes:
                raise ConfigError(
                    f"{path}, line {child.start_mark.line + 1}: an alias refers to a block that "
                    f"contains it (a recursive alias, e.g. `&a [*a]`); a params file must be a tree"
                )
            stack.append((child, False))
    return sizes[id(root)]


def read_yaml(path: str | Path) -> Any:
    """A params file's content; a file that cannot be read or parsed is a ConfigError naming it and the line."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot be read: {err}") from None
    try:
        loader = _StrictLoader(text)
        try:
            root = loader.get_single_node()
            if root is not None:
                _expanded_size(root, path)
            content = None if root is None else loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f", line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(f"{path}{line}: not a valid params file (plain YAML, no Python tags): {problem}") from None
    if isinstance(content, dict) and "__use_yte__" in content:
        raise ConfigError(
            f"{path}: '__use_yte__' asks for YTE templating, which runs Python code while the file "
            f"is loaded; fedrepro refuses templated params files"
        )
    return content


def load_params(path: str | Path) -> dict:
    path = Path(path)
    params = read_yaml(path)
    if not isinstance(params, dict):
        raise ConfigError(f"{path}: expected a mapping with 'experiments'")
    return validate(params, "params.schema.yaml", str(path))


def load_params_files(paths: list[str | Path]) -> dict:
    """Params files merged in order as Snakemake merges several --configfile (mappings key by key,
    lists replace), validated as a whole: a subset file need not be a complete params file."""
    params: dict = {}
    for path in paths:
        if not params:
            params = load_params(path)
            continue
        extra = read_yaml(path)
        if not isinstance(extra, dict):
            raise ConfigError(f"{path}: expected a mapping")
        params = deep_merge(params, extra)
    return validate(params, "params.schema.yaml", " ".join(str(p) for p in paths))
