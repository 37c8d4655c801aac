"""The manifest's record of a recipe's quantize list: each entry's settings and module count."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..model.selection import selected
from .method import QuantEntry, method_of

__all__ = ["summaries"]


def summaries(entries: Sequence[QuantEntry], names: Iterable[str]) -> list[dict[str, Any]]:
    """One record per entry: what its method records of it (`QuantMethod.record`: the settings
    as the recipe states them), plus how many of the linears `names` it selects (written to
    quantize.json, then the manifest)."""
    names = list(names)
    return [{**method_of(e).record(e), "modules": len(selected(e, names))} for e in entries]
