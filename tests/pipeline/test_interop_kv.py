"""An fp8 KV cache in the compressed-tensors export: the build hands the export stage's
calibrated scales to the interop stage, which writes llm-compressor's `kv_cache_scheme` (FP8,
static, per tensor) and each layer's self_attn.k_scale / v_scale (the max over the layer's KV
heads of ingot's per-head scales); the interop stage is keyed on those scales. transformers
loads the checkpoint and rounds K/V with them. An int8 KV cache is refused for
compressed-tensors (vLLM has none); GPTQ has no KV scheme and is keyed as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ingot.artifacts import read_manifest
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.interop import interop_problems
from ingot.pipeline.model.config import ModelConfig
from ingot.pipeline.recipe import RecipeError, load_recipe

from fixtures import make_checkpoint, write_recipe

REPO = Path(__file__).resolve().parents[2]
CT = "compressed-tensors"


def _calibration(samples: int = 4) -> dict:
    data = str(REPO / "recipes" / "demo" / "pydoc-heldin.txt")
    return {"dataset": data, "samples": samples, "seq_len": 64}


def _recipe(path: Path, ckpt: Path, dtype: str = "fp8", samples: int = 4, **overrides) -> Path:
    """RTN int4 g32, a `dtype` KV cache, compressed-tensors and GPTQ exports."""
    kv_cache = {"dtype": dtype, "block_size": 8}
    overrides = {"interop": [CT, "gptq"], **overrides}
    return write_recipe(
        path, ckpt, kv_cache=kv_cache, calibration=_calibration(samples), **overrides
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kv-interop")
    ckpt = make_checkpoint(tmp / "ckpt", "llama")
    cache = StageCache(tmp / "cache")
    return tmp, ckpt, cache, build(_recipe(tmp / "fp8.yaml", ckpt), tmp / "art", cache=cache)


def _scales_per_layer(artifact: Path) -> dict[str, torch.Tensor]:
    """{"k" | "v": [layers, heads]} of the manifest's graph.kv_scales."""
    scales = read_manifest(artifact).graph.kv_scales
    return {"k": torch.tensor(scales.k), "v": torch.tensor(scales.v)}


def test_config_holds_the_fp8_kv_cache_scheme(built):
    _, _, _, result = built
    config = json.loads((result.artifact / "interop" / CT / "config.json").read_text())
    scheme = config["quantization_config"]["kv_cache_scheme"]
    expected = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}
    assert {key: scheme[key] for key in expected} == expected
    assert scheme["strategy"] == "tensor"
    # The weights' scheme is unchanged by it (RTN int4 g32: pack-quantized).
    assert config["quantization_config"]["format"] == "pack-quantized"


def test_k_and_v_scales_are_the_max_over_heads(built):
    _, _, _, result = built
    per_head = _scales_per_layer(result.artifact)
    tensors = load_file(result.artifact / "interop" / CT / "model.safetensors")
    layers = per_head["k"].shape[0]
    for kind in ("k", "v"):
        for i in range(layers):
            stored = tensors[f"model.layers.{i}.self_attn.{kind}_scale"]
            assert stored.dtype == torch.float32 and stored.shape == (1,)
            assert torch.equal(stored, per_head[kind][i].max().reshape(1))
    # The heads' scales differ, so the max is a choice (a coarser grid for the other heads).
    assert not torch.equal(per_head["k"].amax(dim=1), per_head["k"].amin(dim=1))
    # GPTQ holds no KV scheme: no scale tensors, no kv_cache_scheme.
    gptq = result.artifact / "interop" / "gptq"
    assert not [n for n in load_file(gptq / "model.safetensors") if n.endswith("k_scale")]
    assert "kv_cache_scheme" not in json.loads((gptq / "config.json").read_text()).get(
        "quantization_config", {}
    )


def test_transformers_loads_it_and_rounds_k_v_with_the_scales(built):
    """transformers' compressed-tensors quantizer applies `kv_cache_scheme`: a hook on each
    attention's KV cache fake-quantizes K and V (FP8, x / k_scale rounded to E4M3, times
    k_scale) before attention, so the loaded scales change what the model computes."""
    from transformers import AutoModelForCausalLM

    _, _, _, result = built
    per_head = _scales_per_layer(result.artifact)
    model = AutoModelForCausalLM.from_pretrained(result.artifact / "interop" / CT).eval()
    for i, layer in enumerate(model.model.layers):
        for kind in ("k", "v"):
            # The float32 scale, cast to the model's fp16 parameter (vLLM reads it as float32).
            loaded = getattr(layer.self_attn, f"{kind}_scale")
            assert loaded.dtype == torch.float16
            assert torch.equal(loaded.flatten(), per_head[kind][i].max().reshape(1).half())
    ids = torch.randint(2, 320, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits
        for layer in model.model.layers:  # a K/V grid 64x coarser: the rounding is visible
            layer.self_attn.k_scale.mul_(64)
            layer.self_attn.v_scale.mul_(64)
        coarser = model(ids).logits
    assert torch.isfinite(logits).all()
    assert not torch.allclose(logits, coarser, atol=1e-3)


def test_interop_stage_is_keyed_on_the_kv_scales(built):
    tmp, ckpt, cache, result = built
    before = {s.stage: s for s in result.stages}
    # A longer graph, the same windows: the export reruns, its scales and the exports do not.
    longer = build(
        _recipe(tmp / "longer.yaml", ckpt, export={"max_seq_len": 256}), tmp / "a2", cache=cache
    )
    after = {s.stage: s for s in longer.stages}
    assert not after["export"].cached
    assert after[f"interop:{CT}"].cached and after["interop:gptq"].cached
    # Fewer windows: other scales, so compressed-tensors is written again; GPTQ is not.
    fewer = build(_recipe(tmp / "fewer.yaml", ckpt, samples=2), tmp / "a3", cache=cache)
    after = {s.stage: s for s in fewer.stages}
    assert not after[f"interop:{CT}"].cached
    assert after[f"interop:{CT}"].key != before[f"interop:{CT}"].key
    assert after["interop:gptq"].cached
    new = load_file(fewer.artifact / "interop" / CT / "model.safetensors")
    assert torch.equal(
        new["model.layers.0.self_attn.k_scale"],
        _scales_per_layer(fewer.artifact)["k"][0].max().reshape(1),
    )


def test_int8_kv_cache_is_refused_for_compressed_tensors(built):
    tmp, ckpt, cache, _ = built
    recipe = _recipe(tmp / "int8.yaml", ckpt, dtype="int8")
    with pytest.raises(RecipeError) as error:
        build(recipe, tmp / "a4", cache=cache)
    lines = [line for line in str(error.value).splitlines() if "kv_cache.dtype" in line]
    assert len(lines) == 1 and CT in lines[0] and "int8" in lines[0]
    # GPTQ alone holds no KV scheme: the same KV cache is no problem for it.
    gptq_only = _recipe(tmp / "int8-gptq.yaml", ckpt, dtype="int8", interop=["gptq"])
    cfg = ModelConfig.from_hf(json.loads((ckpt / "config.json").read_text()))
    assert interop_problems(load_recipe(gptq_only), cfg) == []
