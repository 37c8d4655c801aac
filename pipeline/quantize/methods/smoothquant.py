"""smoothquant: W8A8. Activation outliers are migrated into the weights by per-channel scales
folded into the norm before q,k,v and before gate,up (quantize/smoothquant.py); the int8
per-channel weights are then rounded by another method's plug-in (the entry's ``weights``:
gptq or rtn), and the inputs get int8 scales, per token or (static) from the calibration."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from ..fields import Ignore, Targets
from ..method import (
    QUANT_METHODS,
    Group,
    GroupInputs,
    LayerCost,
    LayerWork,
    Observation,
    QuantEntry,
    QuantMethod,
    Scheme,
    method_of,
)

if TYPE_CHECKING:
    from torch import Tensor, nn

    from ...model.config import ModelConfig
    from ...model.qlinear import QuantizedLinear

__all__ = ["PLUGIN", "SmoothQuantQuantize"]


class SmoothQuantQuantize(QuantEntry):
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

    def weight_entry(self) -> QuantEntry:
        """The entry of the method (``weights``) that rounds the int8 symmetric per-channel
        weights, with that method's defaults otherwise (GPTQ: act order, static groups, ...)."""
        spec = {"method": self.weights, "bits": 8, "group_size": -1, "symmetric": True}
        return QUANT_METHODS.get(self.weights).entry.model_validate(spec)


class SmoothQuant(QuantMethod):
    name = "smoothquant"
    entry = SmoothQuantQuantize

    def observes(self, entry: SmoothQuantQuantize) -> Observation:
        weights = entry.weight_entry()
        return Observation.ABSMAX | method_of(weights).observes(weights)

    def scale_group(self, group: Group) -> Tensor | None:
        """Smoothing folded into the norm before the group; None when the group reads no norm
        (o_proj, down_proj) or its entries ask for no alpha or for different ones."""
        alphas = {e.alpha for e in group.entries}
        if len(alphas) != 1 or None in alphas or group.norm is None:
            return None
        # torch: imported by the layer walk, not by the recipe or `ingot inspect`
        from ..awq import apply_scales
        from ..smoothquant import smoothing_scales

        linears = group.linears()
        s = smoothing_scales(group.inputs.act_max, [m.weight.data for m in linears], alphas.pop())
        apply_scales(group.layer.get_submodule(group.norm), linears, s)
        return s

    def finish(
        self, linear: nn.Module, name: str, entry: SmoothQuantQuantize, inputs: GroupInputs
    ) -> QuantizedLinear:
        # torch: imported by the layer walk, not by the recipe or `ingot inspect`
        from ...model.input_quant import InputQuant

        weights = entry.weight_entry()
        quantized = method_of(weights).finish(linear, name, weights, inputs)
        scheme = InputQuant("int8", static=entry.activations == "static")
        quantized.set_input_quant(inputs.static_scale(scheme))
        return quantized

    def scheme(self, entry: SmoothQuantQuantize) -> Scheme:
        return Scheme.W8A8

    def describe(self, record: dict[str, Any]) -> str:
        return (
            f"smoothquant W8A8 alpha {record['alpha']}, {record['weights']} int8 weights, "
            f"{record['activations']} int8 activations"
        )

    def model_problems(
        self, at: str, entry: SmoothQuantQuantize, chosen: list[str], cfg: ModelConfig
    ) -> list[str]:
        # One scale per channel is folded into the norm before q,k,v (gate,up): every linear
        # reading that norm must take it, so an entry that smooths selects whole groups.
        if entry.alpha is None:
            return []
        picked = set(chosen)
        for i in range(cfg.num_layers):
            for norm, group in cfg.layer_spec(i).norm_groups:
                names = [f"layers.{i}.{n}" for n in group]
                missing = [n for n in names if n not in picked]
                if missing and len(missing) < len(names):
                    return [
                        f"{at}.targets: smoothquant folds one scale into {norm} for "
                        f"{', '.join(group)} together, and selects {len(names) - len(missing)} "
                        f"of them in layer {i} (missing {missing[0]}); select the whole group "
                        "or set alpha: null (no smoothing)"
                    ]
        return []

    def layer_costs(self, entry: SmoothQuantQuantize, work: LayerWork) -> dict[str, LayerCost]:
        weights = entry.weight_entry()
        return {self.name: LayerCost(), **method_of(weights).layer_costs(weights, work)}


PLUGIN = SmoothQuant()
