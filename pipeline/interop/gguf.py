"""GGUF files (llama.cpp), written with the `gguf` package: the quantized IR's own codes and
scales in llama.cpp's blocks of 32, so ingot and llama.cpp run the same weights.

A quantized linear with contiguous groups whose size is a multiple of 32 (per-channel counts:
one group of K) becomes, per block of 32 input channels:

    Q4_0  int4 symmetric    fp16 d, 16 bytes of nibbles: w = (q - 8) * d, q = c + 8 in [0, 15]
    Q4_1  int4 asymmetric   fp16 d, fp16 m, 16 bytes:    w = q * d + m, q = c, m = -z * s
    Q8_0  int8 symmetric    fp16 d, 32 int8:             w = q * d, q = c

where c are ingot's codes (symmetric int4 in [-8, 7], int8 in [-128, 127], asymmetric in
[0, 2^b)), s its fp32 scale and z its zero point; a group of 64 or 128 is two or four blocks
with the same d. Nibble j of a block is element j (low) and j + 16 (high). The codes are
copied exactly; d = fp16(s) (and m = fp16(-z * s)) is the one rounding, so a block equals the
IR's weights computed with fp16-rounded scales (Q4_1: and offsets). A quantized embedding is
encoded as a linear's weight (int8 symmetric per row or in groups of 32: Q8_0 `token_embd`).
Anything else (other group sizes, asymmetric int8, act-order groups, float linears, a float
embedding) is F16; norms, biases and llama3's rope_freqs are F32. A tied lm_head (float, or
computing with a quantized embedding) is not written (llama.cpp reuses token_embd); a quantized
one of its own is `output`.

The model family says which llama.cpp architecture runs it (`ModelFamily.gguf`) and whether
the rows RoPE rotates (q_proj / k_proj: codes, scales, zero points, bias) are permuted as
llama.cpp's convert_hf_to_gguf does: ``llama`` rotates interleaved pairs where HF rotates
halves; ``qwen2`` runs NEOX RoPE and keeps HF's order. The tokenizer is written from the
checkpoint's tokenizer.json: byte-level BPE (llama.cpp's "gpt2" model) with the pre-tokenizer
recognised from its definition (GPT-2's regex, Llama 3's or Qwen2's split); other tokenizers
(SentencePiece-style byte-fallback BPE, Unigram, WordPiece) are refused naming the file.

The directory also holds config.json (the source's, with a `quantization_config` that names
the file and counts its tensor types) for the artifact's manifest.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..model.architecture import linear_shape, stays_float
from ..model.config import ModelConfig, RopeConfig
from ..model.family import EXPERT
from ..model.llama import LlamaModel
from ..model.qembedding import EMBEDDING, QuantizedEmbedding
from ..model.qlinear import QuantizedLinear
from ..model.rope import inv_frequencies
from .checks import gguf_model_problems
from .common import has_act_order
from .errors import InteropError
from .fused import layer_linears

__all__ = ["GGUF_FILE", "write_gguf", "permute_rows", "encode_blocks"]

GGUF_FILE = "model.gguf"
BLOCK = 32  # values per block of Q4_0 / Q4_1 / Q8_0

# Byte-level BPE pre-tokenizers llama.cpp implements: the regex of a Split before a ByteLevel
# (use_regex off) -> llama.cpp's `tokenizer.ggml.pre`. A lone ByteLevel with use_regex on is
# GPT-2's regex ("gpt-2").
_SPLIT_REGEXES = {
    # Llama 3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    # Qwen2
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
}


def write_gguf(model: LlamaModel, source: Path, out: Path) -> None:
    import gguf  # a build extra: loads only when a recipe asks for a GGUF file

    cfg = model.cfg
    problems = gguf_model_problems(cfg)
    if problems:
        raise InteropError(f"interop {problems[0]}")
    vocab = _vocab(source, cfg)  # a tokenizer llama.cpp cannot run fails before any weights
    family = cfg.family
    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == family.gguf.arch)
    tensors = list(_tensors(model, permute=family.gguf.permute_rotated))
    names = gguf.get_tensor_name_map(arch, cfg.num_layers)

    out.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(out / GGUF_FILE, gguf.MODEL_ARCH_NAMES[arch])
    _hyperparameters(writer, cfg)
    _tokenizer(writer, vocab, source, cfg)
    counts: Counter[str] = Counter()
    for ir, data, qtype in tensors:
        hf = family.tensor_names.to_hf(ir)
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise InteropError(f"interop gguf: no GGUF tensor name for {ir}")
        writer.add_tensor(name, data, raw_dtype=getattr(gguf.GGMLQuantizationType, qtype))
        counts[qtype] += 1
    for name, factors in _rope_factors(gguf, cfg):
        writer.add_tensor(name, factors, raw_dtype=gguf.GGMLQuantizationType.F32)
        counts["F32"] += 1
    writer.add_file_type(_file_type(gguf, tensors))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _write_config(source, out, dict(sorted(counts.items())))


# -- tensors ------------------------------------------------------------------------------------


def _tensors(model: LlamaModel, permute: bool):
    """(IR tensor name, array, GGML type name) of every tensor: the embedding, each layer's
    first norm, its linears and its other norms, the final norm, lm_head. `permute`: the rows
    RoPE rotates go to llama.cpp's interleaved order."""
    cfg = model.cfg
    layer = cfg.family.layer
    rotated = layer.rotated if permute else ()
    table = model.embed_tokens
    if isinstance(table, QuantizedEmbedding):  # its codes in blocks when they fit, as lm_head's
        yield from _linear(EMBEDDING, table.linear(), None)
    else:
        yield "embed_tokens.weight", _f16(table.weight), "F16"
    for i in range(cfg.num_layers):
        yield _norm(model, f"layers.{i}.{layer.norms[0]}")
        if i in cfg.moe_layers:  # the experts stacked, the router F32
            yield from _sparse_linears(model, i, rotated)
        else:
            for name, module in layer_linears(model, i):  # fused tensors stacked (Phi-3)
                local = name.split(".", 2)[2]
                heads = linear_shape(cfg, name)[1] // cfg.head_dim if local in rotated else None
                yield from _linear(name, module, heads)
        for norm in (*layer.norms[1:], *layer.head_norms):
            yield _norm(model, f"layers.{i}.{norm}")
    yield _norm(model, "norm")
    if not model.lm_head_tied:  # tied: llama.cpp computes the logits with token_embd
        yield from _linear("lm_head", model.lm_head, None)


