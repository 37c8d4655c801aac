"""Bytes a quantized linear's weights take in the exported graph (and so in the artifact), by
the entry's IR scheme: what the per-layer precision search (`method: auto`) spends its budget
on. The storage is export/weights.py's and export/input_quant.py's:

- weight-only integer: codes in the narrowest ONNX type holding the bits, (U)INT4 packed two
  per byte or (U)INT8; fp32 scales, one per group (or per output channel); zero points, when
  asymmetric, in the codes' type;
- W8A8: int8 codes, an fp32 scale and an int8 zero point per output channel, and the input's
  fp32 scale and int8 zero point;
- FP8: one byte per weight and an fp32 scale per output channel (per-tensor weights store one:
  counted per channel, an upper bound of at most 4 bytes a row).

A bias (none in the families here) is not counted: it is the same whatever the entry.
"""

from __future__ import annotations

import math

from .method import QuantEntry, Scheme, method_of

__all__ = ["weight_bytes"]

_SCALE = 4  # fp32 scales


def weight_bytes(entry: QuantEntry, n: int, k: int) -> int:
    """Bytes of an [n, k] linear's stored weights when ``entry`` quantizes it."""
    method = method_of(entry)
    scheme = method.scheme(entry)
    if scheme is Scheme.WEIGHT_ONLY_INT:
        bits, group_size, symmetric = method.grid(entry)
        code = 4 if bits <= 4 else 8  # (U)INT4 or (U)INT8 whatever the bits
        groups = n * (k // group_size if group_size > 0 else 1)
        zeros = 0 if symmetric else math.ceil(groups * code / 8)
        return math.ceil(n * k * code / 8) + groups * _SCALE + zeros
    if scheme is Scheme.W8A8:
        return n * k + n * (_SCALE + 1) + _SCALE + 1
    if scheme is Scheme.FP8:
        return n * k + n * _SCALE
    raise ValueError(f"{entry.method}: no stored size known for {scheme.value}")
