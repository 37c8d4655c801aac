"""Save and load the (possibly quantized) IR: the quantize stage's cached output.

ir_config.json      ModelConfig + which modules are quantized (bits, group size, and how
                    their inputs are quantized, if they are)
ir.safetensors      the state dict: float weights, and codes/scales/zero_points

The layer-by-layer quantizers also checkpoint one decoder layer at a time (``save_layer`` /
``load_layer``: the same two kinds of file for one layer) and assemble ``ir.safetensors`` from
those files tensor by tensor (``write_safetensors``), never holding the whole model.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from ..model.config import ModelConfig
from ..model.input_quant import InputQuant
from ..model.layers import DecoderLayer
from ..model.llama import LlamaModel
from ..model.qembedding import EMBEDDING, QuantizedEmbedding
from ..model.qlinear import QuantizedLinear

M = TypeVar("M", bound=nn.Module)

__all__ = [
    "save_ir",
    "load_ir",
    "save_layer",
    "load_layer",
    "quantized_modules",
    "write_safetensors",
    "write_ir_config",
    "layer_tensor_sources",
    "fill_module",
]

_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.float8_e4m3fn: "F8_E4M3",
}


def quantized_modules(module: nn.Module) -> dict[str, dict[str, Any]]:
    """{module name: {"bits", "group_size"[, "input_quant"]}} of every QuantizedLinear inside
    ``module`` (input_quant: `InputQuant.to_dict`, only for linears that quantize inputs)."""
    found = {}
    for name, m in module.named_modules():
        if isinstance(m, QuantizedEmbedding):
            found[name] = {"bits": m.bits, "group_size": m.group_size}
        if isinstance(m, QuantizedLinear):
            found[name] = {"bits": m.bits, "group_size": m.group_size}
            if m.input_quant is not None:
                found[name]["input_quant"] = m.input_quant.to_dict()
    return found


def _install_quantized(
    module: nn.Module, quantized: dict[str, dict[str, Any]], state: dict[str, torch.Tensor]
) -> None:
    """Replace the named linears of ``module`` by QuantizedLinears built from (and popped out
    of) ``state``; the embedding (`EMBEDDING`) by a QuantizedEmbedding."""
    for name, q in quantized.items():
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        if name == EMBEDDING:
            table = QuantizedEmbedding(
                codes=state.pop(f"{name}.codes"),
                scales=state.pop(f"{name}.scales"),
                zero_points=state.pop(f"{name}.zero_points", None),
                bits=q["bits"],
                group_size=q["group_size"],
            )
            setattr(parent, child, table)
            continue
        setattr(
            parent,
            child,
            QuantizedLinear(
                codes=state.pop(f"{name}.codes"),
                scales=state.pop(f"{name}.scales"),
                zero_points=state.pop(f"{name}.zero_points", None),
                bits=q["bits"],
                group_size=q["group_size"],
                bias=state.pop(f"{name}.bias", None),
                g_idx=state.pop(f"{name}.g_idx", None),
                input_quant=InputQuant.from_dict(q.get("input_quant")),
            ),
        )


def _state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in module.state_dict().items() if v is not None}


def write_ir_config(cfg: ModelConfig, quantized: dict[str, dict[str, Any]], out: Path) -> None:
    meta = {"config": cfg.to_dict(), "quantized": quantized}
    (out / "ir_config.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def save_ir(model: LlamaModel, out: Path) -> None:
    state, quantized = _state(model), quantized_modules(model)
    if model.lm_head_tied:  # stored once, as the embedding (`tie_lm_head` shares it at load)
        state = {k: v for k, v in state.items() if not k.startswith("lm_head.")}
        quantized.pop("lm_head", None)
    write_ir_config(model.cfg, quantized, out)
    save_file(state, str(out / "ir.safetensors"))


def load_ir(path: Path) -> LlamaModel:
    meta = json.loads((path / "ir_config.json").read_text())
    cfg = ModelConfig.from_dict(meta["config"])
    state = load_file(str(path / "ir.safetensors"))
    with torch.device("meta"):
        model = LlamaModel(cfg)
    _install_quantized(model, meta["quantized"], state)
    model.load_state_dict(state, assign=True, strict=False)
    model.tie_lm_head()
    missing = [k for k, v in model.state_dict().items() if v is not None and v.is_meta]
    if missing:
        raise ValueError(f"{path / 'ir.safetensors'}: tensors missing: {missing[:5]}")
    return model.eval()


def save_layer(layer: DecoderLayer, stem: Path) -> None:
    """``<stem>.safetensors`` + ``<stem>.json``, each written to a temp name and renamed."""
    tensors, meta = stem.with_suffix(".safetensors"), stem.with_suffix(".json")
    save_file(_state(layer), str(tensors) + ".tmp")
    Path(str(tensors) + ".tmp").replace(tensors)
    meta.with_suffix(".json.tmp").write_text(
        json.dumps({"quantized": quantized_modules(layer)}, indent=2, sort_keys=True) + "\n"
    )
    meta.with_suffix(".json.tmp").replace(meta)


def load_layer(cfg: ModelConfig, index: int, stem: Path) -> DecoderLayer:
    quantized = json.loads(stem.with_suffix(".json").read_text())["quantized"]
    state = load_file(str(stem.with_suffix(".safetensors")))
    with torch.device("meta"):
        layer = DecoderLayer(cfg, index)
    return fill_module(layer, quantized, state, f"{stem}: layer checkpoint")


def fill_module(
    module: M, quantized: dict[str, dict[str, Any]], state: dict[str, torch.Tensor], what: str
) -> M:
    """`module` (built on the meta device) with its quantized linears installed and every
    tensor of `state` assigned; ValueError naming `what` if they do not fit each other."""
    _install_quantized(module, quantized, state)
    result = module.load_state_dict(state, assign=True, strict=False)
    missing = [k for k, v in module.state_dict().items() if v is not None and v.is_meta]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{what} does not fit the config "
            f"(missing {missing[:3]}, unexpected {result.unexpected_keys[:3]})"
        )
    return module.eval()


# A tensor to write: (name, shape, dtype, produce) where produce() returns the tensor.
TensorSource = tuple[str, tuple[int, ...], torch.dtype, Callable[[], torch.Tensor]]


def write_safetensors(path: Path, tensors: list[TensorSource]) -> None:
    """A safetensors file written one tensor at a time (header first, from shapes alone)."""
    header, offset = {}, 0
    ordered = sorted(tensors, key=lambda t: t[0])
    for name, shape, dtype, _ in ordered:
        size = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
        span = [offset, offset + size]
        header[name] = {"dtype": _DTYPES[dtype], "shape": list(shape), "data_offsets": span}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format aligns the data to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, dtype, produce in ordered:
            t = produce().contiguous()
            if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
                raise ValueError(f"{name}: produced {t.dtype} {tuple(t.shape)}, not {shape}")
            if t.numel():
                f.write(t.view(torch.uint8).numpy().data)  # the tensor's memory, not a copy


def layer_tensor_sources(stem: Path, prefix: str) -> list[TensorSource]:
    """Every tensor of a layer checkpoint, renamed ``prefix + name``, read lazily."""
    file = str(stem.with_suffix(".safetensors"))
    sources = []
    with safe_open(file, framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open is not iterable
            s = f.get_slice(key)
            dtype = {v: k for k, v in _DTYPES.items()}[s.get_dtype()]
            sources.append((prefix + key, tuple(s.get_shape()), dtype, _reader(file, key)))
    return sources


def _reader(file: str, key: str) -> Callable[[], torch.Tensor]:
    def read() -> torch.Tensor:
        with safe_open(file, framework="pt") as f:
            return f.get_tensor(key)

    return read
