"""Random-weight bf16 checkpoints of real Llama shapes, written shard by shard.

The 8B shape is ~16 GB: building it through transformers would hold the whole model in memory
(and this machine has 24 GB), so the tensors are drawn and written one shard at a time, with a
`model.safetensors.index.json` as the hub's sharded checkpoints have. The values (normal,
std 0.02) do not matter for memory and speed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from benchmarks.decode.models import LLAMA_1B_SHAPE, write_wordlevel_tokenizer

__all__ = ["SHAPES", "write_random_checkpoint"]

_ROPE = LLAMA_1B_SHAPE["rope_parameters"]  # Llama 3.2's llama3 scaling
_COMMON = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    vocab_size=128256,
    hidden_act="silu",
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    bos_token_id=128000,
    eos_token_id=128001,
    head_dim=128,
    num_key_value_heads=8,
    rope_parameters=_ROPE,
    torch_dtype="bfloat16",
)
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": dict(
        _COMMON,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        head_dim=64,
        tie_word_embeddings=True,
    ),
    "llama-3.2-3b": dict(
        _COMMON,
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=28,
        num_attention_heads=24,
        tie_word_embeddings=True,
    ),
    "llama-3.1-8b": dict(
        _COMMON,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        tie_word_embeddings=False,
        rope_parameters=dict(_ROPE, factor=8.0),
    ),
}
_SHARD_BYTES = 2 << 30


def _tensors(cfg: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every tensor, in the checkpoint's order."""
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = (
        cfg["num_attention_heads"] * cfg["head_dim"],
        cfg["num_key_value_heads"] * cfg["head_dim"],
    )
    names = [("model.embed_tokens.weight", (v, h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        names += [
            (f"{p}.input_layernorm.weight", (h,)),
            (f"{p}.self_attn.q_proj.weight", (q, h)),
            (f"{p}.self_attn.k_proj.weight", (kv, h)),
            (f"{p}.self_attn.v_proj.weight", (kv, h)),
            (f"{p}.self_attn.o_proj.weight", (h, q)),
            (f"{p}.post_attention_layernorm.weight", (h,)),
            (f"{p}.mlp.gate_proj.weight", (f, h)),
            (f"{p}.mlp.up_proj.weight", (f, h)),
            (f"{p}.mlp.down_proj.weight", (h, f)),
        ]
    names.append(("model.norm.weight", (h,)))
    if not cfg["tie_word_embeddings"]:
        names.append(("lm_head.weight", (v, h)))
    return names


def write_random_checkpoint(path: Path, shape: str) -> Path:
    """`path` holds a random checkpoint of `shape` (seed 0), written unless already complete."""
    import torch
    from safetensors.torch import save_file

    if (path / ".complete").exists():
        return path
    cfg = SHAPES[shape]
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, dims in _tensors(cfg):
        if len(dims) == 1:
            tensor = torch.ones(dims, dtype=torch.bfloat16)  # RMSNorm weights
        else:
            tensor = (torch.randn(dims, generator=generator) * 0.02).to(torch.bfloat16)
        if size and size + tensor.nbytes > _SHARD_BYTES:
            _flush(tmp, shards, save_file)
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += tensor.nbytes
    _flush(tmp, shards, save_file)
    _write_index(tmp, len(shards))
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_wordlevel_tokenizer(tmp, cfg)
    (tmp / ".complete").write_text("")
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


def _flush(directory: Path, shards: list[dict], save_file) -> None:
    """Write the last shard under a provisional name and drop its tensors from memory."""
    index = len(shards)
    save_file(shards[-1], str(directory / f"shard-{index:05d}.safetensors"), {"format": "pt"})
    (directory / f"shard-{index:05d}.names").write_text("\n".join(shards[-1]))
    shards[-1] = {}


def _write_index(directory: Path, count: int) -> None:
    """Rename shards to the hub's model-0000i-of-0000n names and write the index."""
    weight_map = {}
    for i in range(1, count + 1):
        final = f"model-{i:05d}-of-{count:05d}.safetensors"
        os.replace(directory / f"shard-{i:05d}.safetensors", directory / final)
        names = directory / f"shard-{i:05d}.names"
        weight_map |= dict.fromkeys(names.read_text().splitlines(), final)
        names.unlink()
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
