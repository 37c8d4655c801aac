"""Medusa heads (Cai et al. 2024) in vLLM's layout: what `speculative.method: medusa` trains,
attaches, exports and ships.

Head h maps the target's final hidden state x (after the final norm: what vLLM and the Medusa
reference feed their heads) through `num_layers` residual SiLU blocks, x + SiLU(W x + b), and
its own lm_head to logits over the target's vocabulary. With the target's own logits at
position t giving token t+1, head h proposes token t+h+2.

vLLM's checkpoint layout (`vllm/model_executor/models/medusa.py`): config.json with
model_type "medusa", hidden_size, vocab_size, num_heads, num_hidden_layers, and
`medusa_fc_bias` (whether the blocks' linears have a bias; vLLM's default is none) or
`original_lm_head` (one lm_head shared by every head, stored as lm_heads.0); tensors
`blocks.{h}.layers.{l}.weight` [H, H] (+ `.bias` [H]) and `lm_heads.{h}.weight` [V, H], an
optional "medusa_heads." prefix. A truncated vocabulary (`token_map`) is not supported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ingot.common.errors import IngotError

from .head_checkpoint import check_tensors, read_config, read_tensors

__all__ = [
    "MedusaConfig",
    "MedusaHeadsModel",
    "MedusaError",
    "load_medusa",
    "load_medusa_config",
    "save_medusa",
]

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


class MedusaError(IngotError, ValueError):
    """A Medusa checkpoint that cannot serve this target; the message names the file."""


@dataclass(frozen=True, slots=True)
class MedusaConfig:
    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int
    bias: bool = True  # the blocks' linears (vLLM's medusa_fc_bias)

    def to_hf(self) -> dict:
        """config.json as vLLM's MedusaConfig reads it."""
        return {
            "architectures": ["MedusaModel"],
            "model_type": "medusa",
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "truncated_vocab_size": self.vocab_size,
            "num_heads": self.num_heads,
            "num_hidden_layers": self.num_layers,
            "medusa_fc_bias": self.bias,
        }


class _ResidualBlock(nn.Module):
    def __init__(self, hidden: int, num_layers: int, bias: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden, hidden, bias=bias) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + nn.functional.silu(layer(x))
        return x


class MedusaHeadsModel(nn.Module):
    """The heads; parameter names are vLLM's (blocks.{h}.layers.{l}, lm_heads.{h})."""

    def __init__(self, cfg: MedusaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.blocks = nn.ModuleList(
            _ResidualBlock(h, cfg.num_layers, cfg.bias) for _ in range(cfg.num_heads)
        )
        self.lm_heads = nn.ModuleList(
            nn.Linear(h, cfg.vocab_size, bias=False) for _ in range(cfg.num_heads)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits [..., K, V], head k on axis -2."""
        return torch.stack(
            [head(block(hidden)) for block, head in zip(self.blocks, self.lm_heads, strict=True)],
            dim=-2,
        )

    @classmethod
    def from_lm_head(cls, cfg: MedusaConfig, lm_head: torch.Tensor) -> MedusaHeadsModel:
        """Medusa's initialization: every head starts as the target's lm_head ([V, H]) behind
        blocks that are the identity (zero weights and biases), so before training head k
        proposes what the target proposes next."""
        heads = cls(cfg)
        with torch.no_grad():
            for block, head in zip(heads.blocks, heads.lm_heads, strict=True):
                for layer in block.layers:
                    nn.init.zeros_(layer.weight)
                    if layer.bias is not None:
                        nn.init.zeros_(layer.bias)
                head.weight.copy_(lm_head)
        return heads


def save_medusa(heads: MedusaHeadsModel, out: Path) -> None:
    """config.json + model.safetensors in vLLM's layout."""
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(heads.cfg.to_hf(), indent=2) + "\n")
    tensors = {name: t.detach().contiguous() for name, t in heads.state_dict().items()}
    save_file(tensors, str(out / WEIGHTS_FILE))


def load_medusa(path: Path) -> MedusaHeadsModel:
    """A Medusa checkpoint directory in vLLM's layout (module docstring), as float32 heads.
    Raises `MedusaError` naming the file and what is wrong."""
    raw = read_config(path / CONFIG_FILE, MedusaError)
    cfg = _config(raw, path / CONFIG_FILE)
    tensors = {
        name: t.float()
        for name, t in read_tensors(
            path, lambda name: name.removeprefix("medusa_heads."), MedusaError
        ).items()
    }
    if "token_map" in tensors:
        raise MedusaError(f"{path}: a truncated vocabulary (token_map) is not supported")
    if raw.get("original_lm_head", False):  # one lm_head, shared by every head
        for h in range(1, cfg.num_heads):
            tensors.setdefault(f"lm_heads.{h}.weight", tensors.get("lm_heads.0.weight"))
    heads = MedusaHeadsModel(cfg)
    expected = heads.state_dict()
    check_tensors(path, tensors, expected, "vLLM's Medusa layout", MedusaError)
    heads.load_state_dict({n: tensors[n] for n in expected})
    return heads.eval()


def load_medusa_config(path: Path) -> MedusaConfig:
    """The sizes of the Medusa checkpoint in ``path`` (config.json only: no weights read)."""
    return _config(read_config(path / CONFIG_FILE, MedusaError), path / CONFIG_FILE)


def _config(raw: dict, file: Path) -> MedusaConfig:
    sizes = {}
    for key in ("hidden_size", "vocab_size", "num_heads", "num_hidden_layers"):
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MedusaError(f"{file}: {key} must be a positive integer, got {value!r}")
        sizes[key] = value
    truncated = raw.get("truncated_vocab_size")
    if truncated is not None and truncated != sizes["vocab_size"]:
        raise MedusaError(
            f"{file}: truncated_vocab_size {truncated} < vocab_size {sizes['vocab_size']}: a "
            "truncated vocabulary is not supported"
        )
    return MedusaConfig(
        num_heads=sizes["num_heads"],
        num_layers=sizes["num_hidden_layers"],
        hidden_size=sizes["hidden_size"],
        vocab_size=sizes["vocab_size"],
        bias=bool(raw.get("medusa_fc_bias", False)),
    )
