"""Gemma 3's text decoder (model_type gemma3_text) through the stages: config.json's rules
(transformers 5's per-layer-type rope_parameters and the older rope_local_base_freq /
sliding_window_pattern keys), the (1 + w) norm a scale folds into, the 262k vocabulary with
its embedding and lm_head quantized, and llama.cpp's gemma3 GGUF.

The family harness (tests/families/harness.py) checks the IR, both engines and the gated GPTQ
W4 / W8A8 builds against transformers' own Gemma 3, tied and untied, every feature on (FEATURES).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ingot.pipeline.interop import interop_problems, write_interop
from ingot.pipeline.interop.gguf import GGUF_FILE
from ingot.pipeline.model.config import ConfigError, ModelConfig
from ingot.pipeline.model.layers import OffsetRMSNorm
from ingot.pipeline.model.load import load_model
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.quantize.awq import apply_scales
from ingot.pipeline.quantize.checkpoint import load_ir, save_ir
from ingot.pipeline.recipe import load_recipe
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import write_recipe
from harness import (
    TINY,
    WINDOW,
    assert_ir_matches_transformers,
    compressed_tensors_and_ir,
    engine_and_reference,
    tiny_checkpoint,
)

# Every feature on: layers 0, 2 slide (sliding_window_pattern 2), 1, 3 are global; the local
# RoPE base unlike the global one, query_pre_attn_scalar unlike head_dim. The harness's norms
# are random (transformers initializes Gemma's to zero, where (1 + w) = 1 would hide a missing
# offset).
FEATURES = dict(
    num_hidden_layers=4,
    head_dim=16,
    sliding_window=WINDOW,
    sliding_window_pattern=2,
    query_pre_attn_scalar=24,
    rope_theta=40000.0,
    rope_local_base_freq=10000.0,
)
CONFIG = {**TINY, **FEATURES, "model_type": "gemma3_text"}


@pytest.fixture(scope="module", params=["tied", "untied"])
def checkpoint(request, tmp_path_factory) -> Path:
    tied = request.param == "tied"
    path = tmp_path_factory.mktemp(f"gemma3-{request.param}")
    return tiny_checkpoint(path, "gemma3_text", tie_word_embeddings=tied, **FEATURES)


@pytest.fixture(scope="module")
def tied(tmp_path_factory) -> Path:
    """Gemma 3 as released: tied."""
    return tiny_checkpoint(tmp_path_factory.mktemp("gemma3"), "gemma3_text", **FEATURES)


# -- config.json --------------------------------------------------------------------------------


def test_config_reads_the_layer_types_and_their_ropes_as_transformers_does():
    from transformers import Gemma3TextConfig

    # The older keys (rope_theta, rope_local_base_freq, rope_scaling, sliding_window_pattern)
    # as a Hub config.json has them, and transformers 5's rewrite of the same config.
    old = {
        **CONFIG,
        "model_type": "gemma3_text",
        "num_hidden_layers": 7,
        "sliding_window_pattern": 3,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    }
    new = Gemma3TextConfig(**{k: v for k, v in old.items() if k != "model_type"}).to_dict()
    for hf in (old, new):
        cfg = ModelConfig.from_hf(hf)
        slides = [t == "sliding_attention" for t in Gemma3TextConfig(**new).layer_types]
        assert [w is not None for w in cfg.windows] == slides == [True, True, False] * 2 + [True]
        assert (cfg.rope.theta, cfg.rope.type, cfg.rope.factor) == (40000.0, "linear", 8.0)
        assert cfg.rope_local.theta == 10000.0 and cfg.rope_local.type == "default"
        assert cfg.rope_of(0) == cfg.rope_local and cfg.rope_of(2) == cfg.rope
        assert cfg.attention_scale == pytest.approx(24**-0.5)
        assert cfg.embedding_scale == pytest.approx(8.0) and cfg.tie_word_embeddings
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg  # the artifact's copy


def test_logit_softcapping_is_refused_naming_the_key():
    hf = {**CONFIG, "model_type": "gemma3_text", "final_logit_softcapping": 30.0}
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_hf(hf)
    assert str(err.value) == (
        "config.json: final_logit_softcapping 30.0 is not supported (ingot takes gemma3_text "
        "checkpoints without it: null or false)"
    )


# -- IR -----------------------------------------------------------------------------------------


def test_ir_logits_match_transformers(checkpoint):
    assert_ir_matches_transformers(checkpoint, seq_len=40)


def test_ir_cached_greedy_matches_transformers_past_the_window(tied):
    """Decoding with the IR's cache past the window: each layer's K/V, window and RoPE kept
    apart (transformers' own cached generate as the oracle)."""
    from transformers import AutoModelForCausalLM

    ir = load_model(tied)
    ref = AutoModelForCausalLM.from_pretrained(tied, dtype=torch.float32).eval()
    ids = torch.randint(2, 320, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = ref.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)
        assert ir.generate_greedy(ids[0].tolist(), 16, stop_at_eos=False) == out[0, 24:].tolist()


def test_a_scale_folds_into_the_offset_norm():
    """AWQ / SmoothQuant divide a norm's output channels by s: (1 + w) / s, not w / s."""
    norm, linear = OffsetRMSNorm(8, 1e-6), torch.nn.Linear(8, 4, bias=False)
    with torch.no_grad():
        norm.weight.normal_(0, 0.5)
    x, s = torch.randn(3, 8), torch.rand(8) + 0.5
    with torch.no_grad():
        want = linear(norm(x))
        apply_scales(norm, [linear], s)
        torch.testing.assert_close(linear(norm(x)), want)


def test_an_eagle3_draft_for_gemma3_is_a_llama_layer():
    """The speculators layout's layer is Llama's (vLLM runs it so): 1 / sqrt(head_dim), the
    target's global RoPE, plain RMSNorm, no q/k norms, whatever the Gemma target has."""
    from ingot.pipeline.model.eagle3 import Eagle3Draft
    from ingot.pipeline.model.layers import RMSNorm

    cfg = ModelConfig.from_hf(CONFIG)
    h, v = cfg.hidden_size, cfg.vocab_size
    draft = Eagle3Draft.for_target(cfg, (0, 1, 3), torch.zeros(v, h), torch.zeros(v, h), seed=0)
    layer = draft.cfg.layer
    assert layer.attention_scale == pytest.approx(cfg.head_dim**-0.5)
    assert layer.rope_of(0) == cfg.rope and layer.embedding_scale is None
    assert type(draft.norm) is RMSNorm and draft.layers[0].self_attn.q_norm is None


# -- 262k vocabulary ----------------------------------------------------------------------------


def test_the_262k_vocabulary_builds_with_int8_embedding_and_lm_head(tmp_path):
    """Gemma 3's vocabulary (262,144 rows, tied): both quantized int8 per row, the build's own
    check of the graph and engine against the IR passing, greedy tokens as the IR's."""
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache
    from ingot.runtime import LoadedModel, SamplingParams

    ckpt = tiny_checkpoint(
        tmp_path / "ckpt",
        "gemma3_text",
        **{**FEATURES, "vocab_size": 262_144, "hidden_size": 32, "num_hidden_layers": 2},
    )
    layers = {"method": "rtn", "bits": 4, "group_size": 32, "targets": ["re:layers\\..*"]}
    heads = {**layers, "bits": 8, "group_size": -1, "targets": ["embed_tokens", "lm_head"]}
    recipe = write_recipe(
        tmp_path / "r.yaml",
        ckpt,
        quantize=[layers, {**heads, "ignore": []}],
        export={"max_seq_len": 32},
        targets=[{"engine": "onnxruntime", "matmul_accuracy_level": 0}],
    )
    built = build(recipe, tmp_path / "out", cache=StageCache(tmp_path / "cache"))
    ir = load_ir(next(p.parent for p in (tmp_path / "cache").rglob("ir_config.json")))
    prompt = [0, 17, 5, 200_000, 262_143]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    [completion] = LoadedModel.load(built.artifact).generator().generate([prompt], params)
    with torch.inference_mode():
        assert completion.token_ids == ir.generate_greedy(prompt, 8, stop_at_eos=False)


# -- the engines --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engines(tied, tmp_path_factory) -> tuple[list, Path]:
    """(engine_and_reference's runs, the artifact both engines ran) of the tied checkpoint, as
    Gemma 3 ships (an untied lm_head takes the engines' path every family shares)."""
    work = tmp_path_factory.mktemp("gemma3-engines")
    return engine_and_reference(tied, work), work / "artifact"


def test_engines_greedy_match_transformers(engines):
    runs, _ = engines
    assert max(len(prompt) for prompt, _, _ in runs) > WINDOW  # a prompt past the window
    for prompt, tokens, reference in runs:
        for engine, ours in tokens.items():
            assert ours == reference, (engine, prompt)


def test_openvino_computes_onnxruntimes_logprobs(engines):
    """The OpenVINO rebuild of the layer (GELU, post-norms, q/k norms, the embedding's scale,
    q's factor, the local RoPE table) against the ONNX Runtime engine on one artifact, both
    exact: the sampled tokens' logprobs agree to float rounding past the window (a missing
    piece moves them by 0.08 to 2; greedy tokens of a random model can miss it)."""
    from ingot.runtime import LoadedModel, SamplingParams

    _, artifact = engines
    prompts = ["def add(a, b):", "The quick brown fox jumps over the lazy dog " * 3]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=1)

    def run(engine: str) -> list:
        return LoadedModel.load(artifact, engine=engine).generator().generate(prompts, params)

    for ours, theirs in zip(run("openvino"), run("onnxruntime"), strict=True):
        assert ours.token_ids == theirs.token_ids
        np.testing.assert_allclose(ours.logprobs, theirs.logprobs, atol=1e-4)


