"""GGUF interop, read back two ways: gguf's GGUFReader with numpy block unpackers written here
from ggml's block layouts (not the writer's packing), and llama.cpp itself (llama-cpp-python).

The blocks hold ingot's codes exactly; their one rounding is the scale d stored as fp16 (ingot
keeps fp32), so a block equals the IR's weights recomputed with fp16 scales, bit for bit. What
fp16 scales change is measured here: at most 2^-11 of a weight's magnitude (fp16's relative
step), far below the int4 step itself. llama.cpp then computes Q4_0 / Q8_0 products against
activations it quantizes to 8 bits, which ingot does not; the llama.cpp comparisons state the
tolerance that leaves (logits, greedy tokens on the trained demo model, perplexity).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.evaluate.windows import eval_windows
from ingot.pipeline.interop import InteropError, interop_problems, write_interop
from ingot.pipeline.interop.gguf import GGUF_FILE
from ingot.pipeline.model.config import ModelConfig
from ingot.pipeline.model.load import load_model
from ingot.pipeline.model.qembedding import QuantizedEmbedding
from ingot.pipeline.model.qlinear import QuantizedLinear
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.quantize.checkpoint import load_ir, save_ir
from ingot.pipeline.recipe import load_recipe
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import make_checkpoint

gguf = pytest.importorskip("gguf")

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes" / "demo"
FP16_STEP = 2.0**-11  # fp16's relative rounding step (10 explicit mantissa bits, nearest)
NEAR_TIE = 0.25  # logits: ~3x the largest llama.cpp vs ingot difference seen on the demo model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("gguf") / "llama", "llama")


def _ir(tmp: Path, checkpoint: Path, *entries: dict) -> Path:
    model = load_model(checkpoint)
    base = {"method": "rtn", "targets": ["re:.*"], "ignore": ["lm_head"], "symmetric": True}
    quantize_model(model, [quantize_entry({**base, **e}) for e in entries])
    out = tmp / "ir"
    out.mkdir()
    save_ir(model, out)
    return out


def _export(tmp: Path, checkpoint: Path, *entries: dict) -> tuple[Path, Path]:
    ir = _ir(tmp, checkpoint, *entries)
    write_interop("gguf", ir, checkpoint, tmp / "gguf")
    return ir, tmp / "gguf" / GGUF_FILE


def _tensors(path: Path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def _field(reader, key: str):
    return reader.fields[key].contents()


def _quantized(ir: Path) -> dict[str, QuantizedLinear]:
    return {n: m for n, m in load_ir(ir).named_modules() if isinstance(m, QuantizedLinear)}


def _gguf_name(ir_name: str) -> str:
    """IR linear name -> its GGUF tensor (llama.cpp's names, written out here by hand)."""
    local = {
        "attn.q_proj": "attn_q",
        "attn.k_proj": "attn_k",
        "attn.v_proj": "attn_v",
        "attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    if ir_name == "lm_head":
        return "output.weight"
    _, i, rest = ir_name.split(".", 2)
    return f"blk.{i}.{local[rest]}.weight"


def _to_llama_cpp_rows(w: np.ndarray, name: str, cfg: ModelConfig) -> np.ndarray:
    """HF's q / k rows in llama.cpp's order: in each head, rows i and d/2 + i go to 2i, 2i+1."""
    heads = {"q_proj": cfg.num_heads, "k_proj": cfg.num_kv_heads}.get(name.rsplit(".", 1)[-1])
    if heads is None:
        return w
    d = w.shape[0] // heads
    out = np.empty_like(w)
    for h in range(heads):
        block = w[h * d : (h + 1) * d]
        out[h * d : (h + 1) * d : 2] = block[: d // 2]
        out[h * d + 1 : (h + 1) * d : 2] = block[d // 2 :]
    return out


def _fp16_scales(q: QuantizedLinear) -> np.ndarray:
    """The IR's dequantized weight [N, K] with its scales rounded to fp16, as the blocks hold."""
    rounded = QuantizedLinear(
        q.codes, q.scales.half().float(), q.zero_points, q.bits, q.group_size, g_idx=q.g_idx
    )
    return rounded.dequantize().numpy()


# -- independent block unpackers (ggml-common.h: block_q4_0, block_q4_1, block_q8_0) --------------


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] values: byte j holds value j (low) and j + 16 (high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int64)


def _half(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def unpack(raw: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """raw [N, bytes] -> (values q [N, K] int64, d [N, K/32], m [N, K/32] or None)."""
    n = raw.shape[0]
    size = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[kind]
    blocks = raw.reshape(n, -1, size)
    if kind == "Q4_0":  # ggml_half d; uint8 qs[16]: w = (q - 8) * d
        return _nibbles(blocks[..., 2:]) - 8, _half(blocks[..., :2])[..., 0], None
    if kind == "Q4_1":  # ggml_half d, m; uint8 qs[16]: w = q * d + m
        d, m = _half(blocks[..., :2])[..., 0], _half(blocks[..., 2:4])[..., 0]
        return _nibbles(blocks[..., 4:]), d, m
    # Q8_0: ggml_half d; int8 qs[32]: w = q * d
    q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).astype(np.int64)
    return q, _half(blocks[..., :2])[..., 0], None


def dequantize(raw: np.ndarray, kind: str) -> np.ndarray:
    q, d, m = unpack(raw, kind)
    w = q * d[..., None] + (0.0 if m is None else m[..., None])
    return w.reshape(raw.shape[0], -1).astype(np.float32)


# -- the blocks ---------------------------------------------------------------------------------


def test_q4_0_blocks_are_the_ir_codes_and_fp16_scales(tmp_path, checkpoint):
    ir, path = _export(tmp_path, checkpoint, {"bits": 4, "group_size": 32})
    tensors = _tensors(path)
    cfg = load_ir(ir).cfg
    worst = 0.0
    for name, q in _quantized(ir).items():
        t = tensors[_gguf_name(name)]
        assert t.tensor_type == gguf.GGMLQuantizationType.Q4_0, name
        raw = np.asarray(t.data)
        codes, d, _ = unpack(raw, "Q4_0")
        want_codes = _to_llama_cpp_rows(q.codes.numpy().astype(np.int64), name, cfg)
        np.testing.assert_array_equal(codes.reshape(q.codes.shape), want_codes)
        scales = _to_llama_cpp_rows(q.scales.numpy(), name, cfg)
        np.testing.assert_array_equal(d, scales.astype(np.float16).astype(np.float32))
        got = dequantize(raw, "Q4_0")
        np.testing.assert_array_equal(got, _to_llama_cpp_rows(_fp16_scales(q), name, cfg))
        # gguf's own dequantizer reads the same weights.
        lib = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0)
        np.testing.assert_array_equal(lib.reshape(got.shape), got)
        # The fp16 scale is the one difference from the IR: within fp16's relative step.
        exact = _to_llama_cpp_rows(q.dequantize().numpy(), name, cfg)
        scale_of = np.repeat(scales, 32, axis=1)
        worst = max(worst, float((np.abs(got - exact) / scale_of / 8).max()))
    assert 0 < worst <= FP16_STEP


@pytest.mark.parametrize(
    ("bits", "group_size", "symmetric", "kind"),
    [
        (4, 64, True, "Q4_0"),  # a group of 64: two blocks with the group's scale
        (4, -1, True, "Q4_0"),  # per channel: K / 32 blocks with the channel's scale
        (4, 32, False, "Q4_1"),
        (8, 32, True, "Q8_0"),
        (8, 64, True, "Q8_0"),
        (8, 32, False, "F16"),  # no block type has an int8 zero point
    ],
)
def test_block_type_by_scheme(tmp_path, checkpoint, bits, group_size, symmetric, kind):
    spec = {"bits": bits, "group_size": group_size, "symmetric": symmetric}
    ir, path = _export(tmp_path, checkpoint, spec)
    tensors = _tensors(path)
    cfg = load_ir(ir).cfg
    for name, q in _quantized(ir).items():
        t = tensors[_gguf_name(name)]
        assert t.tensor_type.name == kind, name
        raw = np.asarray(t.data)
        exact = _to_llama_cpp_rows(q.dequantize().numpy(), name, cfg)
        if kind == "F16":
            np.testing.assert_array_equal(raw, exact.astype(np.float16))
            continue
        got = dequantize(raw, kind)
        if kind == "Q4_1":  # codes as they are; d = fp16(s), m = fp16(-z * s)
            codes, d, m = unpack(raw, kind)
            want = _to_llama_cpp_rows(q.codes.numpy().astype(np.int64), name, cfg)
            np.testing.assert_array_equal(codes.reshape(want.shape), want)
            s = _to_llama_cpp_rows(q.scales.numpy(), name, cfg)
            z = _to_llama_cpp_rows(q.zero_points.numpy().astype(np.float32), name, cfg)
            np.testing.assert_array_equal(d, s.astype(np.float16).astype(np.float32))
            np.testing.assert_array_equal(m, (-z * s).astype(np.float16).astype(np.float32))
            # d and m each within half an fp16 step: w moves by at most 2^-11 (15 s + |m|).
            bound = FP16_STEP * (15 + np.repeat(z, 32, axis=1)) * np.repeat(s, 32, axis=1)
            assert (np.abs(got - exact) <= bound + 1e-12).all(), name
        else:
            np.testing.assert_array_equal(got, _to_llama_cpp_rows(_fp16_scales(q), name, cfg))


def test_f16_where_no_block_holds_the_codes(tmp_path):
    """Blocks are 32 input channels of contiguous groups: a per-channel down_proj 80 wide and
    act-order groups are written as their dequantized weights in F16."""
    ckpt = make_checkpoint(tmp_path / "ckpt", "llama", intermediate_size=80)
    ir = _ir(tmp_path, ckpt, {"bits": 4, "group_size": -1})
    model = load_ir(ir)
    q = model.layers[1].mlp.up_proj  # K = 64: two groups of 32, then scattered
    g_idx = torch.randperm(64, generator=torch.Generator().manual_seed(0)) // 32
    codes = torch.zeros(q.out_features, 64, dtype=torch.int8)
    model.layers[1].mlp.up_proj = QuantizedLinear(
        codes, q.scales.repeat(1, 2), None, 4, 32, g_idx=g_idx
    )
    save_ir(model, ir)
    write_interop("gguf", ir, ckpt, tmp_path / "gguf")
    tensors = _tensors(tmp_path / "gguf" / GGUF_FILE)
    kinds = {n: tensors[_gguf_name(n)].tensor_type.name for n in _quantized(ir)}
    f16 = {n for n, k in kinds.items() if k == "F16"}
    assert f16 == {"layers.0.mlp.down_proj", "layers.1.mlp.down_proj", "layers.1.mlp.up_proj"}
    assert set(kinds.values()) == {"F16", "Q4_0"}
    for name, q in _quantized(ir).items():
        if name in f16:
            raw = np.asarray(tensors[_gguf_name(name)].data)
            np.testing.assert_array_equal(raw, q.dequantize().numpy().astype(np.float16))


def test_float_tensors_tied_and_quantized_lm_head(tmp_path):
    ckpt = make_checkpoint(tmp_path / "tied", "llama", tie_word_embeddings=True)
    (tmp_path / "a").mkdir()
    _, path = _export(tmp_path / "a", ckpt, {"bits": 4, "group_size": 32})
    tensors = _tensors(path)
    assert "output.weight" not in tensors  # a tied float head: llama.cpp reuses token_embd
    assert tensors["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    norms = [n for n in tensors if n.endswith("norm.weight")]
    assert len(norms) == 2 * 2 + 1
    assert all(tensors[n].tensor_type == gguf.GGMLQuantizationType.F32 for n in norms)
    embed = load_model(ckpt).embed_tokens.weight.detach().half().numpy()
    np.testing.assert_array_equal(np.asarray(tensors["token_embd.weight"].data), embed)

    (tmp_path / "b").mkdir()  # a quantized lm_head holds codes of its own: written as output
    spec = {"bits": 4, "group_size": 32, "ignore": []}
    ir, path = _export(tmp_path / "b", ckpt, spec)
    head = _tensors(path)["output.weight"]
    assert head.tensor_type == gguf.GGMLQuantizationType.Q4_0
    lm_head = load_ir(ir).lm_head
    np.testing.assert_array_equal(dequantize(np.asarray(head.data), "Q4_0"), _fp16_scales(lm_head))


def test_quantized_embedding_is_q8_0_token_embd_read_by_a_tied_head(tmp_path):
    ckpt = make_checkpoint(tmp_path / "tied", "llama", tie_word_embeddings=True)
    ir, path = _export(tmp_path, ckpt, {"bits": 4, "group_size": 32}, HEADS_PER_ROW)
    tensors = _tensors(path)
    assert "output.weight" not in tensors  # tied: the logits come from token_embd too
    embed = tensors["token_embd.weight"]
    assert embed.tensor_type == gguf.GGMLQuantizationType.Q8_0
    table = load_ir(ir).embed_tokens.linear()  # the IR's codes, fp16 scales: exactly the file's
    np.testing.assert_array_equal(dequantize(np.asarray(embed.data), "Q8_0"), _fp16_scales(table))


# -- metadata and tokenizer ---------------------------------------------------------------------


def test_metadata_and_vocabulary(tmp_path, checkpoint):
    from tokenizers import Tokenizer

    ir, path = _export(tmp_path, checkpoint, {"bits": 4, "group_size": 32})
    reader = gguf.GGUFReader(path)
    cfg = load_ir(ir).cfg
    assert _field(reader, "general.architecture") == "llama"
    expected = {
        "llama.block_count": cfg.num_layers,
        "llama.embedding_length": cfg.hidden_size,
        "llama.feed_forward_length": cfg.intermediate_size,
        "llama.attention.head_count": cfg.num_heads,
        "llama.attention.head_count_kv": cfg.num_kv_heads,
        "llama.rope.dimension_count": cfg.head_dim,
        "llama.context_length": cfg.max_position_embeddings,
        "llama.vocab_size": cfg.vocab_size,
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_Q4_0),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
    }
    assert {k: _field(reader, k) for k in expected} == expected
    assert _field(reader, "llama.rope.freq_base") == pytest.approx(cfg.rope.theta)
    tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert tokens == [tok.id_to_token(i) or f"[PAD{i}]" for i in range(cfg.vocab_size)]
    types = _field(reader, "tokenizer.ggml.token_type")
    assert types[:2] == [gguf.TokenType.CONTROL] * 2  # <s>, </s>
    assert set(types[2:]) <= {gguf.TokenType.NORMAL, gguf.TokenType.UNUSED}
    merges = json.loads((checkpoint / "tokenizer.json").read_text())["model"]["merges"]
    assert len(_field(reader, "tokenizer.ggml.merges")) == len(merges)
    config = json.loads((tmp_path / "gguf" / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["quant_method"] == "gguf" and qc["file"] == GGUF_FILE
    assert qc["tensors"]["Q4_0"] == 7 * cfg.num_layers


def _retokenize(checkpoint: Path, tmp: Path, edit) -> Path:
    ckpt = tmp / "ckpt"
    shutil.copytree(checkpoint, ckpt)
    spec = json.loads((ckpt / "tokenizer.json").read_text())
    edit(spec)
    (ckpt / "tokenizer.json").write_text(json.dumps(spec))
    return ckpt


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda s: s["model"].update(byte_fallback=True), "SentencePiece-style"),
        (lambda s: s.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer"),
        (lambda s: s.update(normalizer={"type": "Lowercase"}), "Lowercase normalizer"),
        (lambda s: s["model"].update(ignore_merges=True), "ignore_merges True"),
    ],
)
def test_refuses_tokenizers_llama_cpp_cannot_run(tmp_path, checkpoint, edit, match):
    ckpt = _retokenize(checkpoint, tmp_path, edit)
    ir = _ir(tmp_path, ckpt, {"bits": 4, "group_size": 32})
    with pytest.raises(InteropError, match=match) as err:
        write_interop("gguf", ir, ckpt, tmp_path / "gguf")
    assert str(ckpt / "tokenizer.json") in str(err.value)


def test_recipe_checks_name_what_llama_cpp_cannot_run(tmp_path):
    from fixtures import model_config

    def problems(**hf) -> list[str]:
        recipe = load_recipe(_recipe(tmp_path, tmp_path, interop=["gptq", "gguf"]))
        return interop_problems(recipe, model_config(**hf))

    assert problems() == []
    assert problems(sliding_window=512) == []  # wider than max_position_embeddings: never binds
    [window] = problems(sliding_window=24)
    assert window.startswith("interop.1: gguf") and "sliding_window = 24" in window
    [rope] = problems(rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert rope.startswith("interop.1: gguf") and "rope_type 'dynamic'" in rope
    # A mix of local and global layers: one line naming the fields, not the window's line.
    [mixed] = problems(
        model_type="qwen2", use_sliding_window=True, sliding_window=24, max_window_layers=1
    )
    assert mixed.startswith("interop.1: gguf") and "layer_types / max_window_layers" in mixed
    assert "layers [1] of 2 slide by 24" in mixed


# -- llama.cpp ----------------------------------------------------------------------------------


def _llama(path: Path, n_ctx: int = 256):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, logits_all=True, n_threads=1, verbose=False
    )


def _llama_logits(llm, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)  # [T, V]


def _llama_greedy(llm, prompt: list[int], n: int) -> list[int]:
    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval(out[-1:])
    return out


def _as_written(model) -> None:
    """The IR with what the GGUF rounds rounded the same way: fp16 scales, fp16 float weights
    (embedding, float linears), so it computes with the file's exact weights."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, QuantizedLinear | QuantizedEmbedding):
                m.scales.copy_(m.scales.half().float())
            elif isinstance(m, torch.nn.Linear | torch.nn.Embedding):
                m.weight.copy_(m.weight.half().float())


HEADS_PER_ROW = {"bits": 8, "group_size": -1, "targets": ["embed_tokens", "lm_head"], "ignore": []}

# Random-weight variants: what each one exercises in the writer.
VARIANTS = {
    "llama-gqa": ("llama", {}),  # q/k permutation with 4 query / 2 kv heads
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama-bias-head-dim": ("llama", {"attention_bias": True, "head_dim": 32}),
    "llama-rope-linear": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "llama-rope-llama3": (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
    ),
    "qwen2": ("qwen2", {}),  # NEOX RoPE in llama.cpp: no permutation; q/k/v biases
    # per-head q/k norms (attn_q_norm / attn_k_norm), head_dim apart from hidden / heads
    "qwen3": ("qwen3", {"head_dim": 32, "tie_word_embeddings": True}),
    "llama-q8_0": ("llama", {}, {"bits": 8}),
    "llama-q4_1": ("llama", {}, {"symmetric": False}),  # asymmetric int4
    # groups of 128: four blocks sharing a scale; a quantized lm_head is `output`
    "llama-g128-head": ("llama", {"hidden_size": 128}, {"group_size": 128, "ignore": []}),
    # a quantized embedding is Q8_0 token_embd: tied (per row, also the logits), untied (g32)
    "llama-tied-q8_0-embedding": ("llama", {"tie_word_embeddings": True}, {}, HEADS_PER_ROW),
    "llama-q8_0-embedding-g32": ("llama", {}, {}, {**HEADS_PER_ROW, "group_size": 32}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_llama_cpp_logits_match_the_ir(tmp_path, variant):
    """llama.cpp on the file computes the IR's logits (on the file's weights) over 48 tokens.

    Tolerance: llama.cpp rounds activations to 8 bits for its Q4_0 products (and keeps the KV
    cache in fp16), which moves these random models' logits by up to ~0.2 of their standard
    deviation and flips a near-tied argmax at a few positions. A writer error is far above
    that: without the q / k permutation, or with linear or llama3 RoPE scaling left out, the
    logits are off by ~5 standard deviations and the argmax agrees at 8-19% of positions."""
    arch, overrides, *spec = VARIANTS[variant]
    ckpt = make_checkpoint(tmp_path / "ckpt", arch, **overrides)
    ir = _ir(tmp_path, ckpt, {"bits": 4, "group_size": 32, **(spec[0] if spec else {})}, *spec[1:])
    model = load_ir(ir)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():  # the fixture's biases are zero: make them count
        for m in model.modules():
            if getattr(m, "bias", None) is not None:
                m.bias.copy_(torch.randn(m.bias.shape, generator=generator))
    save_ir(model, ir)
    write_interop("gguf", ir, ckpt, tmp_path / "gguf")
    model = load_ir(ir)
    _as_written(model)
    ids = torch.randint(2, 320, (48,), generator=generator).tolist()
    with torch.inference_mode():
        want = model(torch.tensor([ids]))[0][0].numpy()
    got = _llama_logits(_llama(tmp_path / "gguf" / GGUF_FILE), ids)
    err = float(np.abs(got - want).max() / want.std())
    agree = float((got.argmax(-1) == want.argmax(-1)).mean())
    assert err < 0.5 and agree >= 0.85, (variant, err, agree)


LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
TRICKY = (
    "I'm 12345 x3.14 -- we'VE\n\n\tdone  it!  \u00e9t\u00e9 \U0001f999 def f(a,b):\n    return a+b"
)


def _tokenizer(tmp: Path, split: str | None) -> Path:
    """The fixture's corpus trained as byte-level BPE with GPT-2's regex (split None) or a
    Llama 3 / Qwen2 Split before a regex-free ByteLevel, as their tokenizer.json files have."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    import fixtures

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
    tok = Tokenizer(models.BPE(ignore_merges=split == LLAMA3_SPLIT))
    tok.pre_tokenizer = (
        byte_level
        if split is None
        else pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level]
        )
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Numbers often enough to become tokens where the split lets digits merge (Llama 3: 1-3).
    tok.train_from_iterator([*fixtures._CORPUS, TRICKY, "12345 2024 " * 16], trainer)
    tok.save(str(tmp / "tokenizer.json"))
    return tmp / "tokenizer.json"


@pytest.mark.parametrize(
    ("split", "pre"), [(None, "gpt-2"), (LLAMA3_SPLIT, "llama-bpe"), (QWEN2_SPLIT, "qwen2")]
)
def test_llama_cpp_tokenizes_as_the_tokenizer_json(tmp_path, checkpoint, split, pre):
    from tokenizers import Tokenizer

    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint, ckpt)
    file = _tokenizer(ckpt, split)
    ir = _ir(tmp_path, ckpt, {"bits": 4, "group_size": 32})
    write_interop("gguf", ir, ckpt, tmp_path / "gguf")
    path = tmp_path / "gguf" / GGUF_FILE
    assert _field(gguf.GGUFReader(path), "tokenizer.ggml.pre") == pre
    want = Tokenizer.from_file(str(file)).encode(TRICKY, add_special_tokens=False).ids
    assert _llama(path).tokenize(TRICKY.encode(), add_bos=False) == want


