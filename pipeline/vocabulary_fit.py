"""Whether the checkpoint's tokenizer fits its model: the quirks of real checkpoints, checked
before any stage runs.

The tokenizer is read as transformers reads it (runtime/tokenizer.py's `load_tokenizer`:
tokenizer.json plus tokenizer_config.json's `added_tokens_decoder`), as vLLM and llama.cpp's
converter do. What is handled, the way they handle it:

- a vocabulary padded past the tokenizer (config.json's vocab_size above the tokenizer's
  count, e.g. Qwen2's 151936 for 151665 tokens): ids without a token are embedding rows never
  looked up; GGUF writes them as `[PAD{id}]` UNUSED, the runtime decodes them to nothing;
- tokens at ids past vocab_size (added tokens the embedding was never resized for, e.g. Gemma
  3 1B's `<image_soft_token>`): the model can neither read nor write them. GGUF leaves them out
  (the converter's "ignore token N: id is out of range"); the runtime refuses a prompt holding
  one, naming it (vLLM's "Token id N is out of vocabulary"); nothing else sees them;
- special tokens only in tokenizer_config.json: added as transformers adds them; the
  artifact's tokenizer.json is written with them (pipeline/stages/package.py).

What cannot work is refused here, one line each naming the file, the token and what was
expected: a token past vocab_size that the model must read or write (config.json's or
generation_config.json's bos / eos ids, a token the post-processor adds to every prompt, one the
chat template writes), and an `added_tokens_decoder` entry the tokenizer gives another id.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from ingot.artifacts import ArtifactError
from ingot.runtime.tokenizer import (
    ChatTemplateError,
    TextTokenizer,
    add_config_tokens,
    load_tokenizer,
)

from .model.config import ModelConfig
from .source import read_config_file

__all__ = [
    "artifact_tokenizer_json",
    "bos_eos_tokens",
    "data_token_problems",
    "special_token_strings",
    "tokenizer_config_problems",
    "tokenizer_problems",
]

# The conversations the chat-template check renders, the first one a template takes: every
# role a template commonly writes, then without the system turn some templates refuse.
_TURNS = [
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a"},
    {"role": "user", "content": "u"},
]
_CONVERSATIONS = ([{"role": "system", "content": "s"}, *_TURNS], _TURNS)


def tokenizer_problems(
    source: Path, cfg: ModelConfig, chat_template: tuple[str, str] | None
) -> list[str]:
    """One line per way the checkpoint at `source` has a tokenizer its model cannot use;
    `chat_template`: (where it comes from, its text), the template the artifact ships. Run
    after `tokenizer_config_problems` found none (the tokenizer read here would be another)."""
    file = source / "tokenizer.json"
    tokenizer = load_tokenizer(file)
    beyond = {
        token_id: token
        for token, token_id in tokenizer.get_vocab(with_added_tokens=True).items()
        if token_id >= cfg.vocab_size
    }
    problems = _model_ids(source, cfg, tokenizer)
    if not beyond:
        return problems
    for token_id in tokenizer.encode("").ids:  # what the post-processor adds to every prompt
        if token_id in beyond:
            problems.append(
                f"{file}: its post_processor adds {beyond[token_id]!r} (id {token_id}) to every "
                f"prompt, beyond config.json vocab_size {cfg.vocab_size} (the model has no "
                f"embedding row for it); expected ids below {cfg.vocab_size}"
            )
    if chat_template is not None:
        problems += _template_problems(source, chat_template, beyond, cfg.vocab_size)
    return problems


def data_token_problems(where: str, top: int, cfg: ModelConfig, source: Path) -> list[str]:
    """[line] when `top`, the largest token id of `where`'s text (calibration, evaluation),
    is past vocab_size: its text writes a token the model has no embedding row for."""
    if top < cfg.vocab_size:
        return []
    token = load_tokenizer(source / "tokenizer.json").id_to_token(top)
    return [
        f"{where}: the text holds {token!r} (id {top} of {source / 'tokenizer.json'}), beyond "
        f"config.json vocab_size {cfg.vocab_size}: the model has no embedding row for it; "
        "remove it from the text"
    ]


def artifact_tokenizer_json(source: Path) -> str | None:
    """The tokenizer.json an artifact ships for the checkpoint at `source`: with the tokens
    tokenizer_config.json adds (the runtime reads tokenizer.json alone); None when it adds
    none, and the checkpoint's file is shipped as it is."""
    file = source / "tokenizer.json"
    merged = load_tokenizer(file).to_str()
    return None if merged == Tokenizer.from_file(str(file)).to_str() else merged


