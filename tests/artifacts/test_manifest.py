"""write_manifest / read_manifest: deterministic bytes, strict schema, clear refusals."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from ingot.artifacts import (
    FORMAT,
    FORMAT_VERSION,
    ArtifactError,
    manifest_digest,
    read_manifest,
    sha256_bytes,
    sha256_file,
    write_manifest,
)

from fixtures import write_files

LOCK = b'{"lock_version": 1}\n'
FILES = {
    "ingot.lock": LOCK,
    "tokenizer.json": b"{}",
    "model.onnx": b"graph",
    "engines/onnxruntime-cpu/model.onnx": b"engine",
}


def fields() -> dict[str, Any]:
    """A minimal valid manifest (everything but `files`) for the FILES above."""
    return {
        "name": "tiny",
        "version": "1.0.0",
        "recipe": {"export": {"opset": 23}, "seed": 0, "ratio": 0.5},
        "lock": {"sha256": hashlib.sha256(LOCK).hexdigest()},
        "model": {
            "architecture": "LlamaForCausalLM",
            "vocab_size": 32,
            "hidden_size": 8,
            "num_layers": 1,
            "num_heads": 2,
            "num_kv_heads": 1,
            "head_dim": 4,
            "max_seq_len": 16,
            "bos_token_id": None,
            "eos_token_ids": [0],
            "tie_word_embeddings": False,
        },
        "graph": {
            "opset": 23,
            "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["S", "Q"]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["S", "Q", 8]}],
            "num_layers": 1,
            "kv_block_size": 4,
            "kv_dtype": "fp32",
            "num_kv_heads": 1,
            "head_dim": 4,
        },
        "engines": [
            {
                "name": "onnxruntime-cpu",
                "engine": "onnxruntime",
                "device": "cpu",
                "path": "engines/onnxruntime-cpu/model.onnx",
            }
        ],
    }


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return write_files(tmp_path / "artifact", FILES)


def test_write_lists_every_file_with_size_and_digest(root: Path) -> None:
    manifest, _ = write_manifest(root, fields())
    assert [(f.path, f.size, f.sha256) for f in manifest.files] == [
        (rel, len(FILES[rel]), hashlib.sha256(FILES[rel]).hexdigest()) for rel in sorted(FILES)
    ]
    assert manifest.format == FORMAT and manifest.format_version == FORMAT_VERSION


def test_read_returns_what_was_written(root: Path) -> None:
    manifest, _ = write_manifest(root, fields())
    assert read_manifest(root) == manifest


def test_write_is_deterministic(root: Path) -> None:
    _, first = write_manifest(root, fields())
    first_bytes = (root / "manifest.json").read_bytes()
    # Rewriting over an existing manifest, with keys inserted in another order, changes nothing.
    reordered = dict(reversed(list(fields().items())))
    _, second = write_manifest(root, reordered)
    assert second == first
    assert (root / "manifest.json").read_bytes() == first_bytes
    assert first == "sha256:" + hashlib.sha256(first_bytes).hexdigest() == manifest_digest(root)


def test_written_bytes_are_canonical_json(root: Path) -> None:
    write_manifest(root, fields())
    raw = (root / "manifest.json").read_bytes()
    assert raw == (json.dumps(json.loads(raw), indent=2, sort_keys=True) + "\n").encode()


def test_digest_follows_content(root: Path) -> None:
    _, before = write_manifest(root, fields())
    (root / "model.onnx").write_bytes(b"graph2")
    _, after = write_manifest(root, fields())
    assert after != before


def test_write_is_atomic_and_readable(root: Path) -> None:
    write_manifest(root, fields())
    left = sorted(p.name for p in root.iterdir())
    assert left == ["engines", "ingot.lock", "manifest.json", "model.onnx", "tokenizer.json"]
    assert stat.S_IMODE((root / "manifest.json").stat().st_mode) == 0o644


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"files": []}, "'files' is computed"),
        ({"signature": "x"}, "signature: Extra inputs are not permitted"),
        ({"name": 3}, "name: Input should be a valid string (got 3)"),
        ({"engines": []}, "engines: List should have at least 1 item"),
        ({"format_version": 2}, "format_version 2 is not supported (supported: 1)"),
        ({"eval": {"ppl": float("nan")}}, "cannot be serialized as JSON"),
    ],
)
def test_write_refuses_bad_fields(root: Path, change: dict[str, Any], expected: str) -> None:
    with pytest.raises(ArtifactError) as exc:
        write_manifest(root, {**fields(), **change})
    assert expected in str(exc.value)
    assert not (root / "manifest.json").exists()


def test_write_refuses_bad_nested_fields(root: Path) -> None:
    bad = fields()
    bad["graph"]["kv_dtype"] = "int4"
    bad["model"]["vocab_size"] = "32"  # strict: no silent str -> int coercion
    with pytest.raises(ArtifactError) as exc:
        write_manifest(root, bad)
    assert exc.value.problems == [
        "model.vocab_size: Input should be a valid integer (got '32')",
        "graph.kv_dtype: Input should be 'fp32', 'fp16', 'int8' or 'fp8' (got 'int4')",
    ]


def test_write_refuses_graph_that_disagrees_with_model(root: Path) -> None:
    bad = fields()
    bad["graph"]["num_layers"] = 2
    with pytest.raises(ArtifactError, match=r"graph\.num_layers \(2\) differs from model"):
        write_manifest(root, bad)


def test_layer_windows_of_a_mixed_model(root: Path) -> None:
    """Absent: sliding_window on every layer (old manifests load); present: one entry per
    layer, each null or sliding_window, and the graph reading the local layers' inputs."""
    mixed = fields()
    mixed["model"].update(num_layers=2, sliding_window=8, layer_windows=[None, 8])
    mixed["graph"]["num_layers"] = 2
    with pytest.raises(ArtifactError, match="no block_tables_local"):
        write_manifest(root, mixed)
    for name in ("block_tables_local", "kv_slots_local", "attention_mask_local"):
        mixed["graph"]["inputs"].append({"name": name, "dtype": "int64", "shape": ["S"]})
    model = write_manifest(root, mixed)[0].model
    assert [model.window_of(i) for i in range(2)] == [None, 8]
    for wrong in ([None], [None, 4]):
        mixed["model"]["layer_windows"] = wrong
        with pytest.raises(ArtifactError, match="model.layer_windows"):
            write_manifest(root, mixed)
    plain = fields()
    plain["model"]["sliding_window"] = 8
    write_manifest(root, plain)
    assert read_manifest(root).model.window_of(0) == 8  # old manifests: no layer_windows


