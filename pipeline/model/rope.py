"""Rotary position embedding: inverse frequencies for each scaling variant, and cos/sin tables.

RoPE rotates the first `ModelConfig.rotated_dim` channels of each head (all of them unless
the config's partial_rotary_factor says fewer); the tables are [..., rotated_dim / 2].

LongRoPE (Phi-3) picks its short or long factors by the sequence length, as transformers does
per call (the longest position of the call); like dynamic NTK, a switch mid-sequence would make
the keys already cached inconsistent with the queries. An exported graph therefore takes one
table for its whole context, the one for a sequence of the export's max_seq_len (long factors
when max_seq_len > original_max_position_embeddings, as llama.cpp decides by its context
size): `table`.
"""

from __future__ import annotations

import math

import torch

from .config import ModelConfig

__all__ = ["SCALINGS", "inv_frequencies", "cos_sin", "table", "apply_rotary"]

# The rope_type values `inv_frequencies` computes (a family accepts some of them:
# `ModelFamily.rope_scalings`).
SCALINGS = ("default", "linear", "dynamic", "llama3", "longrope")


def inv_frequencies(cfg: ModelConfig, seq_len: int | None = None) -> torch.Tensor:
    """Inverse frequencies [R/2] in float32 (R = the rotated channels of a head), as
    transformers computes them.

    ``seq_len`` matters only for dynamic NTK scaling, whose base grows with the
    longest position seen in the current call, and for LongRoPE (long factors beyond
    original_max_position_embeddings).
    """
    rope, dim = cfg.rope, cfg.rotated_dim
    base = rope.theta
    if rope.type == "dynamic" and seq_len is not None:
        original = rope.original_max_position_embeddings or cfg.max_position_embeddings
        if seq_len > original:
            base = base * ((rope.factor * seq_len / original) - (rope.factor - 1)) ** (
                dim / (dim - 2)
            )
    powers = base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)  # [R/2]
    if rope.type == "longrope":
        long = seq_len is not None and seq_len > rope.original_max_position_embeddings
        factors = rope.long_factor if long else rope.short_factor
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) * powers)
    inv = 1.0 / powers
    if rope.type == "linear":
        inv = inv / rope.factor
    elif rope.type == "llama3":
        inv = _llama3_scale(inv, cfg)
    return inv


def _llama3_scale(inv: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, a smooth ramp between.
    rope = cfg.rope
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
    cfg: ModelConfig, positions: torch.Tensor, seq_len: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [..., R/2] for integer ``positions`` [...] (R: the rotated channels of a
    head), times LongRoPE's attention factor (1.0 otherwise)."""
    inv = inv_frequencies(cfg, seq_len).to(positions.device)
    freqs = positions.to(torch.float32)[..., None] * inv
    scale = cfg.rope.attention_factor
    if scale == 1.0:
        return freqs.cos(), freqs.sin()
    return freqs.cos() * scale, freqs.sin() * scale


def table(cfg: ModelConfig, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_seq_len, R/2] for positions 0..max_seq_len-1: the one table an exported
    graph holds for its whole context (LongRoPE: the factors of a sequence of max_seq_len)."""
    return cos_sin(cfg, torch.arange(max_seq_len), seq_len=max_seq_len)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (the non-interleaved layout of HF Llama and ONNX RotaryEmbedding) on
    the first R channels of each head; the rest pass through (partial rotary).

    x: [B, H, T, D]; cos, sin: [B, T, R/2].
    """
    half = cos.shape[-1]
    rotated, passed = x[..., : 2 * half], x[..., 2 * half :]
    x1, x2 = rotated.chunk(2, dim=-1)
    cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, R/2]
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out if passed.shape[-1] == 0 else torch.cat((out, passed), dim=-1)
