"""The building blocks of a Llama-family decoder layer: RMSNorm, attention, SwiGLU MLP."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .config import ModelConfig
from .rope import apply_rotary

if TYPE_CHECKING:
    from .kv_quant import KVQuant

__all__ = ["RMSNorm", "Attention", "MLP", "DecoderLayer"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=cfg.o_bias)
        # A quantized KV cache (kv_quant.py): K and V are rounded to the pool's codes before
        # anything attends to them. None: the pool keeps them as computed (fp32).
        self.kv_quant: KVQuant | None = None

    def project_kv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, T, hidden] -> K (rotated) and V as computed, [B, Hkv, T, D] each: what the
        pool stores before any rounding."""
        b, t, _ = x.shape
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rotary(k, cos, sin), v

    def stored_kv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, T, hidden] -> K (rotated) and V as the pool holds them, [B, Hkv, T, D] each:
        rounded to the pool's codes' values with a quantized KV cache."""
        k, v = self.project_kv(x, cos, sin)
        if self.kv_quant is not None:
            k, v = self.kv_quant(k, v)
        return k, v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x: [B, T, hidden]; mask: [B, 1, T, P+T] bool (True = attend);
        past k, v: [B, Hkv, P, D]."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        q = apply_rotary(q, cos, sin)  # [B, H, T, D]
        k, v = self.stored_kv(x, cos, sin)  # [B, Hkv, T, D]
        if past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        groups = self.num_heads // self.num_kv_heads
        out = nn.functional.scaled_dot_product_attention(
            q,
            k.repeat_interleave(groups, dim=1),
            v.repeat_interleave(groups, dim=1),
            attn_mask=mask,
        )  # [B, H, T, D]
        out = out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)
        return self.o_proj(out), (k, v)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def stored_kv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V `forward` returns for x [B, T, hidden], [B, Hkv, T, D] each, without
        computing the rest of the layer (attention, o_proj, MLP)."""
        return self.attn.stored_kv(self.attn_norm(x), cos, sin)

    def forward(self, x, cos, sin, mask, past=None):
        h, kv = self.attn(self.attn_norm(x), cos, sin, mask, past)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), kv
