"""The decode benchmarks' models: the trained pydoc-16m and a random-weight Llama-3.2-1B shape.

pydoc-16m is read from a models directory (`--models-dir`, by default the shared one beside
the repository) and its prompts from the held-out text (`--eval-text`). The 1B shape (vocab
32000) is built locally (no hub access) into the benchmark cache (outside the repository, see
paths.bench_cache_dir) and reused; its prompts are random token ids. Its tokenizer merely
covers all ids (the benchmark feeds token ids), but an ingot build wants a tokenizer.json, and
the GGUF it writes for llama.cpp a byte-level BPE one: 256 byte tokens, then merges of byte
pairs up to the vocabulary's size.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.paths import bench_cache_dir

__all__ = [
    "BenchModel",
    "LLAMA_1B_SHAPE",
    "MODELS",
    "PROMPT_LEN",
    "build_random_llama",
    "prepare_model",
    "write_bytelevel_tokenizer",
    "write_wordlevel_tokenizer",
]

PROMPT_LEN = 32
_PYDOC_PROMPT = (
    "The os module provides a portable way of using operating system dependent "
    "functionality. If you just want to read or write a file see open(), if you want to "
    "manipulate paths, see the os.path module."
)

# Llama 3.2 1B (hidden 2048, 16 layers, GQA 32 / 8 heads of 64, ffn 8192, tied embeddings,
# llama3 RoPE) with a 32000-token vocabulary, the setting of the decode comparison (the lm_head
# is ~6% of the weights, ~21% at Llama 3's 128256). BOS / EOS at the top, as in Llama 3: the
# word-level tokenizer gives every id below BOS a word.
LLAMA_1B_SHAPE = dict(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    hidden_act="silu",
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    initializer_range=0.02,
    bos_token_id=31998,
    eos_token_id=31999,
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)
_1B_DTYPE = "bfloat16"


@dataclass(frozen=True, slots=True)
class BenchModel:
    """A checkpoint and its prompts: `prompt_ids` for batch 1, `prompt_pool` (a long token
    stream, or None for random ids) for the batched cases."""

    name: str
    path: Path
    prompt_ids: tuple[int, ...]
    bos_token_id: int
    vocab_limit: int  # random prompt ids are drawn below this (no special token)
    prompt_pool: tuple[int, ...] | None = None

    def prompts(self, count: int, length: int) -> list[list[int]]:
        """`count` distinct prompts of `length` tokens, each starting with BOS: consecutive
        windows of the held-out text, or random ids (seeded) where there is none."""
        body = length - 1
        if self.prompt_pool is not None:
            if count * body > len(self.prompt_pool):
                raise ValueError(
                    f"{self.name}: the prompt text has {len(self.prompt_pool)} tokens, "
                    f"{count} prompts of {length} need {count * body}"
                )
            pool = self.prompt_pool
            return [[self.bos_token_id, *pool[i * body : (i + 1) * body]] for i in range(count)]
        rng = np.random.default_rng(length)
        ids = rng.integers(0, self.vocab_limit, (count, body))
        return [[self.bos_token_id, *(int(t) for t in row)] for row in ids]


MODELS = ("pydoc-16m", "llama-1b-shape")


def prepare_model(name: str, models_dir: Path, eval_text: Path) -> BenchModel:
    """The model directory (building the 1B shape if it is not cached) and its prompts;
    pydoc-16m is `models_dir`/pydoc-16m, its batched prompts come from `eval_text`."""
    if name == "pydoc-16m":
        return _pydoc(models_dir / name, eval_text)
    if name == "llama-1b-shape":
        path = bench_cache_dir() / f"llama-1b-shape-{_config_digest(LLAMA_1B_SHAPE, _1B_DTYPE)}"
        if not (path / ".complete").exists():
            build_random_llama(path, LLAMA_1B_SHAPE, _1B_DTYPE, write_bytelevel_tokenizer)
        bos = LLAMA_1B_SHAPE["bos_token_id"]
        prompt = BenchModel(name, path, (), bos, bos).prompts(1, PROMPT_LEN)[0]
        return BenchModel(name, path, tuple(prompt), bos, bos)
    raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})")


def _pydoc(path: Path, eval_text: Path) -> BenchModel:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    ids = tokenizer.encode(_PYDOC_PROMPT).ids  # starts with BOS (the post-processor adds it)
    if len(ids) < PROMPT_LEN:
        raise ValueError(f"the pydoc prompt has only {len(ids)} tokens, need {PROMPT_LEN}")
    config = json.loads((path / "config.json").read_text())
    bos = config["bos_token_id"]
    pool = tokenizer.encode(eval_text.read_text(), add_special_tokens=False).ids
    return BenchModel(
        "pydoc-16m", path, tuple(ids[:PROMPT_LEN]), bos, config["vocab_size"], tuple(pool)
    )


def _config_digest(config: dict[str, Any], dtype: str) -> str:
    """A short name for a shape: a changed shape is a new checkpoint, never a stale one."""
    text = json.dumps({"config": config, "dtype": dtype}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def build_random_llama(
    path: Path,
    config: dict[str, Any],
    dtype: str,
    write_tokenizer: Callable[[Path, dict], None] | None = None,
) -> None:
    """A random-weight (seed 0) Llama checkpoint of `config` in `dtype` at `path`, with a
    tokenizer (`write_tokenizer`, by default word-level), marked `.complete`. Built beside
    `path` and moved in place, so an interrupted build never looks finished."""
    import torch
    import transformers

    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    # std-0.02 normal init (initializer_range): the weights' values do not matter for timing.
    model = model.to(getattr(torch, dtype)).eval()
    model.save_pretrained(tmp, safe_serialization=True)
    del model
    (write_tokenizer or write_wordlevel_tokenizer)(tmp, config)
    (tmp / ".complete").write_text("")
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def write_wordlevel_tokenizer(path: Path, config: dict) -> None:
    """tokenizer.json with one word per id below BOS (t0, t1, ...), then special tokens from
    BOS up to the vocabulary's end (EOS among them)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    bos, eos, vocab_size = config["bos_token_id"], config["eos_token_id"], config["vocab_size"]
    specials = {bos: "<|begin_of_text|>", eos: "<|end_of_text|>"}
    vocab = {f"t{i}": i for i in range(bos)}
    for i in range(bos, vocab_size):
        vocab[specials.get(i, f"<|reserved_special_token_{i - bos}|>")] = i
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer.add_special_tokens([AddedToken(specials[bos]), AddedToken(specials[eos])])
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": specials[bos], "eos_token": specials[eos]}, indent=2) + "\n"
    )


