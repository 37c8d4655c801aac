"""Save and load the (possibly quantized) IR: the quantize stage's cached output.

ir_config.json      ModelConfig + which modules are quantized (bits, group size)
ir.safetensors      the state dict: float weights, and codes/scales/zero_points
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..model.config import ModelConfig
from ..model.llama import LlamaModel
from ..model.qlinear import QuantizedLinear

__all__ = ["save_ir", "load_ir"]


def save_ir(model: LlamaModel, out: Path) -> None:
    quantized = {
        name: {"bits": m.bits, "group_size": m.group_size}
        for name, m in model.named_modules()
        if isinstance(m, QuantizedLinear)
    }
    state = {k: v.contiguous() for k, v in model.state_dict().items() if v is not None}
    if getattr(model.lm_head, "weight", None) is model.embed_tokens.weight:
        state.pop("lm_head.weight")  # tied: stored once, as the embedding
    meta = {"config": model.cfg.to_dict(), "quantized": quantized}
    (out / "ir_config.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    save_file(state, str(out / "ir.safetensors"))


def load_ir(path: Path) -> LlamaModel:
    meta = json.loads((path / "ir_config.json").read_text())
    cfg = ModelConfig.from_dict(meta["config"])
    state = load_file(str(path / "ir.safetensors"))
    with torch.device("meta"):
        model = LlamaModel(cfg)
    for name, q in meta["quantized"].items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
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
            ),
        )
    model.load_state_dict(state, assign=True, strict=False)
    if cfg.tie_word_embeddings and "lm_head" not in meta["quantized"]:
        model.lm_head.weight = model.embed_tokens.weight
    missing = [k for k, v in model.state_dict().items() if v is not None and v.is_meta]
    if missing:
        raise ValueError(f"{path / 'ir.safetensors'}: tensors missing: {missing[:5]}")
    return model.eval()
