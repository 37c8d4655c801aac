"""Apply a recipe's quantize list to a model in memory (tests, benchmarks, evaluation)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..model.llama import LlamaModel
from .driver import quantize_in_place
from .method import QuantEntry

if TYPE_CHECKING:
    from ingot.calibration.dataset import CalibrationSet

__all__ = ["quantize_model"]


def quantize_model(
    model: LlamaModel, entries: Sequence[QuantEntry], calibration: CalibrationSet | None = None
) -> list[dict[str, Any]]:
    """Replace the selected linears in place; returns one summary per entry for the manifest.

    The quantize stage's own driver (`driver.quantize_in_place`), layer by layer over the
    model: calibrated entries (GPTQ, AWQ, ...) need ``calibration`` (see
    `ingot.calibration.dataset.load_calibration`)."""
    return quantize_in_place(model, entries, calibration)
