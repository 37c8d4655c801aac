"""The token embedding with quantized rows: the table [V, H] as integer codes and scales in
blocks along H, the layout of a quantized lm_head's weight [N = V, K = H], so a tied model
keeps one quantized tensor that the lookup and lm_head both read.

A lookup dequantizes only the rows it gathers, with the same two operations as
`QuantizedLinear.dequantize` (bit for bit the rows of the dequantized table).
"""

from __future__ import annotations

import torch
from torch import nn

from .qlinear import QuantizedLinear
from .selection import EMBEDDING

__all__ = ["EMBEDDING", "QuantizedEmbedding"]


class QuantizedEmbedding(nn.Module):
    """codes [V, H] int8 (symmetric) or uint8 (with zero points), scales [V, H / g] float32,
    zero_points as the codes or None: one row per token, blocks of g along H (g = H: one
    scale per row). The buffers have a QuantizedLinear's names (``.codes``, ``.scales``,
    ``.zero_points``), so the IR stores the embedding as it stores a quantized linear."""

    def __init__(
        self,
        codes: torch.Tensor,
        scales: torch.Tensor,
        zero_points: torch.Tensor | None,
        bits: int,
        group_size: int,
    ) -> None:
        super().__init__()
        v, h = codes.shape
        if codes.dtype not in (torch.int8, torch.uint8):
            raise ValueError(f"embedding codes must be int8 or uint8 (got {codes.dtype})")
        if h % group_size or scales.shape != (v, h // group_size):
            raise ValueError(
                f"scales {tuple(scales.shape)} do not fit codes {(v, h)} / g{group_size}"
            )
        self.bits, self.group_size = bits, group_size
        self.num_embeddings, self.embedding_dim = v, h
        self.register_buffer("codes", codes)
        self.register_buffer("scales", scales.to(torch.float32))
        self.register_buffer("zero_points", zero_points)

    @classmethod
    def of(cls, q: QuantizedLinear) -> QuantizedEmbedding:
        """The embedding whose table is `q`'s weight [V, H] (the tensors themselves)."""
        if q.fp8 or q.g_idx is not None or q.bias is not None or q.input_quant is not None:
            raise ValueError(
                "an embedding holds integer codes in contiguous groups, without bias or "
                f"input quantization (got {q.extra_repr()})"
            )
        return cls(q.codes, q.scales, q.zero_points, q.bits, q.group_size)

    def linear(self) -> QuantizedLinear:
        """lm_head computing with this table (a tied model): the same tensors, not a copy."""
        return QuantizedLinear(
            self.codes, self.scales, self.zero_points, self.bits, self.group_size
        )

    @property
    def symmetric(self) -> bool:
        return self.zero_points is None

    def dequantize(self) -> torch.Tensor:
        """The float table [V, H]."""
        return self.linear().dequantize()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] -> rows [..., H], only the gathered rows dequantized."""
        g, h = self.group_size, self.embedding_dim
        codes = self.codes[ids].to(torch.float32)  # [..., H]
        groups = codes.view(*ids.shape, h // g, g)  # [..., H/g, g]
        if self.zero_points is not None:
            groups.sub_(self.zero_points[ids].to(torch.float32)[..., None])
        groups.mul_(self.scales[ids][..., None])
        return codes

    def extra_repr(self) -> str:
        kind = "sym" if self.symmetric else "asym"
        v, h = self.num_embeddings, self.embedding_dim
        return f"{v}x{h}, int{self.bits} g{self.group_size} {kind}"
