"""GPTQ v1 checkpoints (`checkpoint_format: gptq`), as AutoGPTQ wrote them and vLLM /
transformers (GPTQModel) read them.

Per linear, with K input and N output channels, G groups and b bits (32/b values per word):

    qweight  int32 [K*b/32, N]  codes, packed along K: row r holds input channels
                                r*32/b .. (r+1)*32/b - 1, channel k at bits b*(k mod 32/b)
    qzeros   int32 [G, N*b/32]  zero points minus one (the historical v1 offset: readers add
                                the 1 back), packed along N the same way
    scales   fp16  [G, N]
    g_idx    int32 [K]          group of each input channel (act-order: not monotonic)
    bias     fp16  [N]          when the linear has one

W[n, k] = scales[g, n] * (code[k, n] - (stored_zero[g, n] + 1)), g = g_idx[k]. Symmetric
checkpoints store zero 2^(b-1) (8 for 4-bit, written as 7), so ingot's signed codes c are
written as c + 2^(b-1). A zero point of 0 cannot be written (it would be stored as -1, which
v1 readers turn into 16), so such a model is refused. The copy equals the IR's dequantized
weights up to the rounding of the scales to fp16.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..model.llama import LlamaModel
from .common import (
    InteropError,
    common_group_size,
    dense_tensors,
    group_index,
    has_act_order,
    pack_along_rows,
    split_model,
    unsigned_codes,
    write_checkpoint,
)

__all__ = ["write_gptq"]


def write_gptq(model: LlamaModel, source: Path, out: Path) -> None:
    modules, dense = split_model(model)
    floats = [n.rpartition(".")[0] for n in dense if n.endswith("_proj.weight")]
    if floats:
        raise InteropError(
            f"interop gptq: {floats[0]} is not quantized; GPTQ v1 checkpoints quantize every "
            "decoder linear (use compressed-tensors for partly quantized models)"
        )
    bits, symmetric = _one_setting(modules)
    group_size = common_group_size(modules, "gptq")
    tensor_names = model.cfg.family.tensor_names  # IR -> the checkpoint's (HF) names
    tensors = dense_tensors(dense, tensor_names)
    for name, q in modules.items():
        tensors.update(_pack_linear(tensor_names.to_hf(name), q))
    config = {
        "quant_method": "gptq",
        "checkpoint_format": "gptq",
        "bits": bits,
        "group_size": group_size,
        "desc_act": any(has_act_order(q) for q in modules.values()),
        "sym": symmetric,
        "static_groups": False,
        "true_sequential": True,
        "lm_head": "lm_head" in modules,
        "pack_dtype": "int32",
        "meta": {"quantizer": ["ingot"]},
    }
    write_checkpoint(out, source, tensors, config, untie="lm_head" in modules)


def _one_setting(modules) -> tuple[int, bool]:
    settings = {(q.bits, q.symmetric) for q in modules.values()}
    if len(settings) != 1:
        raise InteropError(f"interop gptq: one bits / symmetric setting per model, got {settings}")
    bits, symmetric = settings.pop()
    if bits not in (2, 4, 8):
        raise InteropError(f"interop gptq: {bits}-bit weights have no v1 int32 packing here")
    return bits, symmetric


def _pack_linear(name: str, q) -> dict[str, torch.Tensor]:
    codes, zeros = unsigned_codes(q)  # [N, K], [N, G]
    if (zeros == 0).any():
        count = int((zeros == 0).sum())
        raise InteropError(
            f"interop gptq: {name} has {count} group(s) with zero point 0, which GPTQ v1 cannot "
            "store (its zero-point offset wraps to 16); use compressed-tensors or symmetric"
        )
    tensors = {
        f"{name}.qweight": pack_along_rows(codes.T, q.bits),  # [K*b/32, N]
        f"{name}.qzeros": pack_along_rows(zeros - 1, q.bits).T.contiguous(),  # [G, N*b/32]
        f"{name}.scales": q.scales.T.to(torch.float16).contiguous(),  # [G, N]
        f"{name}.g_idx": group_index(q).to(torch.int32),  # [K]
    }
    if q.bias is not None:
        tensors[f"{name}.bias"] = q.bias.data.to(torch.float16)
    return tensors
