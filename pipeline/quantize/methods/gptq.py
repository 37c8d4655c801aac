"""gptq: integer weights rounded column by column, each column's error absorbed by the columns
not yet rounded, weighted by the inverse Hessian of the layer's calibration inputs. The solve
itself is quantize/gptq.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from ..fields import GroupSize, Ignore, Targets
from ..method import GroupInputs, IntegerEntry, IntegerMethod, LayerCost, LayerWork, Observation

if TYPE_CHECKING:
    from torch import nn

    from ...model.qlinear import QuantizedLinear

__all__ = ["PLUGIN", "GptqQuantize"]


class GptqQuantize(IntegerEntry):
    """GPTQ: rounds column by column, each column's error absorbed by the columns not yet
    quantized (weighted by the inverse Hessian of the calibration inputs). Needs `calibration`."""

    method: Literal["gptq"] = Field(description="Quantization algorithm.")
    bits: Literal[4, 8] = Field(description="Bits per weight.")
    group_size: GroupSize
    symmetric: bool = Field(
        default=True, description="Symmetric (zero point 0) or asymmetric (with zero points)."
    )
    targets: Targets = ["re:.*"]
    ignore: Ignore = ["lm_head"]
    actorder: bool = Field(
        default=True,
        description="Visit input channels in order of decreasing activation energy (diag of "
        "the Hessian). Needs static_groups (except per channel) so groups stay contiguous and "
        "the export needs no permutation.",
    )
    static_groups: bool = Field(
        default=True,
        description="Compute each group's scale and zero point from the original weights up "
        "front (contiguous channels) rather than when GPTQ reaches the group.",
    )
    dampening_frac: float = Field(
        default=0.01,
        gt=0,
        lt=1,
        description="Added to the Hessian's diagonal, as a fraction of its mean.",
    )
    block_size: int = Field(
        default=128, ge=1, le=4096, description="Columns per lazy batch update."
    )
    group_scales: Literal["best", "minmax", "mse"] = Field(
        default="best",
        description="Static group scales for groups narrower than a row: per output row the "
        "better (smaller layer-wise error on the calibration inputs) of the min-max range and "
        "the error-minimizing range ('best'), the min-max range alone (llm-compressor's), or "
        "the error-minimizing range alone. Per channel min-max is always used.",
    )
    true_sequential: bool = Field(
        default=True,
        description="Fit each group of a layer (q,k,v -> o -> gate,up -> down) to the inputs "
        "the already quantized groups before it produce (AutoGPTQ's default); false observes "
        "every group on the layer as loaded, in one pass (llm-compressor's order).",
    )

    @field_validator("static_groups")
    @classmethod
    def _static_groups_with_actorder(cls, value: bool, info: ValidationInfo) -> bool:
        if not value and info.data.get("actorder") and info.data.get("group_size") != -1:
            raise PydanticCustomError(
                "actorder_dynamic_groups",
                "actorder with dynamic groups scatters each group over the input channels "
                "(a g_idx) that the ONNX export cannot represent; keep static_groups: true "
                "(act order without the run-time cost) or set actorder: false",
            )
        return value


class Gptq(IntegerMethod):
    name = "gptq"
    entry = GptqQuantize

    def observes(self, entry: GptqQuantize) -> Observation:
        return Observation.HESSIAN

    def sequential(self, entry: GptqQuantize) -> bool:
        return entry.true_sequential

    def finish(
        self, linear: nn.Module, name: str, entry: GptqQuantize, inputs: GroupInputs
    ) -> QuantizedLinear:
        # torch: imported by the layer walk, not by the recipe or `ingot inspect`
        from ..gptq import quantize_linear_gptq

        bits, group_size, symmetric = entry.grid
        return quantize_linear_gptq(
            linear,
            inputs.hessian,
            bits=bits,
            group_size=group_size,
            symmetric=symmetric,
            actorder=entry.actorder,
            static_groups=entry.static_groups,
            dampening_frac=entry.dampening_frac,
            block_size=entry.block_size,
            group_scales=entry.group_scales,
        )

    def layer_costs(self, entry: GptqQuantize, work: LayerWork) -> dict[str, LayerCost]:
        # Holds the widest linear's inputs over every token twice (the store it observes and
        # the forward's own intermediate): 1B shape, 32 x 512 tokens, 1.0 GiB of its 3.4 GiB.
        widest = max(k for _, k in work.linears)
        # Hessians (2 n K^2 per input), Cholesky + inverse (~K^3), the column updates (2 N K^2).
        solve = sum(2 * tokens * k * k + k**3 for k, tokens in work.observed())
        solve += sum(2 * n * k * k for n, k in work.linears)
        return {self.name: LayerCost(held_bytes=2 * work.tokens * widest * 4, flops=solve)}


PLUGIN = Gptq()
