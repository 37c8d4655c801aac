"""vocabulary_differences: the token -> id maps of two tokenizer.json files, model vocabulary
and added tokens, named with examples."""

from __future__ import annotations

import json
from pathlib import Path

from ingot.pipeline.vocabulary import vocabulary_differences


def tokenizer(path: Path, vocab, added=()) -> Path:
    added_tokens = [{"id": i, "content": c, "special": s} for c, i, s in added]
    path.write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": added_tokens}))
    return path


def test_equal_vocabularies_have_no_difference(tmp_path):
    vocab = {"a": 0, "b": 1, "ab": 2}
    a = tokenizer(tmp_path / "a.json", vocab, [("<s>", 3, True)])
    b = tokenizer(tmp_path / "b.json", dict(reversed(vocab.items())), [("<s>", 3, True)])
    assert vocabulary_differences(a, b) == []


def test_ids_and_missing_tokens_are_named(tmp_path):
    a = tokenizer(tmp_path / "a.json", {"a": 0, "b": 1, "c": 2})
    b = tokenizer(tmp_path / "b.json", {"a": 0, "b": 2, "d": 1})
    [line] = vocabulary_differences(a, b)
    assert line == (
        "model vocabulary: 1 token(s) differ (e.g. 'b': id 1 in the target's, id 2 in the "
        "draft's), 1 only in the target's (e.g. 'c'), 1 only in the draft's (e.g. 'd')"
    )


def test_added_tokens_compare_id_and_special(tmp_path):
    a = tokenizer(tmp_path / "a.json", {"a": 0}, [("<s>", 1, True), ("<pad>", 2, True)])
    b = tokenizer(tmp_path / "b.json", {"a": 0}, [("<s>", 1, False)])
    [line] = vocabulary_differences(a, b)
    assert line.startswith("added tokens: 1 token(s) differ (e.g. '<s>': id 1 special in the")
    assert "id 1 not special in the draft's" in line and "1 only in the target's" in line


def test_unigram_ids_are_positions(tmp_path):
    a = tokenizer(tmp_path / "a.json", [["a", -1.0], ["b", -2.0]])
    b = tokenizer(tmp_path / "b.json", [["b", -2.0], ["a", -1.0]])
    assert "2 token(s) differ" in vocabulary_differences(a, b)[0]


def test_tokens_only_in_tokenizer_config_json_count(tmp_path):
    """The tokenizer_config.json beside a tokenizer.json adds its added_tokens_decoder entries
    (as transformers loads them): a draft lacking one the target's config adds differs."""
    (tmp_path / "t").mkdir()
    (tmp_path / "d").mkdir()
    a = tokenizer(tmp_path / "t" / "tokenizer.json", {"a": 0}, [("<s>", 1, True)])
    b = tokenizer(tmp_path / "d" / "tokenizer.json", {"a": 0}, [("<s>", 1, True)])
    added = {"2": {"content": "<|im_end|>", "special": True}}
    (tmp_path / "t" / "tokenizer_config.json").write_text(
        json.dumps({"added_tokens_decoder": added})
    )
    [line] = vocabulary_differences(a, b)
    assert line == "added tokens: 1 only in the target's (e.g. '<|im_end|>')"
    (tmp_path / "d" / "tokenizer_config.json").write_text(
        json.dumps({"added_tokens_decoder": added})
    )
    assert vocabulary_differences(a, b) == []
