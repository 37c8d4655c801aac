"""The manifest's record of a recipe's quantize list: each entry's settings and module count;
for an entry resolved by a search (`method: auto`), the search's record with the entries it
resolved to."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..model.selection import Holder, embedding_entry, selected
from .method import QuantEntry, method_of

__all__ = ["summaries"]


def summaries(
    entries: Sequence[QuantEntry],
    names: Iterable[str],
    searched: Mapping[int, dict[str, Any]] | None = None,
    fused: Mapping[str, Holder] | None = None,
    experts: Mapping[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One record per entry: what its method records of it (`QuantMethod.record`: the settings
    as the recipe states them), plus how many of the linears `names` it selects, the
    embedding counting as one (written to quantize.json, then the manifest). `searched`:
    {index: the search's record} of entries resolved before the walk (`Resolution.record`,
    with its `resolved` entries' records). `fused`: the fused tensors holding linears
    (`architecture.fused_names`), which patterns may name. `experts`: {an expert's IR prefix:
    how it was calibrated} (`moe_calibration`), listed under each entry selecting its linears."""
    names, searched, experts = list(names), searched or {}, experts or {}
    records = []
    for i, e in enumerate(entries):
        record = method_of(e).record(e)
        chosen = selected(e, names, fused)
        if i in searched:
            found = searched[i]
            modules = sum(r["modules"] for r in found["resolved"])
            records.append({**record, **found, "modules": modules})
        else:
            embedding = embedding_entry([e]) is not None  # never among `names` (linears)
            records.append({**record, "modules": len(chosen) + embedding})
        calibrated = _experts_of(chosen, experts)
        if calibrated:
            records[-1]["experts"] = calibrated
    return records


def _experts_of(chosen: list[str], experts: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """The records of the experts with a linear among `chosen`, by IR prefix."""
    prefixes = {name.rsplit(".", 1)[0] for name in chosen}
    return {prefix: record for prefix, record in experts.items() if prefix in prefixes}