def test_write_refuses_duplicate_engine_names(root: Path) -> None:
    bad = fields()
    bad["engines"] = bad["engines"] * 2
    with pytest.raises(ArtifactError, match="engine names must be unique"):
        write_manifest(root, bad)


def test_write_refuses_reference_to_missing_file(root: Path) -> None:
    (root / "model.onnx").unlink()
    with pytest.raises(ArtifactError) as exc:
        write_manifest(root, fields())
    assert exc.value.problems == ["model.onnx: referenced by graph.path but not listed in files"]
    assert not (root / "manifest.json").exists()


def test_write_refuses_stale_lock_digest(root: Path) -> None:
    (root / "ingot.lock").write_bytes(b"changed")
    with pytest.raises(ArtifactError, match="ingot.lock: lock sha256 mismatch"):
        write_manifest(root, fields())


def test_write_refuses_symlink_in_directory(root: Path) -> None:
    (root / "alias.onnx").symlink_to("model.onnx")
    with pytest.raises(ArtifactError, match="alias.onnx: is a symbolic link"):
        write_manifest(root, fields())


@pytest.fixture
def written(root: Path) -> Path:
    write_manifest(root, fields())
    return root


def _rewrite(root: Path, text: str | bytes) -> None:
    path = root / "manifest.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def _edited(root: Path, **changes: Any) -> str:
    data = json.loads((root / "manifest.json").read_text())
    data.update(changes)
    return json.dumps(data)


def test_read_refuses_missing_manifest(root: Path) -> None:
    with pytest.raises(ArtifactError, match=r"manifest\.json: missing"):
        read_manifest(root)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b'{"format": "ingot.artifact", "format": "x"}', "duplicate key 'format'"),
        (b"[1, 2]", "expected a JSON object, found list"),
        (b'{"format": "safetensors"}', "format is 'safetensors', expected 'ingot.artifact'"),
        (b'{"format_version": 1}', "format is None, expected 'ingot.artifact'"),
    ],
)
def test_read_refuses_malformed_manifest(written: Path, text: bytes, expected: str) -> None:
    _rewrite(written, text)
    with pytest.raises(ArtifactError) as exc:
        read_manifest(written)
    assert expected in str(exc.value)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (2, "format_version 2 is not supported (supported: 1); written by a newer ingot"),
        (0, "format_version 0 is not supported (supported: 1)"),
        ("1", "format_version '1' is not supported (supported: 1)"),
        (True, "format_version True is not supported (supported: 1)"),
    ],
)
def test_read_refuses_unknown_format_version(written: Path, version: Any, expected: str) -> None:
    _rewrite(written, _edited(written, format_version=version))
    with pytest.raises(ArtifactError) as exc:
        read_manifest(written)
    assert expected in str(exc.value)


