"""AWQ (Lin et al., 2023): activation-aware weight quantization.

Input channels that carry large activations matter most; scaling them up in the weight (by s)
and down in whatever produces the activation (by 1/s) makes their weights round more finely
while the float model computes exactly the same function.

- Scale search: for alpha in {0, 1/20, ..., 19/20}, s = mean|x|^alpha / mean|w|^(1 - alpha)
  (mean|w| of the group-normalized weights, as AutoAWQ's "duo scaling"), normalized so that
  sqrt(max s * min s) = 1; s = 1 (plain rounding) is a candidate too, so the search can only
  improve on RTN. The loss is the mean squared error of the inspected module's output with the
  group's weights replaced by Q(W diag s) diag s^-1, on a fixed subset of whole calibration
  samples: the attention block for q,k,v, the MLP for gate,up (as AutoAWQ), the linear itself
  for o and down.
- Clip search: per output channel and weight group, the max |w| is shrunk by 0, 1/20, ...,
  9/20 and the one with the smallest output error of that group (on 512 of the sample tokens)
  kept (skipped for q_proj and k_proj, whose errors the attention softmax amplifies, as
  AutoAWQ does).
- Scaling groups: `model.architecture.scaling_groups` (attn_norm -> q,k,v; v_proj -> o_proj
  without GQA; mlp_norm -> gate,up; up_proj -> down_proj). The 1/s is folded into the norm
  weight or the rows of the preceding linear (if that linear is already quantized, into its
  scales: rows of codes times a per-row constant), so nothing is added to the graph.

A scaling group is searched only when every linear it scales is selected by an AWQ entry;
otherwise its AWQ linears get the clip search alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..model.architecture import QKV
from ..model.layers import RMSNorm
from ..model.qlinear import QuantizedLinear
from .rtn import quantize_weight

__all__ = [
    "AWQ_GRID",
    "apply_scales",
    "fake_quantize",
    "quantize_linear_awq",
    "search_clip",
    "search_scales",
]

AWQ_GRID = 20
_CLIP_STEPS = 10  # shrink by 0 .. 9/20 of the max, AutoAWQ's max_shrink 0.5
_CLIP_TOKENS = 512  # AutoAWQ's n_sample_token: every (row, group) error is measured on these
_NO_CLIP = QKV[:2]  # q_proj, k_proj: their outputs meet in the attention scores


def fake_quantize(w: torch.Tensor, bits: int, group_size: int, symmetric: bool) -> torch.Tensor:
    """The float weight that round-to-nearest codes of ``w`` stand for."""
    codes, scales, zeros = quantize_weight(w, bits, group_size, symmetric)
    return QuantizedLinear(codes, scales, zeros, bits, _group(w, group_size)).dequantize()


def _group(w: torch.Tensor, group_size: int) -> int:
    return w.shape[1] if group_size == -1 else group_size


def _weight_mean(weights: list[torch.Tensor], group_size: int) -> torch.Tensor:
    """Mean over output rows of |w| / max |w| of its group: [K]."""
    w = torch.cat(weights).abs()  # [N, K]
    n, k = w.shape
    g = _group(w, group_size)
    grouped = w.view(n, k // g, g)
    normed = grouped / (grouped.amax(-1, keepdim=True) + 1e-6)
    return normed.view(n, k).mean(0)


def search_scales(
    x_mean: torch.Tensor,
    weights: list[torch.Tensor],
    quantizers: list[tuple[int, int, bool]],
    output: Callable[[list[torch.Tensor]], torch.Tensor],
) -> torch.Tensor:
    """The per-input-channel scale s [K] that best preserves the inspected module's output.

    x_mean [K]: mean |x| per input channel; weights: the group's float weights [N_j, K];
    quantizers: (bits, group_size, symmetric) of each; ``output(ws)``: the module's output on
    the sample tokens when the group's linears hold the weights ``ws``.
    """
    w_mean = _weight_mean(weights, quantizers[0][1])
    reference = output(weights)

    def loss(s: torch.Tensor | None) -> float:
        candidate = []
        for w, (bits, group_size, symmetric) in zip(weights, quantizers, strict=True):
            q = fake_quantize(w if s is None else w * s, bits, group_size, symmetric)
            candidate.append(q if s is None else q / s)
        return float((output(candidate) - reference).pow(2).mean())

    best, best_loss = torch.ones_like(x_mean), loss(None)
    for step in range(AWQ_GRID):
        alpha = step / AWQ_GRID
        s = (x_mean.pow(alpha) / (w_mean.pow(1 - alpha) + 1e-4)).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        current = loss(s)
        if current < best_loss:
            best, best_loss = s, current
    return best


@torch.no_grad()
def apply_scales(prev: nn.Module, linears: list[nn.Module], s: torch.Tensor) -> None:
    """Fold s in: ``prev``'s output channels / s, the ``linears``' input channels * s.

    ``prev`` is a norm of `layers.NORMS` (its multiplier divided: `RMSNorm.divide_`), a float
    nn.Linear or a QuantizedLinear (whose rows' scales are divided: (codes - z) * scale / s),
    so the float function is unchanged.
    """
    if isinstance(prev, RMSNorm):
        prev.divide_(s)
    elif isinstance(prev, QuantizedLinear):
        prev.scales.div_(s[:, None])
    elif isinstance(prev, nn.Linear):
        prev.weight.div_(s[:, None])
    else:
        raise TypeError(f"cannot fold AWQ scales into a {type(prev).__name__}")
    if getattr(prev, "bias", None) is not None:
        prev.bias.div_(s)
    for linear in linears:
        linear.weight.mul_(s[None, :])


def search_clip(
    w: torch.Tensor, x: torch.Tensor, bits: int, group_size: int, symmetric: bool
) -> torch.Tensor:
    """Per (output row, group) the max |w| [N, G] whose clipped quantization best preserves
    that group's contribution x_g w_g^T on the sample tokens x [M, K]."""
    n, k = w.shape
    g = _group(w, group_size)
    groups = k // g
    x = x[:: max(1, len(x) // _CLIP_TOKENS)][:_CLIP_TOKENS]
    xg = x.reshape(-1, groups, g).transpose(0, 1)  # [G, M, g]
    wg = w.view(n, groups, g)
    org_max = wg.abs().amax(-1)  # [N, G]
    best_max, best_err = org_max.clone(), None
    for step in range(_CLIP_STEPS):
        max_val = org_max * (1 - step / AWQ_GRID)
        clipped = torch.maximum(torch.minimum(wg, max_val[..., None]), -max_val[..., None])
        q = fake_quantize(clipped.view(n, k), bits, group_size, symmetric).view(n, groups, g)
        diff = (q - wg).transpose(0, 1).transpose(1, 2)  # [G, g, N]
        err = torch.bmm(xg, diff).pow(2).sum(1).T  # [N, G]
        if best_err is None:
            best_err = err
            continue
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_max = torch.where(better, max_val, best_max)
    return best_max


def quantize_linear_awq(
    linear: nn.Linear,
    x: torch.Tensor | None,
    *,
    name: str,
    bits: int,
    group_size: int,
    symmetric: bool,
) -> QuantizedLinear:
    """Clip-search (unless ``name`` is q/k_proj or there are no sample tokens ``x``) and round."""
    w = linear.weight.data.to(torch.float32)
    n, k = w.shape
    g = _group(w, group_size)
    if x is not None and len(x) and not name.endswith(_NO_CLIP):
        max_val = search_clip(w, x, bits, group_size, symmetric)[..., None]  # [N, G, 1]
        w = torch.maximum(torch.minimum(w.view(n, k // g, g), max_val), -max_val).view(n, k)
    codes, scales, zeros = quantize_weight(w, bits, group_size, symmetric)
    bias = None if linear.bias is None else linear.bias.data.clone()
    return QuantizedLinear(codes, scales, zeros, bits=bits, group_size=g, bias=bias)
