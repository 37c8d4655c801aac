"""rtn: round-to-nearest integer weights, without calibration data (the baseline every other
method is compared to). The rounding itself is quantize/rtn.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..fields import GroupSize, Ignore, Targets
from ..method import IntegerEntry, IntegerMethod

if TYPE_CHECKING:
    from torch import nn

    from ...model.qlinear import QuantizedLinear

__all__ = ["PLUGIN", "RtnQuantize"]


class RtnQuantize(IntegerEntry):
    """Round-to-nearest weight quantization: no calibration data, the fast baseline."""

    method: Literal["rtn"] = Field(description="Quantization algorithm.")
    bits: Literal[4, 8] = Field(description="Bits per weight.")
    group_size: GroupSize
    symmetric: bool = Field(
        default=True, description="Symmetric (zero point 0) or asymmetric (with zero points)."
    )
    targets: Targets = ["re:.*"]
    ignore: Ignore = ["lm_head"]


class Rtn(IntegerMethod):
    name = "rtn"
    entry = RtnQuantize

    def round(self, linear: nn.Linear, entry: RtnQuantize) -> QuantizedLinear:
        # torch: imported by the layer walk, not by the recipe or `ingot inspect`
        from ..rtn import quantize_linear_rtn

        return quantize_linear_rtn(linear, *entry.grid)


PLUGIN = Rtn()
