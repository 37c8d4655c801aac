"""Which modules a recipe entry selects: `targets` minus `ignore`, by IR module name.

A linear the checkpoint stores inside a fused tensor (Phi-3's `layers.0.attn.qkv_proj` holds
q_proj, k_proj and v_proj: `FusedLinear`) is also selected by a pattern naming the fused
tensor (`Holder`, from `architecture.fused_names`), so a recipe written for the checkpoint's
modules (llm-compressor's view) and one naming the IR's split linears both work. The IR's
names come first: a pattern matching any of the parts' own names (`re:.*v_proj`) selects
those parts only, as it does in a family storing them apart, even though it also matches the
fused name (qkv_proj ends in v_proj).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol, TypeVar

__all__ = [
    "EMBEDDING",
    "Holder",
    "Selects",
    "embedding_entry",
    "entry_for",
    "module_selected",
    "pattern_matches",
    "selected",
]

EMBEDDING = "embed_tokens"  # the token embedding's IR name: selected by this exact name only


class Holder(NamedTuple):
    """The fused checkpoint tensor holding a linear: its IR name and all its parts'."""

    name: str  # layers.0.attn.qkv_proj
    parts: tuple[str, ...]  # layers.0.attn.q_proj, ...


class Selects(Protocol):
    """Anything with the recipe's selection fields (every quantize entry has them)."""

    @property
    def targets(self) -> list[str]: ...

    @property
    def ignore(self) -> list[str]: ...


E = TypeVar("E", bound=Selects)


def pattern_matches(pattern: str, name: str) -> bool:
    """An exact module name, or `re:<regex>` where the regex must match the whole name (so
    `re:layers\\.1\\..*` does not also catch layers 10-19)."""
    if pattern.startswith("re:"):
        return _compiled(pattern[3:]).fullmatch(name) is not None
    return pattern == name


def module_selected(
    name: str, targets: Iterable[str], ignore: Iterable[str], holder: Holder | None = None
) -> bool:
    """True if some target pattern selects `name` and no ignore pattern does (`names` below:
    its own name, or that of the fused tensor `holder` holding it)."""
    return any(_names(p, name, holder) for p in targets) and not any(
        _names(p, name, holder) for p in ignore
    )


def _names(pattern: str, name: str, holder: Holder | None) -> bool:
    """`pattern` matches `name`, or names its fused tensor and none of the parts (module doc)."""
    if pattern_matches(pattern, name):
        return True
    return (
        holder is not None
        and pattern_matches(pattern, holder.name)
        and not any(pattern_matches(pattern, part) for part in holder.parts)
    )


def selected(
    entry: Selects, names: Iterable[str], fused: Mapping[str, Holder] | None = None
) -> list[str]:
    """The names `entry` selects, in the order given (`fused`: the module docstring)."""
    fused = fused or {}
    return [n for n in names if module_selected(n, entry.targets, entry.ignore, fused.get(n))]


def entry_for(name: str, entries: Sequence[E], fused: Mapping[str, str] | None = None) -> E | None:
    """The entry that selects module `name` (the recipe checks allow at most one), or None."""
    holder = (fused or {}).get(name)
    for entry in entries:
        if module_selected(name, entry.targets, entry.ignore, holder):
            return entry
    return None


def embedding_entry(entries: Sequence[E]) -> E | None:
    """The entry whose `targets` name the embedding exactly (and whose `ignore` does not), or
    None. A regex target never selects it: recipes written before the embedding could be
    quantized (`re:.*`) keep their meaning."""
    for entry in entries:
        if EMBEDDING in entry.targets and not any(
            pattern_matches(p, EMBEDDING) for p in entry.ignore
        ):
            return entry
    return None


@functools.lru_cache(maxsize=512)
def _compiled(regex: str) -> re.Pattern[str]:
    return re.compile(regex)
