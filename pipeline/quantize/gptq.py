"""GPTQ (Frantar et al., 2022): quantize a weight column by column, pushing each column's
rounding error onto the columns not yet quantized, weighted by the inverse Hessian of the
layer-wise squared error, H = 2/n * sum x x^T over the calibration inputs x of the linear.

- Damping: ``dampening_frac`` * mean(diag H) is added to the diagonal (and multiplied by 10,
  up to three times, should H still not be positive definite).
- Lazy block updates: columns are processed in blocks of ``block_size``; the error of a block
  reaches the columns after it in one matrix product.
- Act order (``actorder``): columns are visited in order of decreasing diag(H), the channels
  with the largest inputs first, while the most error-absorbing columns remain.
- Static groups (``static_groups``): each group's scale and zero point are computed from the
  original weights *before* the permutation, over contiguous input channels, as in AutoGPTQ's
  static groups and llm-compressor's `actorder: static`. Without static groups the parameters
  of a group are taken from the error-updated weights when its first column is reached.
- Scale candidates (static groups narrower than a row): two are solved, the min-max range and
  the range minimizing sum |w - q(w)|^2.4 (GPTQ's `mse` grid). Rows are independent given H,
  so both are solved in one stacked pass and each output row keeps the candidate with the
  smaller layer-wise error (W - Q) H (W - Q)^T (``group_scales: best``; ``minmax`` keeps
  llm-compressor's min-max scales, ``mse`` the other candidate). Per channel (one group per
  row), min-max alone is used: in exploratory runs on pydoc-16m the per-row choice lowered
  perplexity at g128 but raised it per channel, though it lowered the layer-wise error there
  too. The choice is made on the calibration inputs, so it could overfit them; measured on
  two checkpoints and an out-of-domain text it moves the predictions less than either
  candidate alone in both domains (benchmarks/results/gptq_ablation-*.md).

**Act order and export.** Act order with dynamic groups gives each group a scattered set of
input channels (a non-trivial ``g_idx``), which a blocked ``DequantizeLinear`` cannot express
without permuting the activations at run time. ingot therefore pairs act order with static
groups: the visiting order is permuted, the groups are not, so ``g_idx`` is the identity and is
dropped, and the layer exports as a plain blocked DequantizeLinear -> MatMul with no run-time
cost. The recipe refuses ``actorder: true`` with ``static_groups: false`` (for group sizes other
than -1); `gptq_quantize` itself still supports it and returns the ``g_idx``.

**Device.** The solve runs on the device of the weight (and Hessian): every tensor it makes is
made there, and the column loop reads no value back to the host (a group's index per column
comes from a host-side list), so on a GPU it only queues kernels.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from ingot.common.errors import IngotError

from ..model.qlinear import QuantizedLinear
from .rtn import mse_scales, quantize_weight, round_to_codes
from .threads import solver_threads

__all__ = ["gptq_quantize", "quantize_linear_gptq", "GptqError"]

# Which static group scales GPTQ solves with (`gptq_quantize`, the recipe's `group_scales`).
GroupScales = Literal["best", "minmax", "mse"]

_DAMPING_RETRIES = 3


class GptqError(IngotError, ValueError):
    """The Hessian stayed singular even after extra damping."""


def _inverse_hessian_cholesky(h: torch.Tensor, dampening_frac: float) -> torch.Tensor:
    """Upper Cholesky factor of H^-1 (the form GPTQ's updates read rows from)."""
    damp = dampening_frac * torch.mean(torch.diag(h))
    eye = torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    for _ in range(_DAMPING_RETRIES + 1):
        factor, info = torch.linalg.cholesky_ex(h + damp * eye)
        if info == 0:
            inverse = torch.cholesky_inverse(factor)
            upper, info = torch.linalg.cholesky_ex(inverse, upper=True)
            if info == 0:
                return upper
        damp = damp * 10
    raise GptqError("the Hessian is not positive definite even with 1000x the damping")


def gptq_quantize(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    *,
    bits: int,
    group_size: int,
    symmetric: bool,
    actorder: bool = True,
    static_groups: bool = True,
    dampening_frac: float = 0.01,
    block_size: int = 128,
    group_scales: GroupScales = "best",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """weight [N, K], hessian [K, K] -> codes [N, K], scales [N, G], zero_points [N, G] | None,
    g_idx [K] | None (None: contiguous groups). Codes follow `quantize_weight`'s conventions.
    ``group_scales`` (static groups narrower than a row): per row the "best" of two candidates
    (module doc), or "minmax" alone (llm-compressor's), or "mse" alone.
    Computed on ``weight``'s device (``hessian`` is moved there if it is elsewhere)."""
    n, k = weight.shape
    g = k if group_size == -1 else group_size
    device = weight.device
    with solver_threads(k):
        w = weight.detach().to(torch.float32).clone()
        h = hessian.detach().to(device, torch.float32).clone()
        dead = torch.diag(h) == 0  # channels never active in the calibration data
        h[dead, dead] = 1.0
        w[:, dead] = 0.0
        perm = torch.argsort(torch.diag(h), descending=True, stable=True) if actorder else None
        order = perm if perm is not None else torch.arange(k, device=device)
        hinv = _inverse_hessian_cholesky(h[order][:, order], dampening_frac)
        solve = _Solve(hinv, bits, g, symmetric, block_size)
        if not (static_groups or g == k):
            codes, scales, zeros = solve.dynamic(w[:, order])
            inverse = torch.argsort(order)
            g_idx = (torch.arange(k, device=device) // g)[inverse] if perm is not None else None
            return _pack(codes[:, inverse], scales, zeros, symmetric) + (g_idx,)
        return _static(solve, w, h, order, bits, group_size, symmetric, group_scales) + (None,)


def _static(
    solve: _Solve, w, h, order, bits: int, group_size: int, symmetric: bool, choice: GroupScales
):
    """Codes, scales, zeros with static parameters: each row's best candidate (module doc)."""
    n, k = w.shape
    g = solve.g
    scales, zeros = _static_candidates(w, bits, group_size, symmetric, choice)  # [C*N, G]
    candidates = scales.shape[0] // n
    stacked = w.repeat(candidates, 1)  # [C*N, K]
    codes = solve.static(stacked[:, order], scales, zeros, order // g)
    codes = codes[:, torch.argsort(order)]  # [C*N, K], original column order
    if candidates == 1:  # nothing to choose
        return _pack(codes, scales, zeros, symmetric)
    delta = _dequantize(codes, scales, zeros, g) - stacked
    loss = ((delta @ h) * delta).sum(1).view(candidates, n)  # layer-wise error of each row
    pick = loss.argmin(0) * n + torch.arange(n, device=w.device)  # ties: the first (min-max)
    return _pack(codes[pick], scales[pick], None if zeros is None else zeros[pick], symmetric)


def _static_candidates(w, bits: int, group_size: int, symmetric: bool, choice: GroupScales):
    """Scales [C*N, G] and zero points (float) | None: min-max, then, for groups narrower than a
    row and ``choice`` "best", the error-minimizing range (C = 2); "mse": that range alone."""
    _, scales, zeros = quantize_weight(w, bits, group_size, symmetric)
    zeros = None if zeros is None else zeros.to(torch.float32)
    if scales.shape[1] == 1 or choice == "minmax":  # one group per row: per channel
        return scales, zeros
    mse, mse_zeros = mse_scales(w, bits, group_size, symmetric)
    if choice == "mse":
        return mse, None if symmetric else mse_zeros.float()
    return torch.cat((scales, mse)), None if symmetric else torch.cat((zeros, mse_zeros.float()))


def _dequantize(codes, scales, zeros, g) -> torch.Tensor:
    s = scales.repeat_interleave(g, dim=1)
    return codes * s if zeros is None else (codes - zeros.repeat_interleave(g, dim=1)) * s


def _pack(codes, scales, zeros, symmetric):
    codes = codes.to(torch.int8 if symmetric else torch.uint8)
    return codes, scales, None if zeros is None else zeros.to(torch.uint8)


class _Solve:
    """GPTQ's column loop over a weight whose columns are already in visiting order."""

    def __init__(self, hinv, bits: int, g: int, symmetric: bool, block_size: int) -> None:
        self.hinv, self.bits, self.g = hinv, bits, g
        self.symmetric, self.block_size = symmetric, block_size

    def static(self, w, scales, zeros, column_groups) -> torch.Tensor:
        """Codes [N, K] (visiting order) with fixed parameters: column j uses group
        ``column_groups[j]`` of ``scales`` / ``zeros`` [N, G]."""

        groups = column_groups.tolist()  # read on the host once, not once per column

        def params(col, _current):
            group = groups[col]
            return scales[:, group], None if zeros is None else zeros[:, group]

        return self._run(w, params)

    def dynamic(self, w):
        """Codes, scales, zeros with each group's parameters taken from the error-updated
        weights when its first column (in visiting order) is reached."""
        n, k = w.shape
        scales = torch.empty(n, k // self.g, device=w.device)
        zeros = None if self.symmetric else torch.empty(n, k // self.g, device=w.device)

        def params(col, current):
            group = col // self.g
            if col % self.g == 0:
                _, s, z = quantize_weight(current()[:, : self.g], self.bits, -1, self.symmetric)
                scales[:, group] = s[:, 0]
                if zeros is not None:
                    zeros[:, group] = z[:, 0].to(torch.float32)
            return scales[:, group], None if zeros is None else zeros[:, group]

        codes = self._run(w, params)
        return codes, scales, zeros

    def _run(self, w, params) -> torch.Tensor:
        n, k = w.shape
        hinv, bits, block_size = self.hinv, self.bits, self.block_size
        # Columns of W are rows here ([K, N]): every per-column step reads and writes
        # contiguously.
        wt = w.T.contiguous()
        codes = torch.empty(k, n, device=w.device)
        for i1 in range(0, k, block_size):
            i2 = min(i1 + block_size, k)
            w1 = wt[i1:i2].clone()  # [B, N]
            err1 = torch.zeros_like(w1)
            hinv1 = hinv[i1:i2, i1:i2]
            for j in range(i2 - i1):
                # The current (error-updated) columns from here on: this block's, then later.
                s, z = params(i1 + j, lambda j=j, w1=w1, i2=i2: torch.cat((w1[j:], wt[i2:])).T)
                q = round_to_codes(w1[j], s, z, bits)
                codes[i1 + j] = q
                deq = q * s if z is None else (q - z) * s
                err = (w1[j] - deq) / hinv1[j, j]
                w1[j:].addr_(hinv1[j, j:], err, alpha=-1)  # the rest of the block absorbs it
                err1[j] = err
            wt[i2:].addmm_(hinv[i1:i2, i2:].T, err1, alpha=-1)  # lazy update of later blocks
        return codes.T


def quantize_linear_gptq(
    linear: nn.Linear, hessian: torch.Tensor, **options: Any
) -> QuantizedLinear:
    """`gptq_quantize` on a linear's weight (``options``: its keywords) -> QuantizedLinear."""
    codes, scales, zeros, g_idx = gptq_quantize(linear.weight.data, hessian, **options)
    group_size = options["group_size"]
    g = linear.in_features if group_size == -1 else group_size
    bias = None if linear.bias is None else linear.bias.data.clone()
    return QuantizedLinear(
        codes, scales, zeros, bits=options["bits"], group_size=g, bias=bias, g_idx=g_idx
    )
