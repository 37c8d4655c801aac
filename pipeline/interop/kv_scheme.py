"""The quantized KV cache (`kv_cache.dtype` fp8) in a compressed-tensors checkpoint: what
llm-compressor writes for its FP8 KV cache, from the export stage's calibrated scales.

- config: `quantization_config.kv_cache_scheme` = num_bits 8, type float, symmetric, static
  (dynamic false), strategy "tensor";
- tensors: `model.layers.{i}.self_attn.k_scale` / `v_scale`, float32 [1] (value = code x scale,
  ingot's convention and vLLM's).

ingot calibrates one scale per layer and KV head (graph.json `kv_scales`). compressed-tensors
0.20 and vLLM also know a per-head strategy ("attn_head", scales [Hkv, 1, 1]), but vLLM's CPU
attention backend refuses per-head scales ("per-head quant scales not supported") and vLLM's
other backends but FlashAttention collapse them to their max; so each layer's scale is the
max over its heads: every head's amax still maps inside the E4M3 range (a coarser grid for the
smaller heads, never saturation that ingot's own scales would not have).

int8: vLLM has no int8 KV cache (its compressed-tensors loader refuses any kv_cache_scheme that
is not 8-bit float), so `interop_problems` refuses compressed-tensors with an int8 KV cache.
GPTQ, AWQ and GGUF hold no KV scheme: their writers ignore the KV cache.
"""

from __future__ import annotations

import torch

from ..model.kv_quant import KVScales
from .errors import InteropError

__all__ = ["KV_SCHEME_FORMATS", "kv_cache_scheme", "kv_scale_tensors"]

# The interop formats that store a KV cache scheme, with the KV dtypes each holds.
KV_SCHEME_FORMATS = {"compressed-tensors": ("fp8",)}


def kv_cache_scheme(scales: KVScales):
    """compressed-tensors' `QuantizationArgs` for the KV cache: llm-compressor's FP8 one."""
    # compressed-tensors takes ~3 s to import: only when such a checkpoint is written
    from compressed_tensors.quantization import QuantizationArgs

    if scales.dtype not in KV_SCHEME_FORMATS["compressed-tensors"]:
        raise InteropError(
            f"interop compressed-tensors: no KV cache scheme for kv_cache.dtype {scales.dtype}"
        )
    return QuantizationArgs(
        num_bits=8, type="float", symmetric=True, dynamic=False, strategy="tensor"
    )


def kv_scale_tensors(scales: KVScales) -> dict[str, torch.Tensor]:
    """{model.layers.{i}.self_attn.k_scale / v_scale: float32 [1]}, each the max over the
    layer's KV heads."""
    tensors = {}
    for kind, per_head in (("k", scales.k), ("v", scales.v)):
        for i, layer in enumerate(per_head):
            tensors[f"model.layers.{i}.self_attn.{kind}_scale"] = layer.max().reshape(1).float()
    return tensors
