"""Which modules a recipe entry selects: `targets` minus `ignore`, by IR module name."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
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


def module_selected(name: str, targets: Iterable[str], ignore: Iterable[str]) -> bool:
    """True if some target pattern matches `name` and no ignore pattern does."""
    return any(pattern_matches(p, name) for p in targets) and not any(
        pattern_matches(p, name) for p in ignore
    )


def selected(entry: Selects, names: Iterable[str]) -> list[str]:
    """The names `entry` selects, in the order given."""
    return [n for n in names if module_selected(n, entry.targets, entry.ignore)]


def entry_for(name: str, entries: Sequence[E]) -> E | None:
    """The entry that selects module `name` (the recipe checks allow at most one), or None."""
    for entry in entries:
        if module_selected(name, entry.targets, entry.ignore):
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