# -- interop ------------------------------------------------------------------------------------


def test_transformers_runs_the_compressed_tensors_export(checkpoint, tmp_path):
    """Gemma's names written back (post_attention_layernorm is the attention's post-norm, the
    norms' w as stored)."""
    theirs, ours = compressed_tensors_and_ir(checkpoint, tmp_path)
    torch.testing.assert_close(theirs, ours, atol=1e-4 * float(ours.abs().max()), rtol=0)


def _rtn_ir(tmp: Path, checkpoint: Path) -> Path:
    model = load_model(checkpoint)
    entry = {
        "method": "rtn",
        "bits": 4,
        "group_size": 32,
        "symmetric": True,
        "targets": ["re:.*"],
        "ignore": ["lm_head"],
    }
    quantize_model(model, [quantize_entry(entry)])
    (tmp / "ir").mkdir()
    save_ir(model, tmp / "ir")
    return tmp / "ir"


def test_llama_cpp_runs_the_gguf_as_the_ir(tmp_path):
    """llama.cpp's gemma3 on the file computes the IR's logits over 48 tokens (three windows):
    norms written as (1 + w), the sliding layers' pattern and RoPE base, q/k norms, the
    embedding's scale (llama.cpp's own). llama.cpp takes its attention scale from head_dim
    (the file's is ignored), so this checkpoint's query_pre_attn_scalar is head_dim; the
    tolerance is test_interop_gguf's (its 8-bit activations)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    ckpt = tiny_checkpoint(
        tmp_path / "ckpt", "gemma3_text", **{**FEATURES, "query_pre_attn_scalar": 16}
    )
    ir = _rtn_ir(tmp_path, ckpt)
    write_interop("gguf", ir, ckpt, tmp_path / "gguf")
    model = load_ir(ir)
    with torch.no_grad():  # what the file rounds: fp16 scales and float weights
        for m in model.modules():
            if hasattr(m, "scales"):
                m.scales.copy_(m.scales.half().float())
            elif isinstance(m, torch.nn.Linear | torch.nn.Embedding):
                m.weight.copy_(m.weight.half().float())
    ids = torch.randint(2, 320, (48,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.inference_mode():
        want = model(torch.tensor([ids]))[0][0].numpy()
    llm = llama_cpp.Llama(
        model_path=str(tmp_path / "gguf" / GGUF_FILE),
        n_ctx=256,
        logits_all=True,
        n_threads=1,
        verbose=False,
    )
    llm.eval(ids)
    got = np.array(llm.scores[: len(ids)], dtype=np.float32)
    err = float(np.abs(got - want).max() / want.std())
    agree = float((got.argmax(-1) == want.argmax(-1)).mean())
    assert err < 0.5 and agree >= 0.85, (err, agree)


def test_gguf_refuses_an_attention_scale_llama_cpp_would_not_use(tmp_path, tied):
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", tied, interop=["gguf"]))
    assert interop_problems(recipe, ModelConfig.from_dir(tied)) == [
        "interop.0: gguf: llama.cpp scales gemma3 attention by (head_dim) ** -0.5 = 16 ** -0.5, "
        "not config.json query_pre_attn_scalar 24 ** -0.5"
    ]
    # Gemma 3 27B's rule: 62 layers scale by hidden_size / heads (5376 / 32 = 168).
    big = {
        **CONFIG,
        "model_type": "gemma3_text",
        "num_hidden_layers": 62,
        "hidden_size": 5376,
        "num_attention_heads": 32,
        "head_dim": 128,
        "query_pre_attn_scalar": 168,
    }
    assert interop_problems(recipe, ModelConfig.from_hf(big)) == []
