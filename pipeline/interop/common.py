"""What the interop writers share: the IR's quantized linears and float tensors (under the
family's HF tensor names), the files around the weights (config.json, tokenizer) and the
packing of small integers into int32."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from ..model.family import TensorNames
from ..model.llama import LlamaModel
from ..model.qembedding import EMBEDDING, QuantizedEmbedding
from ..model.qlinear import QuantizedLinear
from .errors import InteropError
from .fused import fuse_linears

__all__ = [
    "InteropError",
    "split_model",
    "float_linears",
    "group_index",
    "has_act_order",
    "unsigned_codes",
    "common_group_size",
    "pack_along_rows",
    "write_checkpoint",
    "DENSE_DTYPE",
    "dense_tensors",
]

# Engines run these int4 / int8 checkpoints with fp16 activations; float tensors follow.
DENSE_DTYPE = torch.float16

# Files that make a checkpoint directory usable besides config.json and the weights.
_SIDE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "tokenizer.model",
)


def split_model(
    model: LlamaModel, *, activations: bool = False
) -> tuple[dict[str, QuantizedLinear], dict[str, torch.Tensor]]:
    """({IR module name: quantized linear}, {IR tensor name: float tensor}) of `model`.

    A quantized linear's own tensors (codes, scales, zero points, g_idx, bias) are not in the
    float dict; each writer stores them its own way. A quantized embedding is in the float
    dict dequantized (`embed_tokens.weight`); a tied lm_head is left out. Unless the
    format holds them (`activations`), linears that quantize their inputs (W8A8, FP8) or hold
    FP8 codes are refused: weight-only integer formats would misread them.
    """
    quantized = {n: m for n, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    for name, q in quantized.items():
        if not activations and (q.input_quant is not None or q.fp8):
            what = "FP8 weights" if q.fp8 else f"{q.input_quant.dtype} activations"
            raise InteropError(
                f"interop: {name} has {what}; this format holds weight-only integer "
                "quantization (compressed-tensors holds W8A8 and FP8)"
            )
    table = model.embed_tokens
    embedding = isinstance(table, QuantizedEmbedding)
    dense = {
        name: tensor
        for name, tensor in model.state_dict().items()
        if tensor is not None
        and name.rpartition(".")[0] not in quantized
        and not (embedding and name.startswith(f"{EMBEDDING}."))
    }
    if embedding:  # the formats' embeddings are float tables: written dequantized
        dense[f"{EMBEDDING}.weight"] = table.dequantize()
    fuse_linears(model.cfg, quantized, dense)  # the checkpoint's fused tensors (Phi-3)
    if model.lm_head_tied:
        dense.pop("lm_head.weight", None)
    return quantized, dense


def float_linears(dense: dict[str, torch.Tensor], names: TensorNames) -> list[str]:
    """HF names (the family's `names`) of the linears `split_model` left float (projections,
    lm_head), sorted: what a format's config lists as not converted."""
    return sorted(
        names.to_hf(name.rpartition(".")[0])
        for name in dense
        if name.endswith("_proj.weight") or name == "lm_head.weight"
    )


def group_index(q: QuantizedLinear) -> torch.Tensor:
    """[K] int64: the group of each input channel (contiguous groups unless act-order)."""
    if q.g_idx is not None:
        return q.g_idx.to(torch.int64)
    return torch.arange(q.in_features) // q.group_size


def has_act_order(q: QuantizedLinear) -> bool:
    """True when channels are not grouped contiguously (GPTQ act-order without static groups)."""
    if q.g_idx is None:
        return False
    return not torch.equal(q.g_idx.to(torch.int64), torch.arange(q.in_features) // q.group_size)


def unsigned_codes(q: QuantizedLinear) -> tuple[np.ndarray, np.ndarray]:
    """(codes [N, K], zero points [N, G]) as uint32 in [0, 2^bits): ingot's signed symmetric
    codes c (zero 0) become c + 2^(bits-1) with zero 2^(bits-1), which dequantizes the same."""
    codes = q.codes.to(torch.int64)
    groups = q.scales.shape[1]
    if q.zero_points is None:
        offset = 2 ** (q.bits - 1)
        zeros = torch.full((q.out_features, groups), offset, dtype=torch.int64)
        codes = codes + offset
    else:
        zeros = q.zero_points.to(torch.int64)
    return codes.numpy().astype(np.uint32), zeros.numpy().astype(np.uint32)


def common_group_size(modules: dict[str, QuantizedLinear], fmt: str) -> int:
    """The one group size a whole-model config can state (-1: per output channel).

    A module with a single group fits any group size at least its width.
    """
    grouped = {q.group_size for q in modules.values() if q.scales.shape[1] > 1}
    if len(grouped) > 1:
        raise InteropError(
            f"interop {fmt}: modules use group sizes {sorted(grouped)}; "
            "the format states one for the whole model"
        )
    size = grouped.pop() if grouped else -1
    for name, q in modules.items():
        if q.scales.shape[1] == 1 and size != -1 and q.in_features > size:
            raise InteropError(
                f"interop {fmt}: {name} is per-channel while other modules use groups of {size}"
            )
    return size


def pack_along_rows(values: np.ndarray, bits: int, order: tuple[int, ...] | None = None):
    """[R, C] uint32 values < 2^bits -> [R * bits / 32, C] int32, packed along rows.

    Value j of each run of 32/bits rows goes to bits [bits*i, bits*(i+1)) of the word, where
    j = order[i] (identity when order is None): GPTQ packs in order, AWQ interleaves.
    """
    per = 32 // bits
    rows, cols = values.shape
    if rows % per:
        raise InteropError(f"cannot pack {rows} rows of {bits}-bit values into int32 words")
    runs = values.reshape(rows // per, per, cols)
    if order is not None:
        runs = runs[:, list(order), :]
    shifts = (np.arange(per, dtype=np.uint32) * bits)[None, :, None]
    words = np.bitwise_or.reduce(runs << shifts, axis=1).astype(np.uint32)
    return torch.from_numpy(words.view(np.int32).copy())


def write_checkpoint(
    out: Path,
    source: Path,
    tensors: dict[str, torch.Tensor],
    quantization_config: dict[str, Any] | None,
    *,
    untie: bool = False,
) -> None:
    """config.json (the source's, plus quantization_config), model.safetensors, tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    dtype_key = "dtype" if "dtype" in config else "torch_dtype"
    config[dtype_key] = str(DENSE_DTYPE).removeprefix("torch.")
    if untie:  # a quantized lm_head cannot share the float embedding's tensor
        config["tie_word_embeddings"] = False
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    ordered = {name: tensors[name].contiguous() for name in sorted(tensors)}
    save_file(ordered, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in _SIDE_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)


def dense_tensors(dense: dict[str, torch.Tensor], names: TensorNames) -> dict[str, torch.Tensor]:
    """The float tensors under their HF names (the family's `names`), in the checkpoints'
    float dtype."""
    return {names.to_hf(name): t.to(DENSE_DTYPE) for name, t in dense.items()}