def _demo_recipe(tmp: Path, text: Path) -> Path:
    recipe = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    recipe["source"]["path"] = str(DEMO / "pydoc-tiny")
    recipe["artifact"]["chat_template"] = str(DEMO / "chat_template.jinja")
    recipe["export"]["max_seq_len"] = 256
    recipe["evaluate"] = {"perplexity": {"dataset": str(text), "seq_len": 128}}
    recipe["interop"] = ["gguf"]
    path = tmp / "demo.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _recipe(tmp: Path, source: Path, **overrides) -> Path:
    from fixtures import write_recipe

    return write_recipe(tmp / "r.yaml", source, **overrides)


# Held out of nothing in particular: prose in the style of the Python docs the demo was trained on.
EVAL_TEXT = """\
The os module provides a portable way of using operating system dependent functionality. If
you just want to read or write a file see open(), if you want to manipulate paths, see the
os.path module, and if you want to read all the lines in all the files on the command line
see the fileinput module.

.. function:: getcwd()

   Return a string representing the current working directory.

.. function:: listdir(path='.')

   Return a list containing the names of the entries in the directory given by *path*. The
   list is in arbitrary order, and does not include the special entries ``'.'`` and ``'..'``
   even if they are present in the directory.

.. function:: makedirs(name, mode=0o777, exist_ok=False)

   Recursive directory creation function. Like mkdir(), but makes all intermediate-level
   directories needed to contain the leaf directory. If *exist_ok* is ``False`` (the
   default), a FileExistsError is raised if the target directory already exists.

The json module exposes an API familiar to users of the standard library marshal and pickle
modules. Encoding basic Python object hierarchies is done with dumps(), and decoding with
loads(). The functions accept the same keyword arguments as the JSONEncoder and JSONDecoder
classes.
"""


