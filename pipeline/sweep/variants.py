"""A sweep's variants: each combination of axis values, named from its values, applied to the
base recipe's YAML as a full recipe of its own."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from .axes import Axes, canonical

__all__ = ["Variant", "VariantPathError", "expand", "set_path"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
_MAX_TOKEN = 40  # characters of one value in a name


@dataclass(frozen=True, slots=True)
class Variant:
    name: str  # unique within the sweep, safe as a file name
    values: dict[str, Any]  # {dotted recipe path: value}


class VariantPathError(ValueError):
    """A dotted path that does not fit the recipe it is applied to (its one-line reason)."""


def expand(axes: Axes) -> list[Variant]:
    """The sweep's variants in order, with unique names: the tokens of the values of the axes
    that have more than one, joined by `_` (`gptq_group_size32_int8`), a `-2`, `-3`...
    suffix where two would still collide."""
    tokens = {path: _tokens(path, values) for path, values in axes.axes.items()}
    variants, used = [], set()
    for values in axes.combinations():
        parts = [tokens[path][canonical(v)] for path, v in values.items()]
        base = "_".join(p for p in parts if p) or "base"
        name, n = base, 1
        while name.lower() in used:  # case-insensitive file systems
            n += 1
            name = f"{base}-{n}"
        used.add(name.lower())
        variants.append(Variant(name, values))
    return variants


def _tokens(path: str, values: list[Any]) -> dict[str, str]:
    """{value: its token in names} for one axis: none for an axis of one value; a string as
    written (`gptq`); a number or flag after the field it sets (`group_size32`, `no-speculative`);
    a mapping or list by the leaves in which the axis's values that have them differ, or its
    first leaf (`ngram` beside `no-speculative`; `gptq-bits8` beside `rtn-bits4`)."""
    if len(values) == 1:
        return {canonical(values[0]): ""}
    key = next((s for s in reversed(path.split(".")) if not s.isdigit()), "value")
    flat = [_flatten(v) if isinstance(v, dict | list) else None for v in values]
    leaves = dict.fromkeys(k for f in flat if f is not None for k in f)  # in order
    varying = [k for k in leaves if len({repr(f[k]) for f in flat if f and k in f}) > 1]
    out = {}
    for value, leaf in zip(values, flat, strict=True):
        if leaf is None:
            text = _scalar(key, value)
        elif not leaf:
            text = f"no-{key}"  # [] or {}
        else:
            shown = [k for k in varying if k in leaf] or list(leaf)[:1]
            text = "-".join(_scalar(k.split(".")[-1], leaf[k]) for k in shown)
        out[canonical(value)] = _UNSAFE.sub("-", text).strip("-.")[:_MAX_TOKEN] or key
    return out


def _scalar(key: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None or value is False:
        return f"no-{key}"
    if value is True:
        return key
    return f"{key}{value}"


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted sub-path: scalar} of a mapping or list."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    flat: dict[str, Any] = {}
    for k, v in items:
        path = f"{prefix}{k}"
        if isinstance(v, dict | list):
            flat |= _flatten(v, path + ".")
        else:
            flat[path] = v
    return flat


def set_path(data: dict[str, Any], path: str, value: Any, defaults: dict[str, Any]) -> None:
    """Set the dotted `path` of the recipe mapping `data` to a copy of `value`. A section the
    YAML leaves out is taken from `defaults` (the validated recipe, dumped) before it is
    entered: `targets.0.engine` on a recipe with the default targets."""
    segments = path.split(".")
    node: Any = data
    default: Any = defaults
    for depth, segment in enumerate(segments):
        where = ".".join(segments[: depth + 1])
        last = depth == len(segments) - 1
        default = _child(default, segment)
        if segment.isdigit():
            index = int(segment)
            if not isinstance(node, list):
                raise VariantPathError(f"{where}: the recipe has no list here")
            if index >= len(node):
                raise VariantPathError(f"{where}: the recipe's list has {len(node)} entries")
            key: Any = index
        else:
            if not isinstance(node, dict):
                raise VariantPathError(f"{where}: the recipe has no mapping here")
            key = segment
        if last:
            node[key] = copy.deepcopy(value)
            return
        if isinstance(node, dict) and node.get(key) is None:
            node[key] = copy.deepcopy(default) if isinstance(default, dict | list) else {}
        node = node[key]


def _child(default: Any, segment: str) -> Any:
    if isinstance(default, dict):
        return default.get(segment)
    if isinstance(default, list) and segment.isdigit() and int(segment) < len(default):
        return default[int(segment)]
    return None