def _sparse_linears(model: LlamaModel, i: int, rotated: tuple[str, ...]):
    """Sparse layer i's linears: the attention's as in a dense layer, the router F32 (as
    llama.cpp's converter writes it), each expert linear's copies stacked (`_stacked`)."""
    cfg = model.cfg
    for linear in cfg.family.sparse_layer.linears:  # the experts' as {e}
        name = f"layers.{i}.{linear.name}"
        if EXPERT in name:
            yield _stacked(model, name)
        elif stays_float(linear):
            yield f"{name}.weight", _f32(model.get_submodule(name).weight), "F32"
        else:
            heads = linear_shape(cfg, name)[1] // cfg.head_dim if linear.name in rotated else None
            yield from _linear(name, model.get_submodule(name), heads)


def _stacked(model: LlamaModel, template: str) -> tuple[str, np.ndarray, str]:
    """Every expert's copy of the linear `template` (`layers.0.mlp.experts.{e}.up_proj`) as
    one tensor [E, N, ...], llama.cpp's `ffn_*_exps` (named `layers.0.mlp.experts.up_proj`):
    their blocks when one block type holds every expert's codes, else F16."""
    cfg = model.cfg
    experts = [
        model.get_submodule(template.replace(EXPERT, str(e))) for e in range(cfg.num_experts)
    ]
    encoded = [encode_blocks(m) if isinstance(m, QuantizedLinear) else None for m in experts]
    name = template.replace(f".{EXPERT}", "") + ".weight"
    kinds = {None if e is None else e[1] for e in encoded}
    if len(kinds) == 1 and None not in kinds:
        return name, np.stack([data for data, _ in encoded]), kinds.pop()
    weights = [m.dequantize() if isinstance(m, QuantizedLinear) else m.weight for m in experts]
    return name, _f16(torch.stack(weights)), "F16"


