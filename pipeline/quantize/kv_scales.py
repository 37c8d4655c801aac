"""Per-head K and V scales of a quantized KV cache, calibrated on the calibration windows.

For every layer and KV head: scale = amax / qmax, amax the largest |value| the head's K (after
RoPE: what the pool stores) or V took over every calibration token, qmax 127 (int8) or 448
(fp8 E4M3FN). Measured on the quantized IR, the model the engine runs, layer by layer:

    x = embed(windows)                                  [N, T, hidden]
    for each layer i:
        amax_k, amax_v = max over chunks of |K|, |V| per head   (attn_norm -> k/v proj, RoPE)
        layer i's KV rounding = those scales
        x = layer i (rounding its K/V as the pool will) (x)      the next layer's inputs

so each layer is measured on what the layers before it produce *with* their KV rounding, as
the engine computes. One decoder layer is in memory at a time (the `LayerSource` loads it),
and the activations live in an `ActivationStore` that spills to ``work_dir`` past the budget,
as the calibrated quantizers' do.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ingot.calibration.activations import ActivationSpace, ActivationStore, budget_from_env
from ingot.calibration.dataset import CalibrationSet

from ..model.kv_quant import KVScales
from ..model.kv_rounding import KV_QMAX, KVDtype, KVQuant
from ..model.layer_source import LayerSource
from ..model.llama import embedding_rows
from ..model.qlinear import dequantized
from .layerwise import LayerForward

__all__ = ["calibrate_kv_scales", "head_amax"]

# A head that is zero on every calibration token still needs a positive scale; anything it
# produces later saturates instead of dividing by zero.
_MIN_AMAX = 1e-8


@torch.no_grad()
def calibrate_kv_scales(
    source: LayerSource,
    calibration: CalibrationSet,
    dtype: KVDtype,
    work_dir: Path,
    *,
    device: torch.device | str = "cpu",
    budget_bytes: int | None = None,
) -> KVScales:
    """The scales of ``dtype`` for every layer and KV head of ``source`` (the quantized IR),
    from the calibration windows; activations past ``budget_bytes`` ($INGOT_ACTIVATION_BUDGET_MB
    by default) spill to ``work_dir``."""
    if dtype not in KV_QMAX:
        raise ValueError(f"kv_cache.dtype: {dtype!r} is not a quantized KV dtype (int8, fp8)")
    cfg = source.cfg
    tokens = torch.as_tensor(calibration.tokens)  # [N, T]
    n, t = tokens.shape
    forward = LayerForward.for_config(cfg, n, t, device)
    budget = budget_from_env() if budget_bytes is None else budget_bytes
    space = ActivationSpace(work_dir, budget, device)
    x = space.store("kv-0", (n, t, cfg.hidden_size))
    table = source.embedding()
    for a in range(0, n, forward.batch):
        x.write(a, embedding_rows(cfg, table, tokens[a : a + forward.batch]))
    del table
    k_scales, v_scales = [], []
    try:
        for i in range(cfg.num_layers):
            layer = source.layer(i)
            before = layer.attn.kv_quant  # a model in memory gets its own layer back as it was
            layer.to(forward.device)
            try:
                with dequantized(layer):
                    amax_k, amax_v = head_amax(layer, x, forward)  # [Hkv] each
                    k_scales.append(amax_k.clamp_min(_MIN_AMAX) / KV_QMAX[dtype])
                    v_scales.append(amax_v.clamp_min(_MIN_AMAX) / KV_QMAX[dtype])
                    if i + 1 < cfg.num_layers:  # the last layer's outputs feed nothing
                        rounding = KVQuant(dtype, k_scales[-1], v_scales[-1])
                        layer.attn.kv_quant = rounding.to(forward.device)
                        out = space.store(f"kv-{(i + 1) % 2}", x.shape)
                        x = _advance(x, out, layer, forward)
            finally:
                layer.attn.kv_quant = before
                layer.to("cpu")
            del layer
    finally:
        x.close()
    return KVScales(dtype, torch.stack(k_scales), torch.stack(v_scales))


def head_amax(
    layer: nn.Module, x: ActivationStore, forward: LayerForward
) -> tuple[torch.Tensor, torch.Tensor]:
    """max |K| (rotated) and max |V| per KV head [Hkv] of ``layer`` over the inputs ``x``
    [N, T, hidden], on the CPU."""
    attn = layer.attn
    amax_k = torch.zeros(attn.num_kv_heads, device=forward.device)
    amax_v = torch.zeros(attn.num_kv_heads, device=forward.device)
    for a in range(0, len(x), forward.batch):
        normed = layer.attn_norm(x.read(a, min(a + forward.batch, len(x))))
        cos, sin, _ = forward.rope_and_mask(layer)
        k, v = attn.project_kv(normed, cos, sin)  # [b, Hkv, T, D]
        amax_k = torch.maximum(amax_k, k.abs().amax(dim=(0, 2, 3)))
        amax_v = torch.maximum(amax_v, v.abs().amax(dim=(0, 2, 3)))
    return amax_k.cpu(), amax_v.cpu()


def _advance(
    x: ActivationStore, out: ActivationStore, layer: nn.Module, forward: LayerForward
) -> ActivationStore:
    """``layer``'s outputs on ``x`` written to ``out``; ``x`` is closed."""
    for a in range(0, len(x), forward.batch):
        out.write(a, forward(layer, x.read(a, min(a + forward.batch, len(x)))))
    x.close()
    return out
