"""Whether two tokenizer.json files map the same tokens to the same ids.

A draft model's proposals are token ids that the target verifies with its own logits, and the
runtime tokenizes and detokenizes with the target's tokenizer only: every id must mean the same
token to both models. What decides that is the model's vocabulary (token -> id) and the added
tokens (id and whether they are special); normalizers, pre-tokenizers and merges only decide
which ids a text becomes, which the target's tokenizer does alone. The added tokens include
those the tokenizer_config.json beside a tokenizer.json lists in `added_tokens_decoder`, as
transformers (and the runtime, runtime/tokenizer.py's `load_tokenizer`) adds them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["vocabulary_differences"]

_EXAMPLES = 3  # differing tokens named per kind of difference


def vocabulary_differences(target: Path, draft: Path) -> list[str]:
    """One line per kind of difference between the token -> id maps of two tokenizer.json
    files (the model's vocabulary, then the added tokens); [] when they agree."""
    a, b = _read(target), _read(draft)
    problems = []
    model = _map_differences(_model_vocab(a), _model_vocab(b))
    if model:
        problems.append(f"model vocabulary: {model}")
    added = _map_differences(_added_tokens(a, target), _added_tokens(b, draft))
    if added:
        problems.append(f"added tokens: {added}")
    return problems


def _read(file: Path) -> dict[str, Any]:
    data = json.loads(file.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a JSON object")
    return data


def _model_vocab(tokenizer: dict[str, Any]) -> dict[str, Any]:
    vocab = (tokenizer.get("model") or {}).get("vocab") or {}
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...], the id is the index
        return {entry[0]: i for i, entry in enumerate(vocab)}
    return dict(vocab)  # BPE, WordPiece, WordLevel: {token: id}


def _added_tokens(tokenizer: dict[str, Any], file: Path) -> dict[str, Any]:
    # The id and the special flag: a special token is skipped when text is decoded.
    added = {
        t["content"]: (t["id"], bool(t.get("special"))) for t in tokenizer.get("added_tokens") or []
    }
    config = file.with_name("tokenizer_config.json")
    if config.is_file():  # its entries win, as in transformers
        entries = json.loads(config.read_text(encoding="utf-8")).get("added_tokens_decoder") or {}
        for key, entry in entries.items():
            added[entry["content"]] = (int(key), bool(entry.get("special")))
    return {t: (i, "special" if special else "not special") for t, (i, special) in added.items()}


def _map_differences(target: dict[str, Any], draft: dict[str, Any]) -> str:
    """'2 tokens with other ids (...), 1 only in the target's (...)', or '' when equal."""
    changed = [t for t in target if t in draft and target[t] != draft[t]]
    only_target = [t for t in target if t not in draft]
    only_draft = [t for t in draft if t not in target]
    parts = []
    if changed:
        shown = ", ".join(
            f"{t!r}: {_show(target[t])} in the target's, {_show(draft[t])} in the draft's"
            for t in changed[:_EXAMPLES]
        )
        parts.append(f"{len(changed)} token(s) differ (e.g. {shown})")
    if only_target:
        parts.append(f"{len(only_target)} only in the target's (e.g. {_names(only_target)})")
    if only_draft:
        parts.append(f"{len(only_draft)} only in the draft's (e.g. {_names(only_draft)})")
    return ", ".join(parts)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return f"id {value[0]} {value[1]}"
    return f"id {value}"


def _names(tokens: list[str]) -> str:
    return ", ".join(repr(t) for t in tokens[:_EXAMPLES])
