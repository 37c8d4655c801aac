"""A sweep's variants: each combination of axis values, named from its values, applied to the
base recipe's YAML as a full recipe of its own."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from .axes import Axes

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
    """The sweep's variants in order, with unique names: the values' tokens joined by `_`
    (`gptq_group_size32_int8`), a `-2`, `-3`... suffix where two would still collide."""
    variants, used = [], set()
    for values in axes.combinations():
        base = "_".join(_token(path, value) for path, value in values.items()) or "base"
        name, n = base, 1
        while name.lower() in used:  # case-insensitive file systems
            n += 1
            name = f"{base}-{n}"
        used.add(name.lower())
        variants.append(Variant(name, values))
    return variants


def _token(path: str, value: Any) -> str:
    """A value in a name: a string as written (`gptq`); otherwise prefixed by the field it
    sets (`group_size32`, `speculative-ngram`, `no-speculative`)."""
    key = next(s for s in reversed(path.split(".")) if not s.isdigit())
    if isinstance(value, str):
        text = value
    elif value is None or value is False:
        text = f"no-{key}"
    elif value is True:
        text = key
    elif isinstance(value, int | float):
        text = f"{key}{value}"
    else:
        text = f"{key}-{'-'.join(_leaves(value))}"
    return _UNSAFE.sub("-", text).strip("-.")[:_MAX_TOKEN] or key


def _leaves(value: Any) -> list[str]:
    """The scalar values inside a mapping or list, in order."""
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [str(value)]


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
