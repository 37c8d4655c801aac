"""A toy quantization method, added as a contributor would add one: this module plus one
registration line (an entry point of its distribution, ``[project.entry-points.
"ingot.quant_methods"] ternary = "ternary"``, or a line in `QUANT_METHODS` for a built-in).

Ternary weights (TWN, Li et al. 2016): codes -1, 0, 1 (|w| above 0.7 mean |w| of its row) times
one scale per output channel, the least-squares fit of the row. With ``weighted`` the fit
weights each input channel's error by its calibration energy (the Hessian's diagonal), which
makes the entry a calibrated one: the layer walk observes the Hessian and calls `finish`.
Codes are 2-bit symmetric integers: the IR records bits 2 and the exporter stores them as INT4.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ingot.pipeline.quantize.fields import Ignore, Targets
from ingot.pipeline.quantize.method import (
    GroupInputs,
    IntegerEntry,
    IntegerMethod,
    Observation,
)

if TYPE_CHECKING:
    from torch import Tensor, nn

    from ingot.pipeline.model.qlinear import QuantizedLinear

__all__ = ["PLUGIN", "TernaryQuantize"]


class TernaryQuantize(IntegerEntry):
    """Ternary weights: codes -1, 0, 1 times one scale per output channel."""

    method: Literal["ternary"] = Field(description="Quantization algorithm.")
    weighted: bool = Field(
        default=False,
        description="Fit each row's scale weighting input channels by their calibration "
        "energy (needs `calibration`).",
    )
    targets: Targets = ["re:.*"]
    ignore: Ignore = ["lm_head"]

    # The grid of ternary codes (quantize.json records it; the IR has it from the codes).
    @property
    def bits(self) -> int:
        return 2

    @property
    def group_size(self) -> int:
        return -1

    @property
    def symmetric(self) -> bool:
        return True


class Ternary(IntegerMethod):
    name = "ternary"
    entry = TernaryQuantize

    def observes(self, entry: TernaryQuantize) -> Observation:
        return Observation.HESSIAN if entry.weighted else Observation.NONE

    def round(self, linear: nn.Linear, entry: TernaryQuantize) -> QuantizedLinear | None:
        return None if entry.weighted else _ternary(linear, None)

    def finish(
        self, linear: nn.Module, name: str, entry: TernaryQuantize, inputs: GroupInputs
    ) -> QuantizedLinear:
        return _ternary(linear, inputs.hessian.diagonal())


def _ternary(linear: nn.Linear, energy: Tensor | None) -> QuantizedLinear:
    # torch: imported by the layer walk, not by the recipe or `ingot inspect`
    import torch

    from ingot.pipeline.model.qlinear import QuantizedLinear

    w = linear.weight.data.float()  # [N, K]
    codes = torch.where(w.abs() > 0.7 * w.abs().mean(1, keepdim=True), w.sign(), 0.0)  # [N, K]
    a = torch.ones_like(w[0]) if energy is None else energy.to(w.device)  # [K]
    # argmin_s sum_k a_k (w_k - s c_k)^2, per row
    scale = (a * w * codes).sum(1) / (a * codes * codes).sum(1).clamp_min(1e-12)  # [N]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    bias = None if linear.bias is None else linear.bias.data.clone()
    k = w.shape[1]
    return QuantizedLinear(codes.to(torch.int8), scale[:, None], None, 2, k, bias=bias)


PLUGIN = Ternary()
