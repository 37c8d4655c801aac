"""Which modules a recipe entry selects: `targets` minus `ignore`, by IR module name.

A linear the checkpoint stores inside a fused tensor (Phi-3's `layers.0.attn.qkv_proj` holds
q_proj, k_proj and v_proj: `FusedLinear`) is also selected by a pattern matching the fused
tensor's name (`fused`: {linear: fused name}, `architecture.fused_names`), so a recipe written
for the checkpoint's modules (llm-compressor's view) and one naming the IR's split linears both
work.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

__all__ = [
    "EMBEDDING",
    "Selects",
    "embedding_entry",
    "entry_for",
    "module_selected",
    "pattern_matches",
    "selected",
]

EMBEDDING = "embed_tokens"  # the token embedding's IR name: selected by this exact name only


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
    name: str, targets: Iterable[str], ignore: Iterable[str], fused: str | None = None
) -> bool:
    """True if some target pattern matches `name` (or `fused`, the name of the fused tensor
    holding it) and no ignore pattern does."""
    names = (name,) if fused is None else (name, fused)
    return any(pattern_matches(p, n) for p in targets for n in names) and not any(
        pattern_matches(p, n) for p in ignore for n in names
    )


def selected(
    entry: Selects, names: Iterable[str], fused: Mapping[str, str] | None = None
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
