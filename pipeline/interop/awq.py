"""AWQ GEMM checkpoints (`quant_method: awq`, `version: gemm`), as AutoAWQ wrote them and
vLLM / transformers read them. 4-bit, asymmetric (zero points), contiguous groups only.

Per linear, with K input and N output channels and G groups:

    qweight  int32 [K, N/8]  codes, 8 output channels per word in the interleaved order
                             [0, 2, 4, 6, 1, 3, 5, 7]: nibble i holds channel 8*w + order[i]
    qzeros   int32 [G, N/8]  zero points (no offset), packed the same way
    scales   fp16  [G, N]
    bias     fp16  [N]       when the linear has one

W[n, k] = scales[k // group, n] * (code[k, n] - zero[k // group, n]). Equals the IR's
dequantized weights up to the rounding of the scales to fp16.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..model.llama import LlamaModel
from .common import (
    InteropError,
    common_group_size,
    dense_tensors,
    float_linears,
    has_act_order,
    pack_along_rows,
    split_model,
    unsigned_codes,
    write_checkpoint,
)

__all__ = ["write_awq", "AWQ_ORDER"]

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def write_awq(model: LlamaModel, source: Path, out: Path) -> None:
    modules, dense = split_model(model)
    for name, q in modules.items():
        _check(name, q)
    group_size = common_group_size(modules, "awq")
    if group_size == -1:
        raise InteropError("interop awq: needs groups (32, 64 or 128), not per-channel scales")
    tensor_names = model.cfg.family.tensor_names  # IR -> the checkpoint's (HF) names
    tensors = dense_tensors(dense, tensor_names)
    for name, q in modules.items():
        tensors.update(_pack_linear(tensor_names.to_hf(name), q))
    floats = float_linears(dense, tensor_names)
    config = {
        "quant_method": "awq",
        "version": "gemm",
        "bits": 4,
        "group_size": group_size,
        "zero_point": True,
        "modules_to_not_convert": [n for n in floats if n != "lm_head"] or None,
    }
    write_checkpoint(out, source, tensors, config)


def _check(name: str, q) -> None:
    if name == "lm_head":
        raise InteropError("interop awq: AWQ checkpoints keep lm_head float; ignore it")
    if q.bits != 4 or q.symmetric:
        kind = "symmetric" if q.symmetric else "asymmetric"
        raise InteropError(
            f"interop awq: {name} is {q.bits}-bit {kind}; AWQ GEMM holds 4-bit with zero points"
        )
    if has_act_order(q):
        raise InteropError(f"interop awq: {name} uses act-order groups, which AWQ cannot store")


def _pack_linear(name: str, q) -> dict[str, torch.Tensor]:
    codes, zeros = unsigned_codes(q)  # [N, K], [N, G]
    tensors = {
        # Packing along N = packing the rows of the transposed [N, K] array, then transposing.
        f"{name}.qweight": pack_along_rows(codes, 4, AWQ_ORDER).T.contiguous(),  # [K, N/8]
        f"{name}.qzeros": pack_along_rows(zeros, 4, AWQ_ORDER).T.contiguous(),  # [G, N/8]
        f"{name}.scales": q.scales.T.to(torch.float16).contiguous(),  # [G, N]
    }
    if q.bias is not None:
        tensors[f"{name}.bias"] = q.bias.data.to(torch.float16)
    return tensors
