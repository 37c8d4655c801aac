"""Rotary position embedding: inverse frequencies for each scaling variant, and cos/sin tables."""

from __future__ import annotations

import math

import torch

from .config import ModelConfig, RopeConfig

__all__ = ["SCALINGS", "inv_frequencies", "cos_sin", "apply_rotary"]

# The rope_type values `inv_frequencies` computes (a family accepts some of them:
# `ModelFamily.rope_scalings`).
SCALINGS = ("default", "linear", "dynamic", "llama3")


def inv_frequencies(
    cfg: ModelConfig, seq_len: int | None = None, rope: RopeConfig | None = None
) -> torch.Tensor:
    """Inverse frequencies [D/2] in float32 (float64 math, as transformers does it) of `rope`
    (None: the model's, ``cfg.rope``; a layer's: ``cfg.rope_of(i)``).

    ``seq_len`` matters only for dynamic NTK scaling, whose base grows with the
    longest position seen in the current call.
    """
    rope = rope or cfg.rope
    dim = cfg.head_dim
    base = rope.theta
    if rope.type == "dynamic" and seq_len is not None:
        original = rope.original_max_position_embeddings or cfg.max_position_embeddings
        if seq_len > original:
            base = base * ((rope.factor * seq_len / original) - (rope.factor - 1)) ** (
                dim / (dim - 2)
            )
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rope.type == "linear":
        inv = inv / rope.factor
    elif rope.type == "llama3":
        inv = _llama3_scale(inv, rope)
    return inv


def _llama3_scale(inv: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, a smooth ramp between.
    original = rope.original_max_position_embeddings or 8192
    low_wavelen = original / rope.low_freq_factor
    high_wavelen = original / rope.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
    smooth = (original / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def cos_sin(
    cfg: ModelConfig,
    positions: torch.Tensor,
    seq_len: int | None = None,
    rope: RopeConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [..., D/2] for integer ``positions`` [...], of `rope` (None: ``cfg.rope``)."""
    inv = inv_frequencies(cfg, seq_len, rope).to(positions.device)
    freqs = positions.to(torch.float32)[..., None] * inv
    return freqs.cos(), freqs.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (the non-interleaved layout of HF Llama and ONNX RotaryEmbedding).

    x: [B, H, T, D]; cos, sin: [B, T, D/2].
    """
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, D/2]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
