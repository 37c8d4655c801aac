"""A GGUF file's tokenizer (llama.cpp), from the checkpoint's tokenizer.json as transformers
loads it (with tokenizer_config.json's `added_tokens_decoder`: runtime/tokenizer.py).

llama.cpp's byte-level BPE is its "gpt2" tokenizer model; the pre-tokenizer is recognised
from its definition (GPT-2's regex, Llama 3's or Qwen2's split); other tokenizers
(SentencePiece-style byte-fallback BPE, Unigram, WordPiece) are refused naming the file.

The token list has exactly config.json's vocab_size entries, one per embedding row, typed as
llama.cpp's convert_hf_to_gguf types them: an id no token has (a vocabulary padded past the
tokenizer) is `[PAD{id}]` UNUSED; an added token is CONTROL when special or when it looks
special (`<|...|>`, the converter's rule for checkpoints that forget the flag), else
USER_DEFINED; the rest NORMAL. A token at an id past vocab_size has no embedding row and no
logit: it is left out with a warning, as the converter leaves out such SentencePiece and
tokenizer_config.json tokens ("ignore token N: id is out of range"); the preflight refuses the
checkpoints that need one (pipeline/vocabulary_fit.py). Every check here runs in the preflight
too (`gguf_vocabulary_problems`), so a tokenizer llama.cpp cannot run fails before any stage.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from ingot.runtime.tokenizer import load_tokenizer

from ..model.config import ModelConfig
from ..vocabulary_fit import special_token_strings
from .errors import InteropError

__all__ = ["GgufVocab", "gguf_vocabulary", "gguf_vocabulary_problems", "write_gguf_tokenizer"]

log = logging.getLogger(__name__)

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

# llama.cpp's token types (gguf.TokenType), here so the preflight needs no gguf package.
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


@dataclasses.dataclass(frozen=True)
class GgufVocab:
    tokens: list[str]  # [vocab_size]
    types: list[int]  # [vocab_size] llama.cpp token types
    pre: str  # tokenizer.ggml.pre
    dropped: dict[int, str]  # tokens past vocab_size, left out: {id: token}


def gguf_vocabulary_problems(source: Path, cfg: ModelConfig) -> list[str]:
    """The line `gguf_vocabulary` would fail with, or []: for the preflight."""
    try:
        gguf_vocabulary(source, cfg, warn=False)
    except InteropError as e:
        return [str(e)]
    return []


def gguf_vocabulary(source: Path, cfg: ModelConfig, *, warn: bool = True) -> GgufVocab:
    """The checkpoint's byte-level BPE vocabulary as llama.cpp's "gpt2" tokenizer model, one
    token per embedding row; `warn`: log the tokens left out (past vocab_size)."""
    file = source / "tokenizer.json"
    if not file.is_file():
        raise InteropError(f"interop gguf: {file} is missing; GGUF embeds the tokenizer")
    spec = json.loads(file.read_text(encoding="utf-8"))
    pre = _check_model(spec, file)
    tokenizer = load_tokenizer(file)
    by_id = {tid: token for token, tid in tokenizer.get_vocab(with_added_tokens=True).items()}
    added = tokenizer.get_added_tokens_decoder()
    tokens, types = [], []
    for tid in range(cfg.vocab_size):  # ids without a token: embedding rows never looked up
        token = by_id.get(tid)
        tokens.append(f"[PAD{tid}]" if token is None else token)
        types.append(_type(token, added.get(tid)))
    dropped = {tid: token for tid, token in sorted(by_id.items()) if tid >= cfg.vocab_size}
    if dropped and warn:
        log.warning(
            "interop gguf: %s: %d token(s) past config.json vocab_size %d left out (no "
            "embedding row): %s",
            file,
            len(dropped),
            cfg.vocab_size,
            ", ".join(f"{t!r} (id {i})" for i, t in list(dropped.items())[:5]),
        )
    return GgufVocab(tokens, types, pre, dropped)


def _type(token: str | None, added: Any) -> int:
    if token is None:
        return UNUSED
    if added is None:
        return NORMAL
    looks_special = token.startswith("<|") and token.endswith("|>")
    return CONTROL if added.special or looks_special else USER_DEFINED


def _check_model(spec: dict[str, Any], file: Path) -> str:
    """llama.cpp's pre-tokenizer name, after refusing what its "gpt2" model cannot run."""
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
    if not model.get("merges"):
        raise InteropError(f"interop gguf: {file} has no BPE merges")
    return pre


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


def write_gguf_tokenizer(writer, vocab: GgufVocab, source: Path, cfg: ModelConfig) -> None:
    """The tokenizer's keys: model, pre-tokenizer, tokens and types, then gguf's SpecialVocab
    (merges, bos / eos / unk / pad ids, add_bos from the post-processor, the chat template;
    ids past vocab_size it skips, as the converter's does)."""
    import gguf  # a build extra: loads only when a recipe asks for a GGUF file

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    # its warnings are about pair templates (two-sequence inputs), which a causal LM never
    # sees, and the special ids past vocab_size it skips (the preflight names those it needs)
    logger = logging.getLogger("gguf.vocab")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        special = gguf.SpecialVocab(source, load_merges=True, n_vocab=cfg.vocab_size)
    finally:
        logger.setLevel(level)
    # SpecialVocab finds tokenizer_config.json's bos / eos / unk / pad strings among
    # tokenizer.json's added tokens only; one only in its added_tokens_decoder is in `vocab`
    ids = {token: i for i, token in enumerate(vocab.tokens)}
    for kind, token in special_token_strings(source).items():
        if kind not in special.special_token_ids and token in ids:
            special._set_special_token(kind, ids[token])  # as convert_hf_to_gguf sets them
    special.add_to_gguf(writer, quiet=True)
