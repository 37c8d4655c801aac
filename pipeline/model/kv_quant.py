"""A quantized KV cache's scales (``kv_cache.dtype`` int8 / fp8) and how they reach the IR.

`KVScales` holds every layer's per-head K and V scales (calibrated by
`calibrate_kv_scales` in pipeline/quantize/kv_scales.py); `attach_kv_scales` gives a whole
`LlamaModel`'s layers their rounding, `KVQuantLayers` a `LayerSource`'s. The rounding itself
(the codes, `KVQuant` on `Attention.kv_quant`) is kv_rounding.py's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .kv_rounding import KV_QMAX, KVDtype, KVQuant
from .layer_source import LayerSource
from .layers import DecoderLayer, RMSNorm
from .qembedding import QuantizedEmbedding

__all__ = ["KVQuantLayers", "KVScales", "attach_kv_scales"]


@dataclass(frozen=True)
class KVScales:
    """Every layer's K and V scales: k, v [num_layers, Hkv] float32 (value = code * scale)."""

    dtype: KVDtype
    k: torch.Tensor
    v: torch.Tensor

    def __post_init__(self) -> None:
        if self.dtype not in KV_QMAX:
            raise ValueError(f"kv_cache.dtype: {self.dtype!r} is not a quantized KV dtype")
        if self.k.shape != self.v.shape or self.k.dim() != 2:
            raise ValueError(f"KV scales: k {tuple(self.k.shape)}, v {tuple(self.v.shape)}")
        for name, t in (("k", self.k), ("v", self.v)):
            if not bool(torch.isfinite(t).all() and (t > 0).all()):
                raise ValueError(f"KV scales: every {name} scale must be finite and > 0")

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    def layer(self, i: int) -> KVQuant:
        return KVQuant(self.dtype, self.k[i], self.v[i])

    def to_json(self) -> dict[str, Any]:
        """{"k": [[per head] per layer], "v": ...}: float32 values as exact JSON floats."""
        return {"k": self.k.tolist(), "v": self.v.tolist()}

    @classmethod
    def from_json(cls, dtype: KVDtype, data: dict[str, Any]) -> KVScales:
        f32 = torch.float32
        return cls(dtype, torch.tensor(data["k"], dtype=f32), torch.tensor(data["v"], dtype=f32))


def attach_kv_scales(model: nn.Module, scales: KVScales | None) -> nn.Module:
    """Give every decoder layer of a `LlamaModel` its KV rounding (None: remove it)."""
    if scales is not None and scales.num_layers != len(model.layers):
        raise ValueError(f"KV scales for {scales.num_layers} layers, model has {len(model.layers)}")
    for i, layer in enumerate(model.layers):
        layer.attn.kv_quant = None if scales is None else scales.layer(i)
    return model


class KVQuantLayers:
    """A `LayerSource` whose decoder layers round their K/V as the pool stores them.

    The source's own layer is left as it was (a memory source hands out the model's own
    layers): each call returns a shallow copy sharing its weights."""

    def __init__(self, source: LayerSource, scales: KVScales) -> None:
        if scales.num_layers != source.cfg.num_layers:
            raise ValueError(
                f"KV scales for {scales.num_layers} layers, model has {source.cfg.num_layers}"
            )
        self.source, self.scales = source, scales

    @property
    def cfg(self) -> Any:
        return self.source.cfg

    @property
    def lm_head_tied(self) -> bool:
        return self.source.lm_head_tied

    def embedding(self) -> torch.Tensor:
        return self.source.embedding()

    def quantized_embedding(self) -> QuantizedEmbedding | None:
        return self.source.quantized_embedding()

    def layer(self, i: int) -> DecoderLayer:
        return _rounding(self.source.layer(i), self.scales.layer(i))

    def final_norm(self) -> RMSNorm:
        return self.source.final_norm()

    def lm_head(self) -> nn.Module:
        return self.source.lm_head()


def _rounding(layer: DecoderLayer, quant: KVQuant) -> DecoderLayer:
    """``layer`` with its attention rounding K/V by ``quant``: shallow copies of the layer and
    its attention with submodule tables of their own (setting or swapping a submodule of the
    copy never reaches the original), the same parameters and buffers."""
    attn = copy.copy(layer.attn)
    attn._modules = dict(attn._modules)
    attn.kv_quant = quant
    out = copy.copy(layer)
    out._modules = dict(out._modules)
    out.attn = attn
    return out
