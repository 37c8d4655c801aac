"""The checkpoint's fused tensors written back (`FusedLinear`: Phi-3's qkv_proj and
gate_up_proj): the IR's parts stacked along the output rows, as the family's checkpoint
stores them, so each format's consumer (transformers, vLLM, llama.cpp) finds the modules it
builds.

Stacking is exact when the parts are quantized alike: the codes, scales, zero points and
biases are per output row, so [q; k; v] of each is the fused tensor's. A scheme per part
(weights or static input scale) cannot be one tensor's: refused, naming the parts.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from ..model.config import ModelConfig
from ..model.llama import LlamaModel
from ..model.qlinear import QuantizedLinear
from .errors import InteropError

__all__ = ["fuse_linears", "layer_linears", "stack_linears"]


def layer_linears(model: LlamaModel, i: int) -> Iterator[tuple[str, nn.Module]]:
    """(IR name, module) of layer i's linears as the checkpoint stores them, in the layer's
    order: a fused tensor (`layers.0.attn.qkv_proj`) in its first part's place."""
    family = model.cfg.family
    for linear in family.layer.linears:
        fused = family.fused_of(linear.name)
        if fused is None:
            name = f"layers.{i}.{linear.name}"
            yield name, model.get_submodule(name)
        elif linear.name == fused.parts[0]:
            name = f"layers.{i}.{fused.name}"
            parts = [model.get_submodule(f"layers.{i}.{p}") for p in fused.parts]
            yield name, _stack_modules(name, parts)


def _stack_modules(name: str, parts: list[nn.Module]) -> nn.Module:
    """The parts' rows as one module: a QuantizedLinear of quantized parts, a Linear of
    float ones."""
    if all(isinstance(m, QuantizedLinear) for m in parts):
        return stack_linears(name, parts)
    if any(isinstance(m, QuantizedLinear) for m in parts):
        raise InteropError(
            f"interop: {name} is one tensor in the checkpoint, but some of its parts are "
            "quantized and others float (quantize them alike)"
        )
    weight = torch.cat([m.weight.data for m in parts])  # [sum N, K]
    stacked = nn.Linear(weight.shape[1], weight.shape[0], bias=parts[0].bias is not None)
    stacked.weight.data = weight
    if stacked.bias is not None:
        stacked.bias.data = torch.cat([m.bias.data for m in parts])
    return stacked


def fuse_linears(
    cfg: ModelConfig, modules: dict[str, QuantizedLinear], dense: dict[str, torch.Tensor]
) -> None:
    """Replace, in place, the parts of every fused tensor of `cfg`'s family by the fused
    linear: in `modules` (IR name -> quantized linear) when the parts are quantized, in
    `dense` (IR tensor name -> float tensor) when they are float."""
    for i in range(cfg.num_layers):
        for fused in cfg.family.fused:
            parts = [f"layers.{i}.{p}" for p in fused.parts]
            name = f"layers.{i}.{fused.name}"
            quantized = [p in modules for p in parts]
            if all(quantized):
                modules[name] = stack_linears(name, [modules.pop(p) for p in parts])
            elif not any(quantized):
                for kind in ("weight", "bias"):
                    if f"{parts[0]}.{kind}" in dense:
                        stacked = [dense.pop(f"{p}.{kind}") for p in parts]
                        dense[f"{name}.{kind}"] = torch.cat(stacked)
            else:
                left = [p for p, q in zip(parts, quantized, strict=True) if not q]
                raise InteropError(
                    f"interop: {name} is one tensor in the checkpoint, but {', '.join(left)} "
                    "are left float while the other parts are quantized (quantize them alike)"
                )


def stack_linears(name: str, parts: list[QuantizedLinear]) -> QuantizedLinear:
    """One QuantizedLinear holding `parts`' rows in order; they must share one scheme."""
    first = parts[0]
    for q in parts[1:]:
        if _scheme(q) != _scheme(first) or not _same_g_idx(q, first):
            raise InteropError(
                f"interop: {name} is one tensor in the checkpoint, but its parts are quantized "
                f"differently ({first.extra_repr()} vs {q.extra_repr()}); quantize them alike"
            )
    zeros = None if first.zero_points is None else torch.cat([q.zero_points for q in parts])
    bias = None if first.bias is None else torch.cat([q.bias.data for q in parts])
    return QuantizedLinear(
        torch.cat([q.codes for q in parts]),
        torch.cat([q.scales for q in parts]),
        zeros,
        first.bits,
        first.group_size,
        bias,
        first.g_idx,
        first.input_quant,
    )


def _scheme(q: QuantizedLinear) -> tuple:
    return (q.bits, q.group_size, q.codes.dtype, q.symmetric, q.input_quant, q.bias is None)


def _same_g_idx(a: QuantizedLinear, b: QuantizedLinear) -> bool:
    if a.g_idx is None or b.g_idx is None:
        return a.g_idx is None and b.g_idx is None
    return torch.equal(a.g_idx, b.g_idx)
