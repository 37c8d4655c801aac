"""fp8: FP8 E4M3 weights (one scale per output channel or per tensor), rounded without data
(quantize/fp8.py), and optionally FP8 inputs: dynamic (a scale per token at run time) or static
(one scale per tensor, which the layer walk measures)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from ..fields import Ignore, Targets
from ..method import GroupInputs, Observation, QuantEntry, QuantMethod, Scheme

if TYPE_CHECKING:
    from torch import nn

    from ...model.qlinear import QuantizedLinear

__all__ = ["PLUGIN", "Fp8Quantize"]


class Fp8Quantize(QuantEntry):
    """FP8 E4M3 weights (one scale per output channel or per tensor) and optionally FP8
    activations. Needs `calibration` only for static activation scales."""

    method: Literal["fp8"] = Field(description="Quantization algorithm.")
    weights: Literal["channel", "tensor"] = Field(
        default="channel", description="Weight scale granularity: per output channel or tensor."
    )
    activations: Literal["dynamic", "static", "none"] = Field(
        default="dynamic",
        description="FP8 activations: dynamic = one scale per token at run time; static = one "
        "scale per tensor from the calibration windows; none = weight-only FP8.",
    )
    targets: Targets = ["re:.*"]
    ignore: Ignore = ["lm_head"]

    @property
    def bits(self) -> int:
        return 8


class Fp8(QuantMethod):
    name = "fp8"
    entry = Fp8Quantize

    def observes(self, entry: Fp8Quantize) -> Observation:
        return Observation.ABSMAX if entry.activations == "static" else Observation.NONE

    def round(self, linear: nn.Linear, entry: Fp8Quantize) -> QuantizedLinear:
        """The FP8 linear; a static input scale is left for the walk to measure (`finish`)."""
        # torch: imported by the layer walk, not by the recipe or `ingot inspect`
        from ...model.input_quant import InputQuant
        from ..fp8 import quantize_linear_fp8

        inputs = None
        if entry.activations != "none":
            inputs = InputQuant("fp8", static=entry.activations == "static")
        return quantize_linear_fp8(linear, entry.weights == "channel", inputs)

    def finish(
        self, linear: nn.Module, name: str, entry: Fp8Quantize, inputs: GroupInputs
    ) -> QuantizedLinear:
        # Rounded before the walk (`round`): the walk measured the static input scale.
        linear.set_input_quant(inputs.static_scale(linear.input_quant))
        return linear

    def scheme(self, entry: Fp8Quantize) -> Scheme:
        return Scheme.FP8

    def describe(self, record: dict[str, Any]) -> str:
        return f"fp8 E4M3 per-{record['weights']} weights, {record['activations']} fp8 activations"


PLUGIN = Fp8()
