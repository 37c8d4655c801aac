"""The stage cache: no work on a rebuild, only downstream work on a change, nothing lost on a
failure, byte-identical artifacts from empty caches."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingot.artifacts import read_manifest
from ingot.pipeline import build as build_module
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.recipe import RecipeError
from ingot.pipeline.stages import export as export_stage

from fixtures import write_recipe


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_rebuild_does_no_stage_work(tmp_path, tiny_checkpoint):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint)
    cache = StageCache(tmp_path / "cache")
    first = build(recipe, tmp_path / "a", cache=cache)
    again = build(recipe, tmp_path / "a", cache=cache)
    assert not any(s.cached for s in first.stages)
    assert [s.cached for s in again.stages if s.stage != "package"] == [True, True, True]
    assert again.digest == first.digest


def test_an_entry_edited_in_place_is_not_served(tmp_path, tiny_checkpoint):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint)
    cache = StageCache(tmp_path / "cache")
    first = build(recipe, tmp_path / "a", cache=cache)
    export = next(s for s in first.stages if s.stage == "export")
    data = cache.path("export", export.key) / "model.onnx.data"
    with open(data, "r+b") as f:  # one byte flipped, size and name unchanged
        byte = f.read(1)
        f.seek(0)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.warns(UserWarning, match="changed since it was written"):
        again = build(recipe, tmp_path / "b", cache=cache)
    cached = {s.stage: s.cached for s in again.stages}
    assert cached["quantize"] and not cached["export"]
    assert again.digest == first.digest  # rebuilt as it was
    assert read_manifest(again.artifact) == read_manifest(first.artifact)


def test_changing_export_reruns_only_export_and_engine(tmp_path, tiny_checkpoint):
    cache = StageCache(tmp_path / "cache")
    build(write_recipe(tmp_path / "r.yaml", tiny_checkpoint), tmp_path / "a", cache=cache)
    changed = write_recipe(tmp_path / "r2.yaml", tiny_checkpoint, export={"max_seq_len": 96})
    result = build(changed, tmp_path / "b", cache=cache)
    cached = {s.stage: s.cached for s in result.stages}
    assert cached == {
        "quantize": True,
        "export": False,
        "engine:onnxruntime-cpu": False,
        "package": False,
    }


def test_two_empty_caches_give_byte_identical_artifacts(tmp_path, tiny_checkpoint):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint)
    a = build(recipe, tmp_path / "a", cache=StageCache(tmp_path / "c1"))
    b = build(recipe, tmp_path / "b", cache=StageCache(tmp_path / "c2"))
    assert a.digest == b.digest
    assert _files(a.artifact) == _files(b.artifact)


def test_bad_recipe_fails_before_work_and_keeps_the_artifact(tmp_path, tiny_checkpoint):
    cache = StageCache(tmp_path / "cache")
    good = build(write_recipe(tmp_path / "r.yaml", tiny_checkpoint), tmp_path / "a", cache=cache)
    before = _files(good.artifact)
    bad = write_recipe(tmp_path / "bad.yaml", tiny_checkpoint, kv_cache={"block_size": 24})
    with pytest.raises(RecipeError, match="kv_cache.block_size"):
        build(bad, tmp_path / "a", cache=cache)
    assert _files(good.artifact) == before


def test_failing_stage_keeps_cache_and_artifact(tmp_path, tiny_checkpoint, monkeypatch):
    cache = StageCache(tmp_path / "cache")
    good = build(write_recipe(tmp_path / "r.yaml", tiny_checkpoint), tmp_path / "a", cache=cache)
    before = _files(good.artifact)
    entries_before = sorted(p.name for p in (cache.root / "stages").glob("*/*"))

    def broken_export(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(export_stage, "run_export", broken_export)
    changed = write_recipe(tmp_path / "r2.yaml", tiny_checkpoint, export={"max_seq_len": 96})
    with pytest.raises(RuntimeError, match="disk full"):
        build(changed, tmp_path / "a", cache=cache)
    assert _files(good.artifact) == before
    # No half-written entry: the failed stage left neither an entry nor a temp directory.
    assert sorted(p.name for p in (cache.root / "stages").glob("*/*")) == entries_before
    assert not list((cache.root / "stages").glob("*/.tmp-*"))


def test_failing_engine_check_keeps_cache_and_artifact(tmp_path, tiny_checkpoint, monkeypatch):
    # The engine stage checks the engine against the IR; an IR that disagrees fails the build
    # before the engine is cached, and the previous artifact stays.
    import torch

    from ingot.pipeline.export import ExportError
    from ingot.pipeline.quantize.ir_layers import IRLayers
    from ingot.pipeline.stages import engine as engine_stage

    cache = StageCache(tmp_path / "cache")
    good = build(write_recipe(tmp_path / "r.yaml", tiny_checkpoint), tmp_path / "a", cache=cache)
    before = _files(good.artifact)
    engines_before = sorted(p.name for p in (cache.root / "stages" / "engine").iterdir())

    class Disagreeing(IRLayers):
        def layer(self, i):
            layer = super().layer(i)
            if i == 1:
                with torch.no_grad():
                    layer.attn_norm.weight.mul_(3.0)
            return layer

    monkeypatch.setattr(engine_stage, "IRLayers", Disagreeing)
    target = {"engine": "onnxruntime", "intra_op_num_threads": 1}  # a new engine key only
    changed = write_recipe(tmp_path / "r2.yaml", tiny_checkpoint, targets=[target])
    with pytest.raises(ExportError, match="disagrees with the IR"):
        build(changed, tmp_path / "a", cache=cache)
    assert _files(good.artifact) == before
    assert sorted(p.name for p in (cache.root / "stages" / "engine").iterdir()) == engines_before
    assert not list((cache.root / "stages").glob("*/.tmp-*"))


def test_matmul_accuracy_level_reaches_the_engine(tmp_path, tiny_checkpoint):
    import onnx

    target = {"engine": "onnxruntime", "matmul_accuracy_level": 4}
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint, targets=[target])
    result = build(recipe, tmp_path / "a", cache=StageCache(tmp_path / "cache"))
    manifest = read_manifest(result.artifact)
    assert manifest.engines[0].build["matmul_accuracy_level"] == 4
    graph = onnx.load(str(result.artifact / manifest.engines[0].path), load_external_data=False)
    levels = {
        attr.i
        for node in graph.graph.node
        if node.op_type == "MatMulNBits"
        for attr in node.attribute
        if attr.name == "accuracy_level"
    }
    assert levels == {4}


def test_a_change_to_the_build_code_invalidates_the_cache(tmp_path, tiny_checkpoint, monkeypatch):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint)
    cache = StageCache(tmp_path / "cache")
    build(recipe, tmp_path / "a", cache=cache)
    # An editable install keeps its version number across edits; the source digest does not.
    monkeypatch.setattr(build_module, "_source_digest_of_build_code", lambda: "edited")
    again = build(recipe, tmp_path / "a", cache=cache)
    assert not any(s.cached for s in again.stages)