def test_read_names_invalid_field(written: Path) -> None:
    data = json.loads((written / "manifest.json").read_text())
    data["files"][0]["sha256"] = "ABC"
    _rewrite(written, json.dumps(data))
    with pytest.raises(ArtifactError) as exc:
        read_manifest(written)
    [problem] = exc.value.problems
    assert problem.startswith("files.0.sha256: String should match pattern")


def test_read_refuses_symlinked_manifest(written: Path, tmp_path: Path) -> None:
    # Even a link to a perfectly valid manifest: links are never followed.
    real = tmp_path / "real-manifest.json"
    (written / "manifest.json").rename(real)
    (written / "manifest.json").symlink_to(real)
    with pytest.raises(ArtifactError, match=r"manifest\.json: is a symbolic link"):
        read_manifest(written)
    with pytest.raises(ArtifactError, match="symbolic link"):
        manifest_digest(written)


def test_read_refuses_manifest_that_is_a_directory(root: Path) -> None:
    (root / "manifest.json").mkdir()
    with pytest.raises(ArtifactError, match=r"manifest\.json: not a regular file"):
        read_manifest(root)


@pytest.mark.parametrize("size", [0, 1, (1 << 20) - 1, 1 << 20, (2 << 20) + 3])
def test_sha256_file_matches_hashlib_across_chunk_boundaries(tmp_path: Path, size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    (tmp_path / "blob").write_bytes(data)
    assert sha256_file(tmp_path / "blob") == hashlib.sha256(data).hexdigest()
    assert sha256_bytes(data) == hashlib.sha256(data).hexdigest()


# -- an int8 / fp8 KV cache's scales ----------------------------------------------------------

# float32 values (what the export writes): exact in JSON, exact again when read
KV_SCALES = {"k": [[0.0314759686589241]], "v": [[0.02907527424395084]]}


def _kv_quantized(kv_dtype: str = "int8", scales: Any = KV_SCALES) -> dict[str, Any]:
    manifest = fields()
    manifest["graph"]["kv_dtype"] = kv_dtype
    if scales is not None:
        manifest["graph"]["kv_scales"] = scales
    return manifest


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_kv_scales_round_trip(root: Path, kv_dtype: str) -> None:
    write_manifest(root, _kv_quantized(kv_dtype))
    graph = read_manifest(root).graph
    assert graph.kv_dtype == kv_dtype
    assert graph.kv_scales.k == KV_SCALES["k"] and graph.kv_scales.v == KV_SCALES["v"]
    written = json.loads((root / "manifest.json").read_text())["graph"]
    assert written["kv_scales"] == KV_SCALES


@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16"])
def test_float_kv_pools_have_no_scales_and_read_as_before(root: Path, kv_dtype: str) -> None:
    manifest = fields()
    manifest["graph"]["kv_dtype"] = kv_dtype
    write_manifest(root, manifest)
    assert read_manifest(root).graph.kv_scales is None
    # As builds before quantized KV caches wrote it: no kv_scales key at all.
    data = json.loads((root / "manifest.json").read_text())
    del data["graph"]["kv_scales"]
    _rewrite(root, json.dumps(data))
    assert read_manifest(root).graph.kv_dtype == kv_dtype


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (_kv_quantized("int8", None), "graph.kv_dtype int8 needs kv_scales"),
        (_kv_quantized("fp16"), "graph.kv_dtype fp16 has no use for kv_scales"),
        (
            _kv_quantized("fp8", {"k": [[0.5, 0.5]], "v": [[0.5]]}),
            "graph.kv_scales.k: shape (1, 2) is not [num_layers, num_kv_heads] = (1, 1)",
        ),
        (
            _kv_quantized("int8", {"k": [[0.5]], "v": [[0.5], [0.5]]}),
            "graph.kv_scales.v: shape (2, 1) is not",
        ),
        (_kv_quantized("int8", {"k": [[0.0]], "v": [[0.5]]}), "greater than 0"),
        (_kv_quantized("int8", {"k": [[float("nan")]], "v": [[0.5]]}), "finite number"),
    ],
)
def test_refuses_kv_scales_that_do_not_fit(root: Path, manifest: dict, expected: str) -> None:
    with pytest.raises(ArtifactError) as exc:
        write_manifest(root, manifest)
    assert expected in str(exc.value)
    assert not (root / "manifest.json").exists()
