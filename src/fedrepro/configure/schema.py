"""The schemas: a setting or params file validated against its schema, defaults filled in, and a refusal
that names the key, the value and what is allowed (``ConfigError``)."""

from __future__ import annotations

import copy
import functools
import json
import math
from typing import Any

import jsonschema
import yaml

from fedrepro.configure import registry
from fedrepro.errors import FedreproError


class ConfigError(FedreproError, ValueError):
    """A params file that cannot run; the message names the key, the value and what is allowed."""


# --------------------------------------------------------------------------- schema


def _load_schema(name: str) -> dict:
    if name == "setting.schema.yaml":
        return registry.setting_schema()  # the core file plus every method's settings fragment
    return _parsed_schema(name, (registry.SCHEMAS / name).stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _parsed_schema(name: str, mtime_ns: int) -> dict:
    # Parsing the schema took ~0.1 s per run; a grid of 800 runs spent a minute here. Keyed by
    # mtime so an edited schema is read again. Validation never mutates the schema.
    return yaml.safe_load((registry.SCHEMAS / name).read_text())


def _with_defaults(validator_class):
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_Validator = _with_defaults(jsonschema.Draft202012Validator)


def _explain(error: jsonschema.ValidationError, where: str) -> str:
    path = [str(p) for p in error.absolute_path]
    if error.validator == "additionalProperties":
        # Name the unknown key itself, not the whole mapping that holds it (a setting printed in
        # full per grid point buried the error under 92 KB of defaults).
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        lines = []
        for key in unknown:
            guess = closest(key, allowed)
            hint = f"; did you mean {guess}?" if guess else ""
            lines.append(
                f"{where}: unknown setting '{'.'.join([*path, key])}'{hint} allowed keys"
                f"{' of ' + '.'.join(path) if path else ''}: {', '.join(allowed)}"
            )
        if lines:
            return "\n".join(lines)
    key = ".".join(path) or "(top level)"
    return f"{where}: setting '{key}' = {_short(error.instance)} is not allowed: {_allowed(error)}"


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def closest(word: str, choices: list[str]) -> str | None:
    """The allowed key a typo most likely meant: one sharing a whole word (``clients_per_round`` ->
    ``num_clients``), else the nearest spelling."""
    import difflib

    words = set(word.lower().split("_"))
    sharing = [c for c in choices if words & set(c.lower().split("_"))]
    if sharing:
        return max(sharing, key=lambda c: difflib.SequenceMatcher(None, word, c).ratio())
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return match[0] if match else None


def _allowed(error: jsonschema.ValidationError) -> str:
    kind, value = error.validator, error.validator_value
    if kind == "enum":
        return "must be one of " + ", ".join(map(str, value))
    if kind == "exclusiveMinimum":
        return f"must be > {value}"
    if kind == "minimum":
        return f"must be >= {value}"
    if kind == "exclusiveMaximum":
        return f"must be < {value}"
    if kind == "maximum":
        return f"must be <= {value}"
    if kind == "type":
        return f"must be of type {value}"
    if kind == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        return f"{error.message}; allowed keys: {', '.join(allowed)}"
    if kind == "const":
        return f"must be {value!r}"
    if kind in ("anyOf", "oneOf") and error.context:
        # one line naming every form the key takes (partition.seed: an integer in range, or 'run')
        return " or ".join(dict.fromkeys(_allowed(e) for e in error.context))
    return error.message


def plain_copy(value: Any) -> Any:
    """A deep copy of a settings value: plain dicts and lists copied, scalars shared (immutable), anything else
    by ``copy.deepcopy``. Expanding the papers' grids copies settings hundreds of thousands of times, and
    ``copy.deepcopy``'s memo and dispatch were a third of it."""
    kind = type(value)
    if kind is dict:
        return {k: plain_copy(v) for k, v in value.items()}
    if kind is list:
        return [plain_copy(v) for v in value]
    if kind in (str, int, float, bool) or value is None:
        return value
    return copy.deepcopy(value)


# A schema whose top level is only a list of properties validates each top-level value on its own: the
# walk over every method's section took ~13 ms a setting, and expanding the papers' grids (thousands of
# settings, at every Snakemake start) spent minutes there. Most values recur (an absent section's
# defaults, a grid's shared client section), so each (key, value) is walked once per process.
_TOP_LEVEL_ONLY = {"$schema", "description", "title", "type", "additionalProperties", "properties", "required"}
_checked_parts: dict[int, tuple[dict, dict, bool]] = {}  # id(schema) -> (schema, kept alive so ids stay unique;
#                                                         memo; whether it holds a $ref)


def _valid_by_parts(instance: Any, schema: dict) -> bool:
    """True, with ``instance`` filled exactly as the full walk fills it, when it is valid; False (and
    ``instance`` untouched) when it is not or the schema is not of that shape: the full walk then decides."""
    if not isinstance(instance, dict) or set(schema) - _TOP_LEVEL_ONLY or schema.get("type", "object") != "object":
        return False
    if id(schema) not in _checked_parts:
        # a part checked on its own cannot resolve a reference into the whole: such a schema takes the whole walk
        _checked_parts[id(schema)] = (schema, {}, '"$ref"' in json.dumps(schema))
    _, memo, refers = _checked_parts[id(schema)]
    if refers:
        return False
    properties = schema.get("properties", {})
    if schema.get("additionalProperties", True) is not True and (
        schema["additionalProperties"] is not False or set(instance) - set(properties)
    ):
        return False
    if any(key not in instance for key in schema.get("required", [])):
        return False
    filled = {}
    for key, sub in properties.items():
        if key in instance:
            value = instance[key]
        elif "default" in sub:
            value = sub["default"]
        else:
            continue
        token = (key, repr(value))  # repr keeps types (1, 1.0, True) and key order apart
        if token not in memo:
            value = copy.deepcopy(value)
            if next(_Validator(sub).iter_errors(value), None) is not None:
                return False
            memo[token] = value
        filled[key] = plain_copy(memo[token])
    for key, value in filled.items():
        held = instance.get(key)
        if isinstance(held, dict) and isinstance(value, dict):
            held.clear()  # in place, as the full walk fills: a caller's reference to the section stays live
            held.update(value)
        else:
            instance[key] = value
    return True


def validate(instance: dict, schema_name: str, where: str) -> dict:
    """Validate ``instance`` in place (filling defaults); raise ConfigError naming the key."""
    refuse_nonfinite(instance, where)
    schema = _load_schema(schema_name)
    if _valid_by_parts(instance, schema):
        return instance
    errors = sorted(_Validator(schema).iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        raise ConfigError("\n".join(dict.fromkeys(_explain(e, where) for e in errors)))
    return instance


def refuse_nonfinite(value: Any, where: str, key: str = "") -> None:
    """NaN and infinity pass every ``minimum`` of a JSON schema (all comparisons with NaN are false):
    refuse them wherever they appear, naming the key."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(
            f"{where}: setting '{key or '(top level)'}' = {value} is not allowed: must be a finite number"
        )
    if isinstance(value, dict):
        for k, v in value.items():
            refuse_nonfinite(v, where, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            refuse_nonfinite(v, where, f"{key}[{i}]")
