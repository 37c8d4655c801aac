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