def write_bytelevel_tokenizer(path: Path, config: dict) -> None:
    """tokenizer.json of a GPT-2-style byte-level BPE covering every id: the 256 byte tokens,
    then tokens of two bytes, then of three (each from a merge, in order) up to BOS, then
    special tokens from BOS to the vocabulary's end, as write_wordlevel_tokenizer. What
    llama.cpp's "gpt2" tokenizer (and so ingot's GGUF writer) accepts; the text it makes means
    nothing."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    bos, eos, vocab_size = config["bos_token_id"], config["eos_token_id"], config["vocab_size"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges = []
    # two-byte tokens, then three-byte ones (a two-byte token and a byte) where the
    # vocabulary is larger than 256 + 256^2 (Llama 3's 128000 ids below BOS)
    pairs = itertools.chain(
        ((a, b) for a in alphabet for b in alphabet),
        ((a + b, c) for a in alphabet for b in alphabet for c in alphabet),
    )
    while len(vocab) < bos:
        a, b = next(pairs)
        merges.append((a, b))
        vocab[a + b] = len(vocab)
    specials = {bos: "<|begin_of_text|>", eos: "<|end_of_text|>"}
    for i in range(bos, vocab_size):
        vocab[specials.get(i, f"<|reserved_special_token_{i - bos}|>")] = i
    tokenizer = Tokenizer(models.BPE(vocab, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(specials[i], special=True) for i in sorted(specials)])
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": specials[bos], "eos_token": specials[eos]}, indent=2) + "\n"
    )
