"""The building blocks of a decoder layer: norms, attention, gated MLP, the sparse mixture of
experts, and the pre-norm layer that joins them.

A block takes what varies between families from the model's family (`cfg.family`): each
linear's shape and bias from the family's layer table, the norm and the MLP's activation by
name from `NORMS` and `ACTIVATIONS`, the blocks this IR implements. A family made of these
blocks is one descriptor module; a family needing another block adds it here and to the ONNX
decoder's matching table (export/decoder.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .architecture import dim_size, has_bias
from .config import ModelConfig
from .family import LayerSpec
from .kv_rounding import KVQuant
from .rope import apply_rotary

__all__ = [
    "ACTIVATIONS",
    "NORMS",
    "RMSNorm",
    "Attention",
    "MLP",
    "SparseMoE",
    "DecoderLayer",
    "make_norm",
]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


# The blocks a family names (`ModelFamily.norm`, `.activation`): name -> what computes it.
NORMS: dict[str, Callable[[int, float], nn.Module]] = {"rms": RMSNorm}
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"silu": nn.functional.silu}


def make_norm(cfg: ModelConfig) -> nn.Module:
    """The family's norm over the hidden size (a layer's norms and the final one)."""
    return NORMS[cfg.family.norm](cfg.hidden_size, cfg.rms_norm_eps)


def _linear(cfg: ModelConfig, name: str, spec: LayerSpec | None = None) -> nn.Linear:
    """The family's linear `name` (inside the layer): its shape and bias from the table of
    `spec` (None: the family's dense layer)."""
    m = (spec or cfg.family.layer).linear(name)
    return nn.Linear(dim_size(cfg, m.in_dim), dim_size(cfg, m.out_dim), bias=has_bias(cfg, m))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.rotary_dim = cfg.rotated_dim  # the leading channels of a head RoPE rotates
        self.q_proj = _linear(cfg, "attn.q_proj")
        self.k_proj = _linear(cfg, "attn.k_proj")
        self.v_proj = _linear(cfg, "attn.v_proj")
        self.o_proj = _linear(cfg, "attn.o_proj")
        # Qwen3 / Gemma 3: the family's norm over head_dim on each q and k head before RoPE
        # (by name, `norm`: the ONNX decoder emits the same block). None: no such norms.
        self.norm = cfg.family.norm
        qk_norm = cfg.family.qk_norm
        self.q_norm = NORMS[self.norm](cfg.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = NORMS[self.norm](cfg.head_dim, cfg.rms_norm_eps) if qk_norm else None
        # A quantized KV cache (kv_rounding.py): K and V are rounded to the pool's codes before
        # anything attends to them. None: the pool keeps them as computed (fp32).
        self.kv_quant: KVQuant | None = None

    def project_kv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, T, hidden] -> K (rotated) and V as computed, [B, Hkv, T, D] each: what the
        pool stores before any rounding."""
        b, t, _ = x.shape
        k = _heads(self.k_proj(x), self.num_kv_heads, self.k_norm)  # [B, Hkv, T, D]
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
        q = _heads(self.q_proj(x), self.num_heads, self.q_norm)  # [B, H, T, D]
        q = apply_rotary(q, cos, sin)
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


def _heads(x: torch.Tensor, heads: int, norm: nn.Module | None) -> torch.Tensor:
    """A projection's output [B, T, H*D] as heads [B, H, T, D], each normed over D by `norm`
    when the family has per-head norms."""
    b, t, _ = x.shape
    x = x.view(b, t, heads, -1)  # [B, T, H, D]
    return (x if norm is None else norm(x)).transpose(1, 2)


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)); act is the family's (silu: SwiGLU). The layer's
    MLP, or (`prefix` "mlp.experts.{e}" of the sparse layer's `spec`) one expert."""

    def __init__(self, cfg: ModelConfig, prefix: str = "mlp", spec: LayerSpec | None = None):
        super().__init__()
        self.activation = cfg.family.activation  # by name: the ONNX decoder emits the same
        self.gate_proj = _linear(cfg, f"{prefix}.gate_proj", spec)
        self.up_proj = _linear(cfg, f"{prefix}.up_proj", spec)
        self.down_proj = _linear(cfg, f"{prefix}.down_proj", spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = ACTIVATIONS[self.activation]
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))


class SparseMoE(nn.Module):
    """A sparse mixture of experts: the router scores every expert per token, the `top_k`
    best compute, and their outputs sum weighted by the softmax of the router's logits (over
    every expert, in fp32), renormalised over the chosen when `norm_topk_prob` (Mixtral's
    softmax over the top-k logits is that renormalisation)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        spec = cfg.family.sparse_layer
        self.router = _linear(cfg, "mlp.router", spec)  # hidden -> one logit per expert
        self.experts = nn.ModuleList(
            MLP(cfg, f"mlp.experts.{e}", spec) for e in range(cfg.num_experts)
        )
        self.top_k = cfg.top_k
        self.norm_topk_prob = cfg.norm_topk_prob

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [N, hidden] -> (weights [N, top_k] fp32, experts [N, top_k] int64)."""
        probs = torch.softmax(self.router(x).float(), dim=-1)  # [N, E]
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, T, hidden] -> [B, T, hidden]: each expert runs on the tokens routed to it."""
        flat = x.reshape(-1, x.shape[-1])  # [N, hidden]
        weights, chosen = self.route(flat)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)  # [n] each: the tokens choosing e
            if token.numel():
                y = expert(flat[token]) * weights[token, slot, None].to(x.dtype)
                out.index_add_(0, token, y)
        return out.view_as(x)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        self.index = index  # its place in the model: what it holds is `cfg.layer_spec(index)`
        # The attention window of this layer (None: the whole context); the caller hands
        # `forward` the mask of this window (`llama.window_masks`).
        self.window = cfg.window_of(index)
        self.attn_norm = make_norm(cfg)
        self.attn = Attention(cfg)
        self.mlp_norm = make_norm(cfg)
        self.mlp = SparseMoE(cfg) if index in cfg.moe_layers else MLP(cfg)

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
