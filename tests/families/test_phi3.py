"""Phi-3 / Phi-4-mini (model_type phi3) through every stage, against transformers' own Phi3:
fused qkv_proj / gate_up_proj in the checkpoint (split in the IR, stacked again by the interop
writers), LongRoPE (short and long factors, the attention factor), partial rotary (0.75, as
Phi-4-mini), a sliding window on every layer, tied and untied heads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from ingot.pipeline.interop import write_interop
from ingot.pipeline.interop.gguf import GGUF_FILE
from ingot.pipeline.model.config import ConfigError, ModelConfig
from ingot.pipeline.model.load import load_model
from ingot.pipeline.preflight import check_recipe_against_model
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.quantize.checkpoint import save_ir
from ingot.pipeline.recipe import RecipeError, load_recipe
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import write_recipe
from harness import (
    WINDOW,
    _greedy,  # transformers' greedy tokens, a full forward per token
    assert_ir_matches_transformers,
    compressed_tensors_and_ir,
    engine_and_reference,
    tiny_checkpoint,
)

ORIGINAL = 128  # original_max_position_embeddings: longer sequences take the long factors
ROTATED_PAIRS = 6  # head_dim 16 (64 / 4 heads) * partial_rotary_factor 0.75 / 2
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0 + 0.2 * i for i in range(ROTATED_PAIRS)],
    "long_factor": [1.5 + 0.7 * i for i in range(ROTATED_PAIRS)],
}
# max_position_embeddings 4x the original context: LongRoPE's attention factor is
# sqrt(1 + ln 4 / ln 128) = 1.13, not 1.
FEATURES = dict(
    partial_rotary_factor=0.75,
    rope_scaling=LONGROPE,
    original_max_position_embeddings=ORIGINAL,
    max_position_embeddings=4 * ORIGINAL,
    sliding_window=WINDOW,
)
TRAINED = {
    **FEATURES,
    "original_max_position_embeddings": 256,
    "sliding_window": 64,
    "num_hidden_layers": 3,
}
# The recipe naming the checkpoint's fused modules (qkv_proj, gate_up_proj), as one written
# for llm-compressor on Phi-3 does; the IR's own names (q_proj, ...) are write_recipe's default.
FUSED_NAMES = [
    {
        "method": "rtn",
        "bits": 4,
        "group_size": 32,
        "symmetric": True,
        "targets": ["re:.*qkv_proj", "re:.*o_proj", "re:.*gate_up_proj", "re:.*down_proj"],
    }
]


@pytest.fixture(scope="module", params=["tied", "untied"])
def checkpoint(request, tmp_path_factory):
    tied = request.param == "tied"
    path = tmp_path_factory.mktemp(f"phi3-{request.param}")
    return tiny_checkpoint(path, "phi3", tie_word_embeddings=tied, **FEATURES)


def test_config_reads_longrope_and_partial_rotary(checkpoint):
    cfg = ModelConfig.from_dir(checkpoint)
    assert (cfg.rotary_dim, cfg.rotated_dim, cfg.sliding_window) == (12, 12, WINDOW)
    assert cfg.rope.type == "longrope" and cfg.rope.original_max_position_embeddings == ORIGINAL
    assert cfg.rope.long_factor == tuple(LONGROPE["long_factor"])
    assert cfg.rope.attention_factor == pytest.approx((1 + np.log(4) / np.log(ORIGINAL)) ** 0.5)


@pytest.mark.parametrize("seq_len", [40, ORIGINAL + 32])  # short factors, then long ones
def test_ir_logits_match_transformers(checkpoint, seq_len):
    assert_ir_matches_transformers(checkpoint, seq_len=seq_len)


def test_engines_greedy_match_transformers(checkpoint, tmp_path):
    """tied: a recipe naming the IR's linears (write_recipe's RTN over all of them) and
    export.max_seq_len within the original context (the short factors, as transformers at
    these lengths). untied: a recipe naming the checkpoint's fused modules and max_seq_len past
    the original context: the graph's one table then holds the long factors for every
    position (llama.cpp's rule: the context decides once), and the reference is transformers
    made to take them at every length. Both engines: ONNX Runtime runs the graph's
    RotaryEmbedding (rotary_embedding_dim), OpenVINO's rebuild rotates from its table."""
    tied = ModelConfig.from_dir(checkpoint).tie_word_embeddings
    recipe = None if tied else {"quantize": FUSED_NAMES, "export": {"max_seq_len": 2 * ORIGINAL}}
    runs = engine_and_reference(checkpoint, tmp_path, recipe)
    assert max(len(prompt) for prompt, _, _ in runs) > WINDOW  # a prompt past the window
    manifest = json.loads((tmp_path / "artifact" / "manifest.json").read_text())
    assert manifest["model"]["quantization"][0]["modules"] == 7 * 2  # q k v o gate up down
    if not tied:
        ref = _long_factors_only(tmp_path / "dequantized", tmp_path / "long-only")
        short = [reference for _, _, reference in runs]
        runs = [(prompt, engines, _greedy(ref, prompt, 32)) for prompt, engines, _ in runs]
        assert short != [reference for _, _, reference in runs]  # the factors matter here
    for prompt, engines, reference in runs:
        for engine, tokens in engines.items():
            assert tokens == reference, (engine, prompt)


def _long_factors_only(dequantized: Path, out: Path) -> torch.nn.Module:
    """transformers on the harness's dequantized checkpoint with short_factor := long_factor."""
    shutil.copytree(dequantized, out)
    config = json.loads((out / "config.json").read_text())
    config["rope_parameters"]["short_factor"] = LONGROPE["long_factor"]
    (out / "config.json").write_text(json.dumps(config))
    return AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()


def test_recipe_names_fused_or_split_modules(tmp_path):
    cfg = ModelConfig.from_hf(
        json.loads((tiny_checkpoint(tmp_path, "phi3", **FEATURES) / "config.json").read_text())
    )

    def check(quantize, **fields):
        path = write_recipe(tmp_path / "r.yaml", tmp_path, quantize=quantize, **fields)
        check_recipe_against_model(load_recipe(path), cfg)

    check(FUSED_NAMES)
    rtn = {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": True}
    # The IR's names come first: re:.*v_proj selects v_proj alone (qkv_proj ends in v_proj too).
    check([{**rtn, "targets": ["re:.*q_proj"]}, {**rtn, "targets": ["re:.*[kv]_proj"]}])
    with pytest.raises(RecipeError, match=r"interop: layers\.0\.attn\.qkv_proj is one tensor"):
        check(
            [{**rtn, "targets": ["re:.*q_proj"]}, {**rtn, "bits": 8, "targets": ["re:.*v_proj"]}],
            interop=["compressed-tensors"],
        )
    with pytest.raises(RecipeError, match=r"quantize\.0\.targets\.0: matches no module"):
        check([{**rtn, "targets": ["layers.0.attn.qkv"]}])


def test_config_refuses_factors_that_do_not_fit(tmp_path):
    config = json.loads((tiny_checkpoint(tmp_path, "phi3", **FEATURES) / "config.json").read_text())
    config["rope_parameters"]["long_factor"] = [1.0] * 8
    with pytest.raises(ConfigError, match="long_factor has 8 entries .expected 6"):
        ModelConfig.from_hf(config)
    config = {**config, "partial_rotary_factor": 0.7, "rope_parameters": {"rope_theta": 1e4}}
    with pytest.raises(ConfigError, match="partial_rotary_factor 0.7 rotates 11 of head_dim 16"):
        ModelConfig.from_hf(config)


def test_transformers_runs_the_compressed_tensors_export(checkpoint, tmp_path):
    """qkv_proj / gate_up_proj written stacked, as transformers' Phi3 builds them."""
    theirs, ours = compressed_tensors_and_ir(checkpoint, tmp_path)
    torch.testing.assert_close(theirs, ours, atol=1e-4 * float(ours.abs().max()), rtol=0)


def _quantized_ir(ckpt: Path, out: Path):
    """The IR of `ckpt` with RTN int4 g32 on the fused names (lm_head float), saved at `out`."""
    model = load_model(ckpt)
    quantize_model(model, [quantize_entry({**FUSED_NAMES[0], "ignore": ["lm_head"]})])
    out.mkdir()
    save_ir(model, out)
    return model


def test_gguf_runs_in_llama_cpp_as_phi3(tmp_path):
    """llama.cpp's phi3: fused attn_qkv / ffn_up, NEOX RoPE over the rotated channels,
    rope_factors_short (its context, 256 tokens, within the original context 512) and the
    attention factor. No window: llama.cpp runs Phi-3 without one (refused otherwise)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    features = {**FEATURES, "sliding_window": None, "original_max_position_embeddings": 512}
    ckpt = tiny_checkpoint(
        tmp_path / "ckpt", "phi3", **{**features, "max_position_embeddings": 2048}
    )
    model = _quantized_ir(ckpt, tmp_path / "ir")
    write_interop("gguf", tmp_path / "ir", ckpt, tmp_path / "gguf")
    with torch.no_grad():  # the file's scales and float weights are fp16
        for m in model.modules():
            for name in ("scales", "weight"):
                t = getattr(m, name, None)
                if isinstance(t, torch.Tensor) and t.dim() == 2 and t.is_floating_point():
                    t.copy_(t.half().float())
    ids = torch.randint(2, 320, (48,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.inference_mode():
        want = model(torch.tensor([ids]))[0][0].numpy()
    llm = llama_cpp.Llama(
        model_path=str(tmp_path / "gguf" / GGUF_FILE), n_ctx=256, logits_all=True, verbose=False
    )
    llm.eval(ids)
    got = np.array(llm.scores[: len(ids)], dtype=np.float32)
    # llama.cpp rounds activations to 8 bits for Q4_0 products (tests/pipeline/
    # test_interop_gguf.py): ~0.2 of the logits' deviation; without the attention factor,
    # the partial rotary or with the long factors it is 2-5.
    assert float(np.abs(got - want).max() / want.std()) < 0.5
    assert float((got.argmax(-1) == want.argmax(-1)).mean()) >= 0.85