def tokenizer_config_problems(source: Path) -> list[str]:
    """tokenizer_config.json unreadable, or its added_tokens_decoder entries the tokenizer
    gives another id: one line each."""
    file = source / "tokenizer_config.json"
    if not file.is_file():
        return []
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return [f"{file}: cannot read it ({type(e).__name__}: {e})"]
    try:
        added = config.get("added_tokens_decoder") or {}
        tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
        problems = add_config_tokens(tokenizer, added)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return [f"{file}: cannot read added_tokens_decoder ({type(e).__name__}: {e})"]
    return [
        f"{file}: {p} (its next free id); expected the ids to agree, or the model's embedding "
        "rows would mean other tokens"
        for p in problems
    ]


def bos_eos_tokens(source: Path) -> tuple[str | None, str | None]:
    """(bos, eos) token strings from the checkpoint's tokenizer_config.json, which chat
    templates render."""
    named = special_token_strings(source)
    return named.get("bos"), named.get("eos")


def special_token_strings(source: Path) -> dict[str, str]:
    """{"bos" | "eos" | "unk" | "pad": token} as the checkpoint's tokenizer_config.json names
    them (a string, or an AddedToken's {"content": ...})."""
    file = source / "tokenizer_config.json"
    config = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    named = {}
    for kind in ("bos", "eos", "unk", "pad"):
        value = config.get(f"{kind}_token")
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            named[kind] = value
    return named


def _model_ids(source: Path, cfg: ModelConfig, tokenizer: Tokenizer) -> list[str]:
    """The bos / eos ids config.json and generation_config.json give the model, past its
    vocabulary: it could never read its BOS, nor end its output."""
    named = [("config.json", "bos_token_id", cfg.bos_token_id)]
    named += [("config.json", "eos_token_id", i) for i in cfg.eos_token_ids]
    generation = source / "generation_config.json"
    if generation.is_file():
        config = read_config_file(generation)
        for key in ("bos_token_id", "eos_token_id"):
            value = config.get(key)
            for i in value if isinstance(value, list) else [value]:
                named.append(("generation_config.json", key, i))
    problems = []
    for file, key, token_id in named:
        if isinstance(token_id, int) and token_id >= cfg.vocab_size:
            token = tokenizer.id_to_token(token_id)
            what = f"{token!r}, " if token is not None else ""
            use = "end its output" if key == "eos_token_id" else "read it"
            problems.append(
                f"{source / file}: {key} {token_id} ({what}beyond config.json vocab_size "
                f"{cfg.vocab_size}) has no embedding row or logit, so the model could never "
                f"{use}; expected an id below {cfg.vocab_size} (tokens added to the tokenizer "
                "without resizing the model's embeddings)"
            )
    return problems


def _template_problems(
    source: Path, chat_template: tuple[str, str], beyond: dict[int, str], vocab_size: int
) -> list[str]:
    """The chat template rendering a token past vocab_size: every chat prompt would hold it."""
    where, template = chat_template
    try:
        tokenizer = TextTokenizer(source / "tokenizer.json", template, *bos_eos_tokens(source))
    except ArtifactError:  # a template that does not compile: the runtime's concern
        return []
    for conversation in _CONVERSATIONS:
        try:
            text = tokenizer.apply_chat_template(conversation)
            break
        except ChatTemplateError:  # refused: try the next conversation
            continue
    else:
        return []
    written = sorted({i for i in tokenizer.encode(text, add_special_tokens=False) if i in beyond})
    return [
        f"{where}: the chat template writes {beyond[i]!r} (tokenizer.json id {i}), beyond "
        f"config.json vocab_size {vocab_size}: every chat prompt would hold a token the model "
        f"has no embedding row for; expected ids below {vocab_size}"
        for i in written
    ]
