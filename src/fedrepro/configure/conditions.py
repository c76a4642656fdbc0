"""Conditions a method's settings must meet, written in its settings fragment as expressions.

    requires:
      - check: fedprox.mu * client.lr < 1
        because: a local proximal step would overshoot x_global

An expression reads the resolved setting by dotted keys (a key the setting lacks reads as None) and
two facts of the catalog, ``dataset_info`` and ``model_info``. It may use arithmetic, comparisons,
``and``/``or``/``not``, ``x if c else y``, literals, ``int``/``min``/``max``/``len`` and ``client_lr(t)``
(the client lr of round t, fedrepro.schedule); nothing else
parses, so a fragment cannot run code. A condition that does not hold names its keys and their values.
"""

from __future__ import annotations

import ast
import functools
import operator

from fedrepro import catalog, schedule
from fedrepro.errors import FedreproError

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_FUNCTIONS = {"int": int, "min": min, "max": max, "len": len}
# functions of the setting itself: client_lr(t), the client lr of round t without plug-ins (fedrepro.schedule)
_SETTING_FUNCTIONS = {"client_lr": schedule.client_lr}


class ConditionError(FedreproError, ValueError):
    """A fragment's expression that is not in the allowed language."""


@functools.lru_cache(maxsize=256)
def parse(expression: str) -> ast.Expression:
    tree = ast.parse(expression, mode="eval")
    for node in ast.walk(tree):
        allowed = (
            ast.Expression,
            ast.BoolOp,
            ast.And,
            ast.Or,
            ast.UnaryOp,
            ast.Not,
            ast.USub,
            ast.BinOp,
            ast.Compare,
            ast.IfExp,
            ast.Constant,
            ast.Name,
            ast.Attribute,
            ast.Load,
            ast.List,
            ast.Tuple,
            ast.Call,
            *_BINARY,
            *_COMPARE,
        )
        if not isinstance(node, allowed):
            raise ConditionError(f"'{expression}': {type(node).__name__} is not allowed in a condition")
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name) and not node.keywords and node.func.id in {*_FUNCTIONS, *_SETTING_FUNCTIONS}
        ):
            raise ConditionError(f"'{expression}': only {', '.join([*_FUNCTIONS, *_SETTING_FUNCTIONS])} may be called")
    return tree


def keys_read(expression: str) -> list[str]:
    """The dotted setting keys an expression reads, in order of appearance."""
    keys = []
    for node in ast.walk(parse(expression)):
        dotted = _dotted(node)
        if (
            dotted
            and not any(k.startswith(dotted + ".") or dotted.startswith(k + ".") for k in keys)
            and dotted.split(".")[0] not in {*_FUNCTIONS, *_SETTING_FUNCTIONS}
        ):
            keys.append(dotted)
    return sorted(set(keys), key=keys.index)


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _names(setting: dict) -> dict:
    return {
        **setting,
        "dataset_info": catalog.DATASETS.get(setting.get("dataset"), {}),
        "model_info": catalog.MODELS.get(setting.get("model"), {}),
    }


def lookup(names: dict, dotted: str):
    value = names
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def evaluate(expression: str, setting: dict):
    names = _names(setting)

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Name, ast.Attribute)):
            return lookup(names, _dotted(node))
        if isinstance(node, (ast.List, ast.Tuple)):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.BoolOp):
            values = (ev(v) for v in node.values)
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.UnaryOp):
            value = ev(node.operand)
            return (not value) if isinstance(node.op, ast.Not) else -value
        if isinstance(node, ast.BinOp):
            return _BINARY[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, right_node in zip(node.ops, node.comparators):
                right = ev(right_node)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return ev(node.body) if ev(node.test) else ev(node.orelse)
        if isinstance(node, ast.Call) and node.func.id in _SETTING_FUNCTIONS:
            return _SETTING_FUNCTIONS[node.func.id](setting, *(ev(a) for a in node.args))
        if isinstance(node, ast.Call):
            return _FUNCTIONS[node.func.id](*(ev(a) for a in node.args))
        raise ConditionError(f"'{expression}': cannot evaluate {type(node).__name__}")

    return ev(parse(expression))


def violations(requires: list[dict], setting: dict, owner: str) -> list[str]:
    """One message for each condition of ``requires`` that the setting does not meet."""
    names, problems = _names(setting), []
    for condition in requires:
        expression = condition["check"]
        try:
            holds = bool(evaluate(expression, setting))
        except TypeError:  # e.g. a comparison with a key that is unset (None): the condition cannot hold
            holds = False
        if not holds:
            values = ", ".join(
                f"{k} = {lookup(names, k)!r}"
                for k in keys_read(expression)
                if not k.startswith(("dataset_info", "model_info")) or "." in k
            )
            problems.append(f"{owner}: {expression} does not hold ({values}): {condition['because']}")
    return problems
