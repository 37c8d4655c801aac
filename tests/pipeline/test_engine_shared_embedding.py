"""A tied int8 table once in the ONNX Runtime engine: the lookup reads lm_head's MatMulNBits
weights (engines/onnxruntime/shared_embedding.py), the engine computes what it computed with
the table twice (the same logits, bit for bit), it still matches the IR, every other tensor
keeps its name and bytes, and untied or float embeddings are left as ORT wrote them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from test_engine_onnxruntime import BLOCK, _feed, _run

from ingot.pipeline.engines.onnxruntime import (
    build_onnxruntime_engine,
    load_onnxruntime_engine,
    shared_embedding,
)
from ingot.pipeline.engines.onnxruntime.session import OrtGraph
from ingot.pipeline.export import export_onnx
from ingot.pipeline.export.check import check_graph
from ingot.pipeline.model.layer_source import ModelLayers
from ingot.pipeline.model.load import load_model
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import BASE, make_checkpoint

LAYERS = {"method": "rtn", "bits": 4, "group_size": 32, "targets": ["re:layers\\..*"]}
HEADS = {"method": "rtn", "bits": 8, "targets": ["embed_tokens", "lm_head"], "ignore": []}
V, H = BASE["vocab_size"], BASE["hidden_size"]
TIED = {"per-row": (-1, True), "g32-asymmetric": (32, False)}  # lean's default; zero points


def _export(tmp: Path, tied: bool, heads: dict | None):
    model = load_model(make_checkpoint(tmp / "ckpt", "llama", tie_word_embeddings=tied))
    quantize_model(model, [quantize_entry(e) for e in (LAYERS, heads) if e is not None])
    export_onnx(model, tmp / "onnx", max_seq_len=64, kv_block_size=BLOCK)
    return model, tmp / "onnx" / "model.onnx"


def _engine(graph: Path, out: Path, level: str = "extended") -> Path:
    build_onnxruntime_engine(graph, out, optimization_level=level)
    return out / "model.onnx"


def _tensors(model_file: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(model_file))  # with its external data
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _external_lengths(model_file: Path) -> dict[str, int]:
    graph = onnx.load(str(model_file), load_external_data=False).graph
    return {
        t.name: int(next(e.value for e in t.external_data if e.key == "length"))
        for t in graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
    }


@pytest.mark.parametrize("level", ["extended", "basic"])  # basic: ORT fuses no MatMulNBits
@pytest.mark.parametrize("case", sorted(TIED))
def test_a_tied_table_is_held_once_and_computes_the_same(tmp_path, monkeypatch, case, level):
    group_size, symmetric = TIED[case]
    heads = {**HEADS, "group_size": group_size, "symmetric": symmetric}
    model, graph = _export(tmp_path, True, heads)
    shared = _engine(graph, tmp_path / "shared", level)
    monkeypatch.setattr(shared_embedding, "share_tied_embedding", lambda path: False)
    twice = _engine(graph, tmp_path / "twice", level)  # as ORT wrote it

    # The table's codes once: one initializer of V*H bytes (lm_head's), no lookup aliases.
    table = "embed_tokens.codes_t_T" if level == "extended" else "embed_tokens.codes_t"
    lengths = _external_lengths(shared)
    assert [n for n, size in lengths.items() if size == V * H] == [table]
    assert not any(n.endswith(".gather") for n in lengths)
    before = _external_lengths(twice)
    assert sorted(n for n, size in before.items() if size == V * H) == sorted(
        [table, "embed_tokens.codes_t.gather"]
    )
    data = shared.with_suffix(".onnx.data").stat().st_size
    assert data < twice.with_suffix(".onnx.data").stat().st_size - V * H
    assert data <= sum(lengths.values()) + 4096 * len(lengths)  # nothing else left in it

    # Every other tensor: its name and bytes as ORT wrote them; only the aliases' weights gone.
    kept, was = _tensors(shared), _tensors(twice)
    for name in set(kept) & set(was):
        assert np.array_equal(kept[name], was[name]), name
    assert set(before) - set(lengths) == {n for n in before if n.endswith(".gather")}

    # The same logits as the engine with the table twice, bit for bit; and the IR's.
    feed = _feed()
    assert np.array_equal(_run(shared, feed), _run(twice, feed))
    session = load_onnxruntime_engine(shared, {"graph_optimization_level": "disable_all"})
    report = check_graph(ModelLayers(model), OrtGraph(session))
    assert report["greedy_match"] and report["max_rel_logit_diff"] <= report["rtol"]


@pytest.mark.parametrize("tied, heads", [(False, HEADS), (True, None)], ids=["untied", "float"])
def test_untied_or_float_embeddings_are_left_as_ort_wrote_them(tmp_path, tied, heads):
    _, graph = _export(tmp_path, tied, heads and {**HEADS, "group_size": -1})
    engine = _engine(graph, tmp_path / "engine")
    before = engine.read_bytes(), engine.with_suffix(".onnx.data").read_bytes()
    assert shared_embedding.share_tied_embedding(engine) is False
    assert (engine.read_bytes(), engine.with_suffix(".onnx.data").read_bytes()) == before
    names = set(_external_lengths(engine))
    table = "embed_tokens.codes_t" if heads else "embed_tokens.weight"
    assert table in names and "embed_tokens.codes_t_T" not in names
