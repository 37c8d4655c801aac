"""awq: activation-aware integer weights. Per scaling group, per-channel scales from the
activation magnitudes are folded into the module before the group (a norm or a linear), then
each linear gets a clipping search; W4 weight-only. The searches are quantize/awq.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ..fields import GroupSize, Ignore, Targets
from ..method import (
    CHANNEL_SAMPLE_TOKENS,
    Group,
    GroupInputs,
    IntegerEntry,
    IntegerMethod,
    LayerCost,
    LayerWork,
    Observation,
)

if TYPE_CHECKING:
    from torch import Tensor, nn

    from ...model.qlinear import QuantizedLinear

__all__ = ["PLUGIN", "AwqQuantize"]

_SCALE_CANDIDATES = 21  # awq.AWQ_GRID scales + plain rounding, each a forward over the sample
_CLIP_WORK = 10 * 2 * 512  # awq's clip steps x 2 flops x its clip tokens, per weight


class AwqQuantize(IntegerEntry):
    """AWQ: per-channel scales from activation magnitudes, folded into the preceding norm or
    linear, plus a clipping search; W4 weight-only. Needs `calibration`."""

    method: Literal["awq"] = Field(description="Quantization algorithm.")
    bits: Literal[4] = Field(description="Bits per weight.")
    group_size: GroupSize
    symmetric: bool = Field(
        default=False,
        description="Symmetric (zero point 0) or asymmetric (with zero points, AWQ's usual).",
    )
    targets: Targets = ["re:.*"]
    ignore: Ignore = ["lm_head"]


class Awq(IntegerMethod):
    name = "awq"
    entry = AwqQuantize

    def observes(self, entry: AwqQuantize) -> Observation:
        return Observation.CHANNELS

    def scale_group(self, group: Group) -> Tensor | None:
        """The searched scale, folded into the module before the group; None when it has none
        that can take it (v -> o under GQA)."""
        if group.prev is None:
            return None
        # torch: imported by the layer walk, not by the recipe or `ingot inspect`
        from ..awq import apply_scales, search_scales

        linears, x = group.linears(), group.inputs.samples
        samples = x.view(-1, group.seq_len, x.shape[-1])  # [S, T, K]: whole sequences
        s = search_scales(
            group.inputs.mean_abs,
            [m.weight.data for m in linears],
            [e.grid for e in group.entries],
            group.inspect(samples),
        )
        apply_scales(group.layer.get_submodule(group.prev), linears, s)
        return s

    def finish(
        self, linear: nn.Module, name: str, entry: AwqQuantize, inputs: GroupInputs
    ) -> QuantizedLinear:
        # torch: imported by the layer walk, not by the recipe or `ingot inspect`
        from ..awq import quantize_linear_awq

        bits, group_size, symmetric = entry.grid
        return quantize_linear_awq(
            linear, inputs.samples, name=name, bits=bits, group_size=group_size, symmetric=symmetric
        )

    def layer_costs(self, entry: AwqQuantize, work: LayerWork) -> dict[str, LayerCost]:
        sample = min(work.tokens, CHANNEL_SAMPLE_TOKENS)
        flops = _SCALE_CANDIDATES * 2 * work.forward_flops * sample / work.tokens
        flops += sum(_CLIP_WORK * n * k for n, k in work.linears)
        return {self.name: LayerCost(flops=flops)}


PLUGIN = Awq()
