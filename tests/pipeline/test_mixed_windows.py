"""A model mixing local and global layers (Qwen2, max_window_layers 1: layer 0 global, layer 1
local) through the IR's layer-by-layer paths: calibration's `LayerForward` and the heads'
`final_hidden` give each layer its own window, as the whole model does (whose logits
test_model_parity.py checks against transformers)."""

from __future__ import annotations

import pytest
import torch

from ingot.pipeline.engines.onnxruntime.check import check_export
from ingot.pipeline.export import ExportError, export_onnx
from ingot.pipeline.heads.train import final_hidden
from ingot.pipeline.model.kv_quant import KVScales
from ingot.pipeline.model.load import CheckpointReader, load_model
from ingot.pipeline.quantize.layerwise import LayerForward

from fixtures import make_checkpoint

_T = 40  # tokens per sample: past the window of 12


def _mixed(tmp_path):
    ckpt = make_checkpoint(
        tmp_path, "qwen2", use_sliding_window=True, sliding_window=12, max_window_layers=1
    )
    ids = torch.randint(0, 320, (2, _T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hidden = load_model(ckpt)(ids)[1]  # [2, T, H]
    return CheckpointReader(ckpt), ids, hidden


@torch.no_grad()
def test_calibration_forward_gives_each_layer_its_window(tmp_path):
    reader, ids, hidden = _mixed(tmp_path)
    assert reader.cfg.layer_windows == (None, 12)
    forward = LayerForward.for_config(reader.cfg, samples=2, seq_len=_T)
    x = reader.embedding()[ids]  # [2, T, H]
    for i in range(reader.cfg.num_layers):
        layer = reader.layer(i)
        assert layer.window == reader.cfg.layer_windows[i]
        x = forward(layer, x)
    torch.testing.assert_close(reader.final_norm()(x), hidden, atol=1e-5, rtol=0)


def test_heads_training_targets_give_each_layer_its_window(tmp_path):
    reader, ids, hidden = _mixed(tmp_path)
    torch.testing.assert_close(final_hidden(reader, ids), hidden, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kv", ["fp32", "fp16"])
def test_the_graph_gives_local_layers_inputs_of_their_own(tmp_path, kv):
    """Exported, the local layer reads block_tables_local / kv_slots_local /
    attention_mask_local and a pool of its own block count; the graph's logits match the IR's
    with the window biting (check_export: prompts of 48 tokens, window 6)."""
    ckpt = make_checkpoint(
        tmp_path / "ckpt", "qwen2", use_sliding_window=True, sliding_window=6, max_window_layers=1
    )
    model = load_model(ckpt)
    info = export_onnx(model, tmp_path / "out", max_seq_len=64, kv_dtype=kv, kv_block_size=4)
    shapes = {i["name"]: i["shape"] for i in info["inputs"]}
    assert shapes["block_tables_local"] == ["S", "MBL"]
    assert shapes["attention_mask_local"] == ["S", 1, "Q", "KVL"]
    assert shapes["kv_slots_local"] == ["S", "Q", 2]
    assert shapes["k_pool_0"][0] == "NB" and shapes["k_pool_1"][0] == "NBL"
    assert check_export(model, tmp_path / "out" / "model.onnx")["greedy_match"]


def test_fp8_kv_is_refused_for_a_mixed_model(tmp_path):
    ckpt = make_checkpoint(
        tmp_path / "ckpt", "qwen2", use_sliding_window=True, sliding_window=6, max_window_layers=1
    )
    model = load_model(ckpt)
    scales = KVScales("fp8", torch.ones(2, 2), torch.ones(2, 2))
    with pytest.raises(ExportError, match="fp8 .* mixing local and global layers"):
        export_onnx(model, tmp_path / "out", max_seq_len=64, kv_dtype="fp8", kv_scales=scales)


def test_engine_perplexity_gives_the_local_layers_their_window(tmp_path):
    """The evaluate stage's engine perplexity (the runtime's pool, batch and session) on a
    mixed model, windows of 40 tokens past the window of 12: the IR's perplexity."""
    from dataclasses import replace

    from ingot.artifacts import EngineInfo, GraphInfo
    from ingot.pipeline.engines.onnxruntime import build_onnxruntime_engine
    from ingot.pipeline.evaluate.engine import engine_perplexity
    from ingot.pipeline.evaluate.perplexity import perplexity
    from ingot.runtime.loader import EngineFiles

    ckpt = make_checkpoint(
        tmp_path / "ck", "qwen2", use_sliding_window=True, sliding_window=12, max_window_layers=1
    )
    model = load_model(ckpt)
    graph = export_onnx(model, tmp_path / "x", max_seq_len=64, kv_block_size=8)
    record = build_onnxruntime_engine(
        tmp_path / "x" / "model.onnx",
        tmp_path / "e",
        optimization_level="extended",
        matmul_accuracy_level=0,
    )
    engine = EngineFiles(
        GraphInfo.model_validate(graph),
        EngineInfo.model_validate(record),
        tmp_path / "e" / "model.onnx",
        sliding_window=12,
    )
    windows = torch.randint(2, 320, (3, 40), generator=torch.Generator().manual_seed(0))
    expected = perplexity(model, windows)
    assert engine_perplexity(engine, windows.numpy()) == pytest.approx(expected, rel=1e-5)
    # Without the window the local layers see the whole window: another number.
    whole = engine_perplexity(replace(engine, sliding_window=64), windows.numpy())
    assert whole != pytest.approx(expected, rel=1e-3)
