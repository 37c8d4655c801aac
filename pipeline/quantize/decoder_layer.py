"""One decoder layer's calibrated quantization, dense or sparse: the walk of its kind
(`layerwise.quantize_layer`, or `moe_calibration.quantize_sparse_layer` for a layer whose MLP is
a mixture of experts). The driver and the precision search call this."""

from __future__ import annotations

from collections.abc import Callable

from ingot.calibration.activations import ActivationStore

from ..model.config import ModelConfig
from ..model.layers import DecoderLayer, SparseMoE
from .layerwise import LayerForward, LayerPlan, quantize_layer
from .moe_calibration import quantize_sparse_layer

__all__ = ["quantize_decoder_layer"]


def quantize_decoder_layer(
    layer: DecoderLayer,
    x: ActivationStore,
    plan: LayerPlan,
    forward: LayerForward,
    cfg: ModelConfig,
    new_store: Callable[[str, tuple[int, ...]], ActivationStore],
    *,
    outputs: bool = True,
    experts: dict[str, dict] | None = None,
) -> ActivationStore | None:
    """`layerwise.quantize_layer`'s contract; a sparse layer's calibrated experts' records go
    in ``experts`` (`moe_calibration`)."""
    args = (layer, x, plan, forward, cfg, new_store)
    if isinstance(layer.mlp, SparseMoE):
        return quantize_sparse_layer(*args, outputs=outputs, experts=experts)
    return quantize_layer(*args, outputs=outputs)