def _norm(model: LlamaModel, name: str) -> tuple[str, np.ndarray, str]:
    return f"{name}.weight", _f32(model.get_submodule(name).weight), "F32"


def _linear(name: str, module: torch.nn.Module, heads: int | None):
    """A linear's weight (blocks when they hold its codes, else F16) and bias (F32); `heads`:
    permute its rows for llama.cpp's RoPE."""
    rows = (lambda t: t) if heads is None else (lambda t: permute_rows(t, heads))
    if isinstance(module, QuantizedLinear):
        encoded = encode_blocks(module, rows)
        weight = encoded if encoded is not None else (_f16(rows(module.dequantize())), "F16")
    else:
        weight = _f16(rows(module.weight)), "F16"
    yield f"{name}.weight", *weight
    if module.bias is not None:
        yield f"{name}.bias", _f32(rows(module.bias)), "F32"


def permute_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of each head reordered from HF's halves (rotate_half) to llama.cpp's interleaved
    pairs: convert_hf_to_gguf's LlamaModel.permute. Any tensor whose first dimension is the
    output channels (weight, codes, scales, zero points, bias) moves with its rows."""
    n = t.shape[0]
    return t.reshape(heads, 2, n // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def encode_blocks(q: QuantizedLinear, rows=lambda t: t) -> tuple[np.ndarray, str] | None:
    """(uint8 [N, K / 32 * block bytes], "Q4_0" | "Q4_1" | "Q8_0") holding `q`'s codes and
    scales exactly (scales as fp16), or None when no block type holds them."""
    kind = {(4, True): "Q4_0", (4, False): "Q4_1", (8, True): "Q8_0"}.get((q.bits, q.symmetric))
    if kind is None or q.group_size % BLOCK or has_act_order(q):
        return None
    codes = rows(q.codes).to(torch.int16).numpy()  # [N, K]
    per = q.group_size // BLOCK  # blocks per group, sharing its scale
    scales = np.repeat(rows(q.scales).numpy(), per, axis=1)  # [N, B] fp32
    n, k = codes.shape
    blocks = codes.reshape(n, k // BLOCK, BLOCK)
    d = _half(scales, q)
    if kind == "Q8_0":
        values = blocks.astype(np.int8).view(np.uint8)  # [N, B, 32]
        return np.concatenate([d, values], axis=-1).reshape(n, -1), kind
    if kind == "Q4_0":
        nibbles = blocks + 8  # signed [-8, 7] -> Q4_0's [0, 15], w = (q - 8) * d
        parts = [d]
    else:
        zeros = np.repeat(rows(q.zero_points).to(torch.float32).numpy(), per, axis=1)
        nibbles = blocks  # unsigned [0, 15] with w = (c - z) * s = c * d + m, m = -z * s
        parts = [d, _half(-zeros * scales, q)]
    if nibbles.min() < 0 or nibbles.max() > 15:
        raise InteropError(f"interop gguf: int4 codes out of range in a {q.extra_repr()} linear")
    nibbles = nibbles.astype(np.uint8)
    packed = nibbles[..., : BLOCK // 2] | (nibbles[..., BLOCK // 2 :] << 4)  # [N, B, 16]
    return np.concatenate([*parts, packed], axis=-1).reshape(n, -1), kind


def _half(values: np.ndarray, q: QuantizedLinear) -> np.ndarray:
    """fp32 [N, B] -> the bytes [N, B, 2] of their fp16 values (round to nearest even)."""
    half = values.astype(np.float16)
    if not np.isfinite(half).all():
        raise InteropError(
            f"interop gguf: a {q.extra_repr()} linear has scales beyond fp16's range (65504)"
        )
    return half.view(np.uint8).reshape(*values.shape, 2)


def _f16(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float16).contiguous().numpy()


def _f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).contiguous().numpy()


def _file_type(gguf, tensors) -> int:
    """general.file_type: the block type holding most linear weights (F16 when none)."""
    sizes: Counter[str] = Counter()
    for name, data, qtype in tensors:
        if name.endswith("_proj.weight") or name == "lm_head.weight":
            sizes[qtype] += data.size
    kind = max(sizes, key=sizes.__getitem__) if sizes else "F16"
    return getattr(gguf.LlamaFileType, "MOSTLY_" + kind)


def _rope_factors(gguf, cfg: ModelConfig) -> list[tuple[str, np.ndarray]]:
    """(GGUF tensor name, F32 factors) of the RoPE scaling's tables: llama3's rope_freqs,
    LongRoPE's rope_factors_long / _short (what each wavelength is multiplied by, as
    convert_hf_to_gguf writes them; llama.cpp picks one by its context size)."""
    if cfg.rope.type == "llama3":
        name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight"
        return [(name, _llama3_rope_factors(cfg))]
    if cfg.rope.type == "longrope":
        tables = (
            (gguf.MODEL_TENSOR.ROPE_FACTORS_LONG, cfg.rope.long_factor),
            (gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT, cfg.rope.short_factor),
        )
        return [
            (gguf.TENSOR_NAMES[t] + ".weight", np.asarray(f, dtype=np.float32)) for t, f in tables
        ]
    return []


def _llama3_rope_factors(cfg: ModelConfig) -> np.ndarray:
    """llama.cpp's rope_freqs [D/2]: what each default frequency is divided by (ingot's llama3
    frequencies against unscaled ones, the factors convert_hf_to_gguf computes)."""
    plain = dataclasses.replace(cfg, rope=RopeConfig(theta=cfg.rope.theta))
    return (inv_frequencies(plain) / inv_frequencies(cfg)).to(torch.float32).numpy()


# -- metadata -----------------------------------------------------------------------------------


def _hyperparameters(writer, cfg: ModelConfig) -> None:
    import gguf  # a build extra: loads only when a recipe asks for a GGUF file

    writer.add_quantized_by("ingot")
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.rotated_dim)  # partial rotary: fewer than head_dim
    writer.add_rope_freq_base(cfg.rope.theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if cfg.rope.type == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(cfg.rope.factor)
    if cfg.moe_layers:  # llama.cpp's softmax gating over every expert, top-k renormalised
        writer.add_expert_count(cfg.num_experts)
        writer.add_expert_used_count(cfg.top_k)
        writer.add_expert_feed_forward_length(cfg.expert_intermediate_size)
    if cfg.rope.type == "longrope":  # convert_hf_to_gguf's Phi-3 keys
        writer.add_rope_scaling_attn_factors(cfg.rope.attention_factor)
        writer.add_rope_scaling_orig_ctx_len(cfg.rope.original_max_position_embeddings)


@dataclasses.dataclass(frozen=True)
class _Vocab:
    tokens: list[str]
    types: list[int]
    pre: str


def _vocab(source: Path, cfg: ModelConfig) -> _Vocab:
    """The checkpoint's byte-level BPE vocabulary as llama.cpp's "gpt2" tokenizer model."""
    import gguf  # a build extra: loads only when a recipe asks for a GGUF file

    file = source / "tokenizer.json"
    if not file.is_file():
        raise InteropError(f"interop gguf: {file} is missing; GGUF embeds the tokenizer")
    spec = json.loads(file.read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    kind = model.get("type")
    if kind != "BPE" or model.get("byte_fallback"):
        what = "a SentencePiece-style (byte_fallback) BPE" if kind == "BPE" else f"a {kind}"
        raise InteropError(
            f"interop gguf: {file} is {what} tokenizer; ingot writes GGUF vocabularies for "
            "byte-level BPE tokenizers (GPT-2 / Llama 3 / Qwen2 style) only"
        )
    pre = _pre_tokenizer(spec.get("pre_tokenizer"), file)
    if bool(model.get("ignore_merges")) != (pre == "llama-bpe"):  # llama.cpp ties it to `pre`
        raise InteropError(
            f"interop gguf: {file}: ignore_merges {bool(model.get('ignore_merges'))} with a "
            f"{pre} pre-tokenizer; llama.cpp ignores merges with Llama 3's (only)"
        )
    if (spec.get("normalizer") or {}).get("type", "NFC") != "NFC":
        raise InteropError(
            f"interop gguf: {file} has a {spec['normalizer']['type']} normalizer, which "
            "llama.cpp's byte-level BPE does not apply"
        )
    vocab: dict[str, int] = dict(model["vocab"])
    added = {t["id"]: t for t in spec.get("added_tokens", [])}
    for tid, t in added.items():
        vocab.setdefault(t["content"], tid)
    if max(vocab.values()) >= cfg.vocab_size:
        raise InteropError(
            f"interop gguf: {file} has token id {max(vocab.values())}, beyond config.json "
            f"vocab_size {cfg.vocab_size}"
        )
    by_id = {tid: token for token, tid in vocab.items()}
    tokens, types = [], []
    for tid in range(cfg.vocab_size):  # ids without a token: embedding rows never looked up
        token = by_id.get(tid)
        if token is None:
            tokens.append(f"[PAD{tid}]")
            types.append(gguf.TokenType.UNUSED)
        elif tid in added:
            tokens.append(token)
            special = added[tid].get("special")
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(token)
            types.append(gguf.TokenType.NORMAL)
    return _Vocab(tokens, [int(t) for t in types], pre)


def _pre_tokenizer(pre: dict[str, Any] | None, file: Path) -> str:
    """llama.cpp's name for the pre-tokenizer, recognised from its definition."""
    steps = (
        (pre or {}).get("pretokenizers", [pre]) if (pre or {}).get("type") == "Sequence" else [pre]
    )
    if len(steps) == 1 and _is_byte_level(steps[0], use_regex=True):
        return "gpt-2"
    if (
        len(steps) == 2
        and (steps[0] or {}).get("type") == "Split"
        and steps[0].get("behavior") == "Isolated"
        and not steps[0].get("invert")
        and _is_byte_level(steps[1], use_regex=False)
    ):
        regex = (steps[0].get("pattern") or {}).get("Regex")
        if regex in _SPLIT_REGEXES:
            return _SPLIT_REGEXES[regex]
    raise InteropError(
        f"interop gguf: {file}: pre_tokenizer {json.dumps(pre)[:200]} is not one llama.cpp "
        "implements (known: ByteLevel with GPT-2's regex, Llama 3's or Qwen2's Split + ByteLevel)"
    )


def _is_byte_level(step: dict[str, Any] | None, use_regex: bool) -> bool:
    return (
        (step or {}).get("type") == "ByteLevel"
        and not step.get("add_prefix_space", False)
        and bool(step.get("use_regex", True)) == use_regex
    )


def _tokenizer(writer, vocab: _Vocab, source: Path, cfg: ModelConfig) -> None:
    import gguf  # a build extra: loads only when a recipe asks for a GGUF file

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    # merges, bos / eos / unk / pad ids, add_bos (from the post-processor) and the chat template;
    # its warnings are about pair templates (two-sequence inputs), which a causal LM never sees
    logger = logging.getLogger("gguf.vocab")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        special = gguf.SpecialVocab(source, load_merges=True, n_vocab=cfg.vocab_size)
    finally:
        logger.setLevel(level)
    if not special.merges:
        raise InteropError(f"interop gguf: {source / 'tokenizer.json'} has no BPE merges")
    special.add_to_gguf(writer, quiet=True)


def _write_config(source: Path, out: Path, counts: dict[str, int]) -> None:
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gguf", "file": GGUF_FILE, "tensors": counts}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
