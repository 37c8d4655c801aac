"""Calibration data: readers (txt, jsonl, parquet, chat messages), deterministic packing and
selection, digests, and clear errors for unreadable or too-small data."""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest

from ingot.calibration.dataset import (
    CalibrationError,
    CalibrationSet,
    load_calibration,
    pack_documents,
    select_windows,
)

from fixtures import CHAT_TEMPLATE, write_tokenizer

WORDS = ["def", "return", "import", "class", "the", "quick", "brown", "fox", "lazy", "dog"]


def _documents(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 80))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    write_tokenizer(root, 320)
    return root / "tokenizer.json"


def _calibrate(tokenizer, dataset, **overrides):
    section = {"dataset": str(dataset), "split": "train", "text_field": "text", "samples": 8}
    section.update({"seq_len": 32, "seed": 0, **overrides})
    return load_calibration(section, tokenizer, eos_token_id=1, chat_template=CHAT_TEMPLATE)


def test_selection_is_deterministic_and_seeded(tmp_path, tokenizer):
    data = tmp_path / "calib.txt"
    data.write_text("\n".join(_documents(30)))
    first, again = _calibrate(tokenizer, data), _calibrate(tokenizer, data)
    other = _calibrate(tokenizer, data, seed=1)
    assert first.tokens.shape == (8, 32) and first.tokens.dtype == np.int64
    assert first.indices == again.indices and np.array_equal(first.tokens, again.tokens)
    assert first.indices != other.indices
    assert first.indices == sorted(set(first.indices))  # distinct windows, sorted
    assert first.dataset_digest == "sha256:" + hashlib.sha256(data.read_bytes()).hexdigest()
    # A .txt file is one document: BOS (the tokenizer's post-processor) ... EOS, then windows.
    assert first.windows >= 8 and first.files == {"calib.txt": first.dataset_digest[7:]}


def test_windows_are_cut_from_the_packed_stream():
    stream = np.arange(100, dtype=np.int64)
    indices, tokens = select_windows(stream, samples=3, seq_len=10, seed=7)
    for index, window in zip(indices, tokens, strict=True):
        assert window.tolist() == list(range(index * 10, index * 10 + 10))


def test_packing_appends_eos_between_documents():
    encode = {"a": [0, 5, 6], "b": [0, 7, 1]}.get  # "b" already ends with EOS (1)
    assert pack_documents(["a", "b"], encode, eos_token_id=1).tolist() == [0, 5, 6, 1, 0, 7, 1]


def test_jsonl_and_parquet_read_the_same_documents(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = _documents(40, seed=3)
    jsonl = tmp_path / "calib.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"content": d, "id": i}) + "\n" for i, d in enumerate(docs))
    )
    parquet = tmp_path / "calib.parquet"
    pq.write_table(pa.table({"content": docs}), parquet)
    from_jsonl = _calibrate(tokenizer, jsonl, text_field="content")
    from_parquet = _calibrate(tokenizer, parquet, text_field="content")
    assert np.array_equal(from_jsonl.tokens, from_parquet.tokens)
    assert from_jsonl.indices == from_parquet.indices
    assert from_jsonl.dataset_digest != from_parquet.dataset_digest  # different bytes


def test_chat_messages_are_rendered_with_the_chat_template(tmp_path, tokenizer):
    data = tmp_path / "chat.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": d}, {"role": "assistant", "content": d[:40]}]}
        for d in _documents(30, seed=5)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    calibration = _calibrate(tokenizer, data, text_field="messages")
    from tokenizers import Tokenizer

    text = Tokenizer.from_file(str(tokenizer)).decode(
        calibration.tokens.ravel().tolist(), skip_special_tokens=False
    )
    assert "<|user|>" in text or "<|assistant|>" in text


def test_too_small_data_names_the_file(tmp_path, tokenizer):
    data = tmp_path / "tiny.txt"
    data.write_text("def add(a, b): return a + b")
    with pytest.raises(CalibrationError, match=r"tiny\.txt.*samples x seq_len = 8 x 32 = 256"):
        _calibrate(tokenizer, data)


@pytest.mark.parametrize(
    ("name", "content", "field", "message"),
    [
        ("missing.txt", None, "text", r"missing\.txt: no such file"),
        ("bad.parquet", b"not parquet at all", "text", r"bad\.parquet: cannot read"),
        ("rows.jsonl", b'{"body": "x"}\n', "text", r"rows\.jsonl has no field 'text'.*body"),
        ("calib.csv", b"a,b\n", "text", r"unknown file type '\.csv'"),
    ],
)
def test_unreadable_data_fails_clearly(tmp_path, tokenizer, name, content, field, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CalibrationError, match=message):
        _calibrate(tokenizer, path, text_field=field)


def test_calibration_set_round_trips(tmp_path):
    original = CalibrationSet(
        np.arange(12, dtype=np.int64).reshape(3, 4), [0, 2, 5], "sha256:ab", 9
    )
    original.save(tmp_path)
    loaded = CalibrationSet.load(tmp_path)
    assert np.array_equal(loaded.tokens, original.tokens)
    assert (loaded.indices, loaded.dataset_digest, loaded.windows) == ([0, 2, 5], "sha256:ab", 9)
