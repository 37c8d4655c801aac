"""Bytes a decode step must read: weights once each, one embedding row and the KV cache of every
sequence in the batch.

This is the floor of DRAM traffic per step (every weight is read exactly once, nothing is
re-read, activations stay in cache); the measured bandwidth divided by it gives the
bandwidth-bound tokens/s an engine could reach at best (times the batch: one step gives every
sequence a token).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ingot.pipeline.model.config import ModelConfig

__all__ = [
    "FLOAT32",
    "INT4_G32",
    "Q4_0",
    "WeightFormat",
    "decode_traffic",
    "mean_decode_context",
]


@dataclass(frozen=True, slots=True)
class WeightFormat:
    """How one linear's weight is stored: float (bits None) or integer codes + scales."""

    bits: int | None = None  # None: float of `float_bytes` per parameter
    group_size: int = -1  # -1: one scale per output channel
    symmetric: bool = True  # False: one zero point (of `bits` bits) per group as well
    float_bytes: int = 4
    scale_bytes: int = 4  # fp32 scales (ONNX Runtime's MatMulNBits); 2 for GGUF's fp16

    def bytes_for(self, out_features: int, in_features: int) -> float:
        params = out_features * in_features
        if self.bits is None:
            return params * self.float_bytes
        group = in_features if self.group_size == -1 else self.group_size
        groups = out_features * (in_features // group)
        zero_points = 0 if self.symmetric else groups * self.bits / 8
        return params * self.bits / 8 + groups * self.scale_bytes + zero_points

    def describe(self) -> str:
        if self.bits is None:
            return f"fp{8 * self.float_bytes}"
        group = "per-channel" if self.group_size == -1 else f"g{self.group_size}"
        scales = "" if self.scale_bytes == 4 else f" fp{8 * self.scale_bytes} scales"
        return f"int{self.bits} {group} {'sym' if self.symmetric else 'asym'}{scales}"


FLOAT32 = WeightFormat()
INT4_G32 = WeightFormat(bits=4, group_size=32)  # ingot's and onnxruntime-genai's MatMulNBits
Q4_0 = WeightFormat(bits=4, group_size=32, scale_bytes=2)  # GGUF Q4_0: fp16 scale per 32


def mean_decode_context(prompt_len: int, new_tokens: int) -> float:
    """Mean number of cached tokens a decode step attends to.

    The first token comes from the prefill; decode step j (1 .. new_tokens-1) feeds the j-th
    output token and attends to prompt_len + j tokens (itself included).
    """
    steps = range(1, new_tokens)
    return sum(prompt_len + j for j in steps) / max(1, len(steps))


def decode_traffic(
    cfg: ModelConfig,
    layers: WeightFormat,
    lm_head: WeightFormat,
    mean_context: float,
    kv_bytes: int = 4,
    batch: int = 1,
    float_bytes: int = 4,
) -> dict[str, Any]:
    """Bytes read per decode step of `batch` sequences, by part, for weights in `layers` /
    `lm_head` formats, and per token (a step gives each sequence one token).

    Embeddings, norms and biases stay float (`float_bytes`); a tied lm_head is read in full
    anyway, since the logits need every row.
    """
    h, d = cfg.hidden_size, cfg.head_dim
    q_out, kv_out = cfg.num_heads * d, cfg.num_kv_heads * d
    shapes = [  # (out, in) of each linear in one decoder layer
        (q_out, h),
        (kv_out, h),
        (kv_out, h),
        (h, q_out),
        (cfg.intermediate_size, h),
        (cfg.intermediate_size, h),
        (h, cfg.intermediate_size),
    ]
    per_layer_linears = sum(layers.bytes_for(n, k) for n, k in shapes)
    biases = (q_out + 2 * kv_out) * cfg.qkv_bias + h * cfg.o_bias
    per_layer_float = (2 * h + biases) * float_bytes  # two RMSNorm weights + biases
    kv_per_token = cfg.num_layers * 2 * cfg.num_kv_heads * d * kv_bytes
    parts = {
        "layer_linears": cfg.num_layers * per_layer_linears,
        "norms_and_biases": cfg.num_layers * per_layer_float + h * float_bytes,
        "lm_head": lm_head.bytes_for(cfg.vocab_size, h),
        "embedding_rows": batch * h * float_bytes,
        "kv_cache": batch * kv_per_token * mean_context,
    }
    per_step = sum(parts.values())
    return {
        "batch": batch,
        "bytes_per_step": per_step,
        "bytes_per_token": per_step / batch,
        "parts": parts,
        "layers_format": asdict(layers) | {"name": layers.describe()},
        "lm_head_format": asdict(lm_head) | {"name": lm_head.describe()},
        "mean_context_tokens": mean_context,
        "kv_bytes_per_element": kv_bytes,
    }
