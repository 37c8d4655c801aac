"""Manifest `speculative`: optional (old manifests load), a draft iff draft_model, a draft the
runtime can pair with the target (block size, vocabulary, engines, files), Medusa heads iff
medusa, sized for the target and listed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from ingot.artifacts import ArtifactError, SpeculativeInfo, read_manifest, write_manifest

from fixtures import write_files

LOCK = b'{"lock_version": 1}\n'
ENGINE = "engines/onnxruntime-cpu/model.onnx"
DRAFT_ENGINE = "draft/engines/onnxruntime-cpu/model.onnx"
HEADS = "draft/heads/model.onnx"
FILES = {
    "ingot.lock": LOCK,
    "tokenizer.json": b"{}",
    "model.onnx": b"graph",
    ENGINE: b"engine",
    DRAFT_ENGINE: b"draft engine",
    HEADS: b"heads",
}


def model(layers: int, vocab: int = 32) -> dict[str, Any]:
    return {
        "architecture": "llama",
        "vocab_size": vocab,
        "hidden_size": 8,
        "num_layers": layers,
        "num_heads": 2,
        "num_kv_heads": 1,
        "head_dim": 4,
        "max_seq_len": 16,
        "bos_token_id": None,
        "eos_token_ids": [0],
        "tie_word_embeddings": False,
    }


def graph(layers: int, path: str = "model.onnx", block: int = 4) -> dict[str, Any]:
    return {
        "path": path,
        "opset": 23,
        "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["S", "Q"]}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["N", 32]}],
        "num_layers": layers,
        "kv_block_size": block,
        "kv_dtype": "fp32",
        "num_kv_heads": 1,
        "head_dim": 4,
    }


def engine(path: str, name: str = "onnxruntime-cpu") -> dict[str, Any]:
    return {"name": name, "engine": "onnxruntime", "device": "cpu", "path": path}


def draft() -> dict[str, Any]:
    return {
        "model": model(1),
        "graph": graph(1, path=DRAFT_ENGINE),
        "engines": [engine(DRAFT_ENGINE)],
    }


def fields(speculative: dict[str, Any] | None = None) -> dict[str, Any]:
    base = {
        "name": "tiny",
        "version": "1.0.0",
        "recipe": {},
        "lock": {"sha256": hashlib.sha256(LOCK).hexdigest()},
        "model": model(2),
        "graph": graph(2),
        "engines": [engine(ENGINE)],
    }
    return base if speculative is None else {**base, "speculative": speculative}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return write_files(tmp_path / "artifact", FILES)


def test_draft_model_round_trips(root):
    speculative = {"method": "draft_model", "num_speculative_tokens": 3, "draft": draft()}
    written, _ = write_manifest(root, fields(speculative))
    read = read_manifest(root)
    assert read == written
    assert read.speculative.draft.engines[0].path == DRAFT_ENGINE
    assert (read.speculative.prompt_lookup_min, read.speculative.prompt_lookup_max) == (1, 4)
    assert read.referenced_paths()["speculative.draft.engines[onnxruntime-cpu].path"] == (
        DRAFT_ENGINE
    )


def test_a_manifest_without_speculative_still_loads(root):
    write_manifest(root, fields())
    data = json.loads((root / "manifest.json").read_text())
    del data["speculative"]  # as an ingot from before the field wrote it
    (root / "manifest.json").write_text(json.dumps(data))
    assert read_manifest(root).speculative is None


def test_ngram_needs_no_draft(root):
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 2}
    manifest, _ = write_manifest(root, fields(ngram))
    assert manifest.speculative == SpeculativeInfo(
        method="ngram", num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=2
    )


def _draft_with(**changes: Any) -> dict[str, Any]:
    d = draft()
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = d
        for p in parents:
            node = node[p]
        node[leaf] = value
    return {"method": "draft_model", "num_speculative_tokens": 3, "draft": d}


@pytest.mark.parametrize(
    ("speculative", "expected"),
    [
        pytest.param(
            {"method": "draft_model", "num_speculative_tokens": 3},
            "method draft_model lacks a draft",
            id="draft-model-without-draft",
        ),
        pytest.param(
            {"method": "ngram", "num_speculative_tokens": 3, "draft": draft()},
            "method ngram has a draft",
            id="ngram-with-draft",
        ),
        pytest.param(
            {"method": "ngram", "num_speculative_tokens": 0},
            "num_speculative_tokens",
            id="zero-tokens",
        ),
        pytest.param(
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5},
            "prompt_lookup_min (5) is above prompt_lookup_max (4)",
            id="lookup-range",
        ),
        pytest.param(
            {"method": "mtp", "num_speculative_tokens": 2},
            "speculative.method",
            id="unknown-method",
        ),
        pytest.param(
            {"method": "eagle", "num_speculative_tokens": 2},
            "method eagle lacks an eagle draft (present iff eagle)",
            id="eagle-without-draft",
        ),
        pytest.param(
            _draft_with(graph__kv_block_size=8),
            "speculative.draft.graph.kv_block_size (8) differs from graph.kv_block_size (4)",
            id="block-size",
        ),
        pytest.param(
            _draft_with(model__vocab_size=64),
            "speculative.draft.model.vocab_size (64) differs from model.vocab_size (32)",
            id="vocab-size",
        ),
        pytest.param(
            _draft_with(graph__num_layers=3),
            "speculative.draft.graph.num_layers (3) differs from speculative.draft.model",
            id="draft-graph-and-model",
        ),
        pytest.param(
            _draft_with(engines=[engine(DRAFT_ENGINE, name="onnxruntime-cuda")]),
            "speculative.draft.engines: onnxruntime-cuda not among the target's engines",
            id="unknown-engine",
        ),
        pytest.param(
            _draft_with(engines=[]),
            "speculative.draft.engines",
            id="no-engine",
        ),
    ],
)
def test_invalid_speculative_is_refused(root, speculative, expected):
    with pytest.raises(ArtifactError, match="invalid manifest") as err:
        write_manifest(root, fields(speculative))
    assert any(expected in p for p in err.value.problems), err.value.problems


def test_every_draft_path_must_be_listed(root):
    missing = "draft/engines/onnxruntime-cpu/other.onnx"
    speculative = _draft_with(engines=[engine(missing)], graph__path=missing)
    with pytest.raises(ArtifactError) as err:
        write_manifest(root, fields(speculative))
    assert f"{missing}: referenced by speculative.draft.graph.path but not listed in files" in (
        err.value.problems
    )


def _medusa(**heads: Any) -> dict[str, Any]:
    spec = {"num_heads": 3, "num_layers": 1, "hidden_size": 8, "vocab_size": 32}
    spec |= {"origin": "train", "path": HEADS, **heads}
    return {"method": "medusa", "num_speculative_tokens": 3, "heads": spec}


def test_medusa_heads_round_trip(root):
    write_manifest(root, fields(_medusa()))
    heads = read_manifest(root).speculative.heads
    assert (heads.method, heads.num_heads, heads.path, heads.training) == ("medusa", 3, HEADS, None)


@pytest.mark.parametrize(
    "speculative, expected",
    [
        (_medusa(vocab_size=64), "speculative.heads.vocab_size (64) differs from model.vocab_size"),
        (_medusa(hidden_size=16), "speculative.heads.hidden_size (16) differs"),
        (_medusa(num_heads=2), "num_speculative_tokens (3) exceeds heads.num_heads (2)"),
        (
            {**_medusa(), "method": "ngram"},
            "method ngram has heads (present iff medusa)",
        ),
        (_medusa(path="draft/heads/other.onnx"), "referenced by speculative.heads.path"),
    ],
)
def test_heads_the_target_cannot_use_are_refused(root, speculative, expected):
    with pytest.raises(ArtifactError) as err:
        write_manifest(root, fields(speculative))
    assert any(expected in p for p in err.value.problems), err.value.problems


EAGLE, EAGLE_FC = "draft/eagle/model.onnx", "draft/eagle/fc.onnx"


def _eagle_fields(root: Path, aux_output: bool = True, **eagle: Any) -> dict[str, Any]:
    """Manifest fields of an EAGLE-3 artifact (its graph files written into `root`)."""
    write_files(root, {EAGLE: b"draft layer", EAGLE_FC: b"fc"})
    spec = {
        "origin": "train",
        "path": EAGLE,
        "fc_path": EAGLE_FC,
        "hidden_size": 8,
        "target_hidden_size": 8,
        "num_heads": 2,
        "num_kv_heads": 1,
        "head_dim": 4,
        "intermediate_size": 16,
        "vocab_size": 32,
        "draft_vocab_size": 32,
        "aux_layers": [0, 1, 2],
        "kv_block_size": 4,
        **eagle,
    }
    base = fields({"method": "eagle", "num_speculative_tokens": 3, "eagle": spec})
    base |= {"model": model(3), "graph": graph(3)}  # three distinct layers to read
    if aux_output:
        aux = {"name": "aux_hidden", "dtype": "float32", "shape": ["S", "Q", 24]}
        base["graph"] = {**base["graph"], "outputs": [*base["graph"]["outputs"], aux]}
    return base


def test_eagle_draft_round_trips(root):
    write_manifest(root, _eagle_fields(root))
    manifest = read_manifest(root)
    eagle = manifest.speculative.eagle
    assert (eagle.method, eagle.aux_layers, eagle.fc_path) == ("eagle", [0, 1, 2], EAGLE_FC)
    refs = manifest.referenced_paths()
    assert (refs["speculative.eagle.path"], refs["speculative.eagle.fc_path"]) == (EAGLE, EAGLE_FC)


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"aux_output": False}, "speculative.eagle: graph.outputs has no aux_hidden"),
        (
            {"aux_layers": [0, 1, 9]},
            "speculative.eagle.aux_layers [0, 1, 9]: [9] not below model.num_layers (3)",
        ),
        ({"vocab_size": 64}, "speculative.eagle.vocab_size (64) differs from model.vocab_size"),
        ({"target_hidden_size": 16}, "speculative.eagle.target_hidden_size (16) differs"),
        ({"kv_block_size": 8}, "speculative.eagle.kv_block_size (8) differs from graph"),
        ({"draft_vocab_size": 40}, "draft_vocab_size (40) exceeds vocab_size (32)"),
        ({"fc_path": "draft/eagle/other.onnx"}, "referenced by speculative.eagle.fc_path"),
    ],
)
def test_eagle_drafts_the_target_cannot_use_are_refused(root, changes, expected):
    with pytest.raises(ArtifactError) as err:
        write_manifest(root, _eagle_fields(root, **changes))
    assert any(expected in p for p in err.value.problems), err.value.problems