@pytest.mark.slow
def test_demo_model_llama_cpp_matches_ingot(tmp_path):
    """The trained demo model (RTN int4 g32: every decoder linear is Q4_0 blocks of ingot's own
    codes), built with `interop: [gguf]`: llama.cpp on the file and ingot's runtime on the
    artifact agree on greedy tokens and perplexity.

    Measured here: both 64-token greedy continuations identical, token for token; perplexity
    26.207 (ingot, eval/report.json) vs 26.222 (llama.cpp), 0.06% apart. llama.cpp's 8-bit
    activations move these logits by at most ~0.09, and ingot's own greedy path has steps whose
    top two logits are 0.003 apart, so a continuation may fork on another CPU: the tokens must
    agree up to the end or up to a step that is such a near tie (top-2 margin below
    NEAR_TIE); perplexity within 0.5%."""
    text = tmp_path / "eval.txt"
    text.write_text(EVAL_TEXT)
    recipe_path = _demo_recipe(tmp_path, text)
    artifact = build(recipe_path, tmp_path / "out", cache=StageCache(tmp_path / "cache")).artifact
    manifest = json.loads((artifact / "manifest.json").read_text())
    [entry] = manifest["interop"]
    assert entry["format"] == "gguf" and entry["quantization_config"]["quant_method"] == "gguf"
    llm = _llama(artifact / entry["path"] / GGUF_FILE)

    from ingot import LLM, SamplingParams

    prompts = ["The os module provides", ".. function:: iskeyword(s)\n\n   Return"]
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True, logprobs=2)
    outputs = LLM(artifact, kv_cache_memory=16 * 2**20).generate(prompts, params)
    for prompt, out in zip(prompts, outputs, strict=True):
        # llama.cpp's tokenizer (the GGUF metadata) gives ingot's prompt ids, BOS included.
        assert llm.tokenize(prompt.encode(), add_bos=True) == out.prompt_token_ids
        ours = out.outputs[0].token_ids
        theirs = _llama_greedy(llm, out.prompt_token_ids, len(ours))
        fork = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), None)
        if fork is not None:
            top = sorted(out.outputs[0].logprobs[fork].values(), reverse=True)
            assert top[0] - top[1] < NEAR_TIE, (prompt, fork, ours, theirs)

    ours = json.loads((artifact / "eval" / "report.json").read_text())["perplexity"]["quantized"]
    windows = eval_windows(load_recipe(recipe_path), recipe_path, DEMO / "pydoc-tiny").windows
    nll, scored = 0.0, 0
    for window in windows.tolist():  # the evaluate stage's windows, scored by llama.cpp
        logits = torch.from_numpy(_llama_logits(llm, window))
        targets = torch.tensor(window[1:])
        nll += float(torch.nn.functional.cross_entropy(logits[:-1], targets, reduction="sum"))
        scored += len(window) - 1
    theirs = math.exp(nll / scored)
    assert abs(theirs - ours) / ours < 0.005, (ours, theirs)
