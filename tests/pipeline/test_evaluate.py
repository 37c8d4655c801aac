"""Perplexity: fixed windows, the same number transformers computes, the engine's through the
runtime, text loading, the report and the gate."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from ingot.artifacts import EngineInfo, GraphInfo
from ingot.pipeline.engines.onnxruntime import build_onnxruntime_engine
from ingot.pipeline.evaluate import (
    EvalGateError,
    check_perplexity_gate,
    load_eval_text,
    perplexity,
    token_windows,
)
from ingot.pipeline.evaluate.engine import engine_perplexity
from ingot.pipeline.evaluate.markdown import render_markdown
from ingot.pipeline.evaluate.perplexity import tokenize
from ingot.pipeline.evaluate.report import perplexity_report
from ingot.pipeline.export import export_onnx
from ingot.pipeline.model.load import load_model
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.recipe.quantize import quantize_entry
from ingot.runtime.loader import EngineFiles

from fixtures import make_checkpoint

DEMO = Path(__file__).parents[2] / "recipes" / "demo"
INT4 = {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": True, "ignore": ["lm_head"]}


def test_windows_are_consecutive_and_non_overlapping():
    windows = token_windows(list(range(10)), seq_len=3)
    assert windows.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]  # the partial tail is dropped
    assert token_windows(list(range(10)), seq_len=3, max_windows=2).shape == (2, 3)
    with pytest.raises(ValueError, match="fewer than one window"):
        token_windows([1, 2], seq_len=3)


def test_perplexity_matches_transformers_loss(tmp_path):
    """Our number is exp(mean next-token loss), as transformers computes it per window."""
    from transformers import AutoModelForCausalLM

    ckpt = make_checkpoint(tmp_path / "ck", "llama")
    windows = torch.randint(2, 320, (5, 24), generator=torch.Generator().manual_seed(0))
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        losses = [float(hf(w[None], labels=w[None]).loss) for w in windows]
    expected = math.exp(sum(losses) / len(losses))  # every window scores the same count
    ours = perplexity(load_model(ckpt), windows, batch_size=2)
    assert ours == pytest.approx(expected, rel=1e-5)


def test_demo_model_is_good_on_its_training_text():
    """Sanity: the demo model was trained on pydoc-heldin, so it predicts it well (a uniform
    guess over its 4096 tokens would score 4096)."""
    ckpt = DEMO / "pydoc-tiny"
    text = load_eval_text(str(DEMO / "pydoc-heldin.txt"))
    windows = token_windows(tokenize(text.text, ckpt / "tokenizer.json"), 128, max_windows=4)
    assert 1.0 < perplexity(load_model(ckpt), windows) < 20.0


def test_text_files_and_jsonl_fields(tmp_path):
    (tmp_path / "a.txt").write_text("hello world")
    (tmp_path / "b.jsonl").write_text(
        json.dumps({"text": "one"}) + "\n\n" + json.dumps({"text": "two", "id": 2}) + "\n"
    )
    (tmp_path / "c.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    assert load_eval_text("a.txt", base_dir=tmp_path).text == "hello world"
    jsonl = load_eval_text("b.jsonl", base_dir=tmp_path)
    assert jsonl.text == "one\n\ntwo"
    assert jsonl.sha256 == load_eval_text(str(tmp_path / "b.jsonl")).sha256
    with pytest.raises(ValueError, match="text_field.*'text'"):
        load_eval_text("c.jsonl", base_dir=tmp_path)
    assert load_eval_text("c.jsonl", text_field="body", base_dir=tmp_path).text == "x"
    with pytest.raises(ValueError, match="no such file"):
        load_eval_text("missing.txt", base_dir=tmp_path)
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="holds no text"):
        load_eval_text("empty.txt", base_dir=tmp_path)


def _report(original: float, quantized: float, engine: float | None = None) -> dict:
    ppl = perplexity_report(
        dataset="eval.txt",
        dataset_sha256="sha256:00",
        seq_len=64,
        windows=3,
        original=original,
        quantized=quantized,
        engine=quantized if engine is None else engine,
        kl=0.0125,
        engine_kl=0.0131,
        engine_name="onnxruntime-cpu",
        matmul_accuracy_level=4,
    )
    return {"perplexity": ppl}


def test_gate_message_gives_the_numbers_and_the_limit():
    report = _report(10.0, 10.5, 10.75)
    check_perplexity_gate(report, None)
    check_perplexity_gate(report, 0.75)  # equal to the limit passes
    with pytest.raises(EvalGateError) as err:
        check_perplexity_gate(report, 0.5)
    message = str(err.value)
    assert "10.7500" in message and "10.0000" in message and "0.5" in message
    assert "10.5000" in message and "onnxruntime-cpu" in message and "level 4" in message
    assert "evaluate.perplexity.max_delta" in message


def test_the_gate_judges_the_engine_that_ships():
    check_perplexity_gate(_report(10.0, 10.75, 10.25), 0.5)  # the IR's delta is not judged
    with pytest.raises(EvalGateError):
        check_perplexity_gate(_report(10.0, 10.25, 10.75), 0.5)


def test_markdown_report():
    label = "MatMulNBits accuracy level 4, int8 activations"  # the engine's (`describe`)
    text = render_markdown(_report(10.0, 10.5, 10.6), label)
    assert "| original (float, PyTorch) | 10.0000 | | |" in text
    assert "| quantized IR (PyTorch) | 10.5000 | +0.5000 (+5.00%) | 0.0125 |" in text
    assert (
        "| engine `onnxruntime-cpu` (MatMulNBits accuracy level 4, int8 activations) "
        "| 10.6000 | +0.6000 (+6.00%) | 0.0131 |"
    ) in text


def _engine(model, tmp_path: Path, level: int, kv: str = "fp32") -> EngineFiles:
    graph = export_onnx(model, tmp_path / "x", max_seq_len=64, kv_dtype=kv, kv_block_size=8)
    record = build_onnxruntime_engine(
        tmp_path / "x" / "model.onnx",
        tmp_path / "e",
        optimization_level="extended",
        matmul_accuracy_level=level,
    )
    info = EngineInfo.model_validate(record)
    return EngineFiles(GraphInfo.model_validate(graph), info, tmp_path / "e" / "model.onnx")


@pytest.mark.parametrize("kv", ["fp32", "fp16"])
def test_engine_perplexity_is_the_irs_at_accuracy_level_0(tmp_path, kv):
    """The engine, run through the runtime's pool, batch and session one window per call,
    scores what the IR scores (windows of 20 tokens: blocks of 8, the last one partial)."""
    model = load_model(make_checkpoint(tmp_path / "ck", "llama"))
    quantize_model(model, [quantize_entry(INT4)])
    windows = torch.randint(2, 320, (3, 20), generator=torch.Generator().manual_seed(0))
    engine = _engine(model, tmp_path, level=0, kv=kv)
    assert engine.kv_layout().block_size == 8
    ours = engine_perplexity(engine, windows.numpy())
    # fp16 KV: the engine attends to K/V rounded to fp16, as the runtime stores them.
    assert ours == pytest.approx(perplexity(model, windows), rel=1e-5 if kv == "fp32" else 2e-4)


def test_engine_perplexity_sees_int8_activations(tmp_path):
    model = load_model(make_checkpoint(tmp_path / "ck", "llama"))
    quantize_model(model, [quantize_entry(INT4)])
    windows = torch.randint(2, 320, (3, 20), generator=torch.Generator().manual_seed(0))
    ours = engine_perplexity(_engine(model, tmp_path, level=4), windows.numpy())
    ir = perplexity(model, windows)
    # random weights, 3 windows: 0.13% apart here; at level 0 it would be 2e-7
    assert ours != pytest.approx(ir, rel=1e-5) and ours == pytest.approx(ir, rel=0.1)
