"""The units the per-layer precision search (`method: auto`) chooses for: the linears one
entry selects of one compute group of one layer (q,k,v; o; gate,up; down:
`ModelConfig.layer_spec(i).groups`). Those read one input: the walk observes them together, AWQ and
SmoothQuant fold one scale before them (SmoothQuant's whole-group rule), and the export fuses
them into one MatMul when they share a scheme; so a group never mixes candidates. Torch-free:
the recipe check reads it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..model.architecture import linear_shape
from ..model.config import ModelConfig
from .method import QuantEntry
from .weight_bytes import weight_bytes

__all__ = ["Unit", "unit_bytes", "units_of"]


@dataclass(frozen=True, slots=True)
class Unit:
    """The linears of one compute group of layer ``layer`` that one entry selects."""

    layer: int
    names: tuple[str, ...]  # inside the layer: attn.q_proj, ...

    @property
    def modules(self) -> list[str]:
        """The IR names: layers.{i}.attn.q_proj, ..."""
        return [f"layers.{self.layer}.{n}" for n in self.names]

    def shapes(self, cfg: ModelConfig) -> list[tuple[int, int]]:
        """(N, K) of each linear."""
        return [linear_shape(cfg, m)[::-1] for m in self.modules]


def units_of(chosen: Sequence[str], cfg: ModelConfig) -> list[Unit]:
    """The units of the selected decoder-layer linears ``chosen``, in model order."""
    picked = set(chosen)
    units = []
    for i in range(cfg.num_layers):
        for group in cfg.layer_spec(i).groups:
            names = tuple(n for n in group if f"layers.{i}.{n}" in picked)
            if names:
                units.append(Unit(i, names))
    return units


def unit_bytes(candidate: QuantEntry, unit: Unit, cfg: ModelConfig) -> int:
    """Stored bytes of a unit's weights when ``candidate`` quantizes it."""
    return sum(weight_bytes(candidate, n, k) for n, k in unit.shapes(cfg))
