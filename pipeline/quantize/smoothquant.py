"""SmoothQuant: migrate activation outliers into the weights before W8A8 quantization.

Per input channel j of a group of linears sharing one input (q,k,v; gate,up):
s_j = max|X_j|^alpha / max|W_j|^(1-alpha), over the calibration tokens and the group's rows.
The preceding RMSNorm's weight is divided by s and the linears' input columns multiplied by it
(`awq.apply_scales`), so the float model computes the same function while the activations the
int8 quantizer sees are flatter. As in SmoothQuant's reference and llm-compressor, max|W_j|
is floored at 1e-5 and s at 1e-5 (a channel that is always 0 keeps a usable scale).
"""

from __future__ import annotations

import torch

__all__ = ["smoothing_scales"]

_FLOOR = 1e-5


def smoothing_scales(
    act_max: torch.Tensor, weights: list[torch.Tensor], alpha: float
) -> torch.Tensor:
    """act_max [K] (max |x| per input channel), weights [N_i, K] -> s [K] float32."""
    w_max = torch.cat([w.float().abs() for w in weights]).amax(0).clamp_min(_FLOOR)  # [K]
    s = act_max.float().pow(alpha) / w_max.pow(1 - alpha)
    return s.clamp_min(_FLOOR)
