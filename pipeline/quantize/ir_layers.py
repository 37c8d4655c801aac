"""The quantize stage's IR read one part at a time: a `LayerSource` over ``ir.safetensors``.

``load_ir`` builds the whole model; export and the engine check walk the layers in order and
need one at a time, so `IRLayers` opens the safetensors file for each request and reads only
the tensors of the part asked for (a decoder layer, the embedding, the final norm, lm_head).
Nothing is cached: what a caller lets go is freed, and a model costs one layer of memory.

The format is the quantize stage's (``pipeline/quantize/checkpoint.py``): ``ir_config.json``
holds the ModelConfig and the quantized linears ({name: {bits, group_size}}); a quantized linear
``<name>`` is stored as ``<name>.codes``, ``.scales`` and, when present, ``.zero_points``,
``.g_idx``, ``.bias``; a quantized embedding ``embed_tokens`` as ``.codes``, ``.scales`` (and
``.zero_points``); a tied lm_head is not stored (it is the embedding, float or quantized).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from ..model.config import ModelConfig
from ..model.layers import DecoderLayer, RMSNorm, make_norm
from ..model.qembedding import EMBEDDING, QuantizedEmbedding
from .checkpoint import fill_module

__all__ = ["IRLayers", "IR_CONFIG", "IR_TENSORS"]

IR_CONFIG, IR_TENSORS = "ir_config.json", "ir.safetensors"


class IRLayers:
    """A `LayerSource` over a quantize stage directory (``ir_config.json`` + ``ir.safetensors``).

    Every call reads its tensors afresh (the file is opened and closed per call, so no mapping
    of the whole file stays resident) and returns new modules, in eval mode, holding the
    stored dtypes (as ``load_ir`` would).
    """

    def __init__(self, ir_dir: Path | str) -> None:
        self.path = Path(ir_dir)
        meta = json.loads((self.path / IR_CONFIG).read_text())
        self._cfg = ModelConfig.from_dict(meta["config"])
        self._quantized: dict[str, dict[str, Any]] = meta["quantized"]
        self._file = self.path / IR_TENSORS
        with safe_open(str(self._file), framework="pt") as f:
            self._names = frozenset(f.keys())

    @property
    def cfg(self) -> ModelConfig:
        return self._cfg

    @property
    def lm_head_tied(self) -> bool:
        """`LlamaModel.tie_lm_head`'s rule: the config ties and lm_head has no codes of its
        own (it is float, or computes with the quantized embedding's)."""
        return self._cfg.tie_word_embeddings and "lm_head" not in self._quantized

    def embedding(self) -> torch.Tensor:
        table = self.quantized_embedding()
        if table is not None:
            return table.dequantize()
        return self._read(["embed_tokens.weight"])["embed_tokens.weight"].float()

    def quantized_embedding(self) -> QuantizedEmbedding | None:
        if EMBEDDING not in self._quantized:
            return None
        holder = nn.Module()
        with torch.device("meta"):
            holder.embed_tokens = nn.Embedding(self._cfg.vocab_size, self._cfg.hidden_size)
        return self._module(holder, "", only=f"{EMBEDDING}.").embed_tokens

    def layer(self, i: int) -> DecoderLayer:
        if not 0 <= i < self._cfg.num_layers:
            raise IndexError(f"layer {i} out of range (the model has {self._cfg.num_layers})")
        with torch.device("meta"):
            layer = DecoderLayer(self._cfg, i)
        return self._module(layer, f"layers.{i}.")

    def final_norm(self) -> RMSNorm:
        with torch.device("meta"):
            norm = make_norm(self._cfg)
        return self._module(norm, "norm.")

    def lm_head(self) -> nn.Module:
        cfg = self._cfg
        with torch.device("meta"):
            head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if self.lm_head_tied:  # computes with the embedding's own tensor, as LlamaModel's does
            table = self.quantized_embedding()
            if table is not None:
                return table.linear().eval()
            head.weight = nn.Parameter(self.embedding())
            return head.eval()
        if "lm_head" in self._quantized:
            holder = nn.Module()
            holder.lm_head = head
            return self._module(holder, "", only="lm_head.").lm_head
        return self._module(head, "lm_head.")

    # ---- reading -----------------------------------------------------------------------------
    def _read(self, names: list[str]) -> dict[str, torch.Tensor]:
        missing = [n for n in names if n not in self._names]
        if missing:
            raise ValueError(f"{self._file}: tensors missing: {missing[:5]}")
        with safe_open(str(self._file), framework="pt") as f:
            return {n: f.get_tensor(n) for n in names}

    def _module(self, module: nn.Module, prefix: str, only: str | None = None) -> nn.Module:
        """``module`` (built on the meta device) filled with the stored tensors under
        ``prefix`` (``only``: the names, relative to the module, it takes; default all)."""
        keep = prefix + (only or "")
        names = sorted(n for n in self._names if n.startswith(keep))
        state = {n[len(prefix) :]: t for n, t in self._read(names).items()}
        quantized = {
            name[len(prefix) :]: q
            for name, q in self._quantized.items()
            if (name + ".").startswith(keep)
        }
        return fill_module(module, quantized, state, f"{self._file}: {prefix or only}")
