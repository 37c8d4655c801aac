"""The `quantize` section: a list of passes (rtn, gptq, awq, smoothquant, fp8), each selecting
modules by pattern."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, TypeAdapter, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from .base import _Strict

__all__ = [
    "AwqQuantize",
    "Fp8Quantize",
    "GptqQuantize",
    "Quantize",
    "RtnQuantize",
    "SmoothQuantQuantize",
    "quantize_entry",
]


def _check_module_pattern(pattern: str) -> str:
    if pattern.startswith("re:"):
        try:
            re.compile(pattern[3:])
        except re.error as exc:
            raise PydanticCustomError(
                "bad_regex", "invalid regular expression: {reason}", {"reason": str(exc)}
            ) from None
    return pattern


ModulePattern = Annotated[
    str,
    Field(min_length=1),
    AfterValidator(_check_module_pattern),
]


# Fields every pass shares (each class gives its own defaults).
GroupSize = Annotated[
    Literal[32, 64, 128, -1],
    Field(description="Input channels sharing one scale; -1 = one scale per output channel."),
]
Targets = Annotated[
    list[ModulePattern],
    Field(
        min_length=1,
        description="Modules to quantize: IR module names (`layers.0.attn.q_proj`, `lm_head`) "
        "or regular expressions prefixed `re:` that must match the whole name.",
    ),
]
Ignore = Annotated[
    list[ModulePattern],
    Field(
        description="Modules to leave unquantized, even if `targets` selects them "
        "(same syntax as `targets`).",
    ),
]


class _IntegerWeights:
    """What every integer weight method shares, read by the quantizers (no fields here: the
    classes declare their own, with their own defaults and order)."""

    @property
    def quantizer(self) -> tuple[int, int, bool]:
        """(bits, group_size, symmetric): the arguments of the round-to-nearest grid."""
        return self.bits, self.group_size, self.symmetric  # type: ignore[attr-defined]

    @property
    def calibrated(self) -> bool:
        """Whether the entry needs the calibration windows (the layer-sequential pass)."""
        return self.method in ("gptq", "awq")  # type: ignore[attr-defined]


class RtnQuantize(_IntegerWeights, _Strict):
    """Round-to-nearest weight quantization: no calibration data, the fast baseline."""

    method: Literal["rtn"] = Field(description="Quantization algorithm.")
    bits: Literal[4, 8] = Field(description="Bits per weight.")
    group_size: GroupSize
    symmetric: bool = Field(
        default=True, description="Symmetric (zero point 0) or asymmetric (with zero points)."
    )
    targets: Targets = ["re:.*"]
    ignore: Ignore = ["lm_head"]


class GptqQuantize(_IntegerWeights, _Strict):
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


class AwqQuantize(_IntegerWeights, _Strict):
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


class SmoothQuantQuantize(_Strict):
    """SmoothQuant W8A8: activation outliers migrated into the weights by per-channel scales
    s_j = max|X_j|^alpha / max|W_j|^(1-alpha), folded into the RMSNorm before q,k,v and before
    gate,up (o_proj and down_proj are not smoothed, as llm-compressor maps them); then int8
    symmetric per-channel weights and int8 activations. Needs `calibration`."""

    method: Literal["smoothquant"] = Field(description="Quantization algorithm.")
    alpha: float | None = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Migration strength; null: no smoothing (plain W8A8).",
    )
    weights: Literal["gptq", "rtn"] = Field(
        default="gptq", description="How the int8 per-channel weights are rounded."
    )
    activations: Literal["dynamic", "static"] = Field(
        default="dynamic",
        description="int8 activations: dynamic = one scale per token, computed at run time; "
        "static = one scale per tensor, from the calibration windows.",
    )
    targets: Targets = ["re:.*"]
    ignore: Ignore = ["lm_head"]

    @property
    def bits(self) -> int:
        return 8

    @property
    def quantizer(self) -> tuple[int, int, bool]:
        return 8, -1, True

    @property
    def calibrated(self) -> bool:
        return True


class Fp8Quantize(_Strict):
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

    @property
    def calibrated(self) -> bool:
        return self.activations == "static"


# Discriminated by `method`: an unknown method fails with the list of known ones.
Quantize = Annotated[
    RtnQuantize | GptqQuantize | AwqQuantize | SmoothQuantQuantize | Fp8Quantize,
    Field(discriminator="method"),
]


def quantize_entry(data: dict[str, Any]) -> Quantize:
    """A quantize entry from its recipe form (`{"method": "rtn", "bits": 4, ...}`), validated
    as the recipe would: for code that quantizes without a recipe file (tests, benchmarks)."""
    return _ENTRY.validate_python(data)


_ENTRY: TypeAdapter[Quantize] = TypeAdapter(Quantize)
