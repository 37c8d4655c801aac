"""CheckpointReader, the HF checkpoint as a LayerSource: tensors found by name in any shard,
read when asked (float32 from their stored dtype), the model it reads equal to load_model's."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ingot.pipeline.model.families.llama import TENSOR_NAMES
from ingot.pipeline.model.layer_source import ModelLayers
from ingot.pipeline.model.load import CheckpointError, CheckpointReader, load_model

from fixtures import make_checkpoint


def _reshard(src, dst, shards: int, dtype: torch.dtype, seed: int = 0):
    """The checkpoint's tensors cast to ``dtype``, scattered over ``shards`` files at random
    (a layer's tensors split across them, the shards listed out of order in the index)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(src / "model.safetensors"))
    rng = random.Random(seed)
    names = [f"model-{k + 1:05d}-of-{shards:05d}.safetensors" for k in range(shards)]
    parts: dict[str, dict[str, torch.Tensor]] = {n: {} for n in names}
    weight_map = {}
    for key, t in tensors.items():
        shard = rng.choice(names)
        parts[shard][key] = t.to(dtype)
        weight_map[key] = shard
    for shard, part in parts.items():
        save_file(part, str(dst / shard))
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items(), reverse=True))}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst, tensors


@pytest.mark.parametrize("tied", [False, True])
def test_sharded_bf16_checkpoint_reads_as_float32(tmp_path, tied):
    src = make_checkpoint(tmp_path / "src", "llama", num_hidden_layers=3, tie_word_embeddings=tied)
    ckpt, original = _reshard(src, tmp_path / "sharded", shards=3, dtype=torch.bfloat16)
    reader = CheckpointReader(ckpt)
    assert reader.lm_head_tied is tied
    expected = {TENSOR_NAMES.to_ir(k): v.to(torch.bfloat16).float() for k, v in original.items()}

    layer = reader.layer(1)
    for name, t in layer.state_dict().items():
        assert t.dtype == torch.float32
        assert torch.equal(t, expected[f"layers.1.{name}"]), name
    assert torch.equal(reader.embedding(), expected["embed_tokens.weight"])
    assert torch.equal(reader.final_norm().weight, expected["norm.weight"])
    head = "embed_tokens.weight" if tied else "lm_head.weight"
    assert torch.equal(reader.lm_head().weight, expected[head])

    # load_model is the same reader, whole: equal to the float32 original read through it.
    model = load_model(ckpt)
    assert model.lm_head_tied is tied
    memory = ModelLayers(model)
    for i in range(3):
        a, b = memory.layer(i).state_dict(), reader.layer(i).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_reader_keeps_nothing_between_calls(tmp_path):
    reader = CheckpointReader(make_checkpoint(tmp_path / "m", "llama"))
    a, b = reader.layer(0), reader.layer(0)
    assert a is not b and a.attn.q_proj.weight is not b.attn.q_proj.weight
    assert torch.equal(a.attn.q_proj.weight, b.attn.q_proj.weight)


def test_reader_checks_shapes_and_names_up_front(tmp_path):
    ckpt = make_checkpoint(tmp_path / "m", "llama")
    tensors = load_file(str(ckpt / "model.safetensors"))
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        metadata = f.metadata()
    tensors.pop("model.layers.1.mlp.up_proj.weight")
    tensors["model.layers.0.extra.weight"] = torch.zeros(2)
    save_file(tensors, str(ckpt / "model.safetensors"), metadata=metadata)
    with pytest.raises(CheckpointError, match="unexpected tensor 'model.layers.0.extra.weight'"):
        CheckpointReader(ckpt)
    tensors.pop("model.layers.0.extra.weight")
    save_file(tensors, str(ckpt / "model.safetensors"), metadata=metadata)
    with pytest.raises(CheckpointError, match=r"missing from the checkpoint: \['layers.1.mlp.up"):
        CheckpointReader(ckpt)
