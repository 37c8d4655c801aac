"""The evaluate stage and interop exports in a build of the demo model (fast settings):
reports and checkpoints in the artifact, the perplexity gate failing before packaging with
nothing lost, and the cache. The demo model is trained, so quantization measurably raises its
perplexity (a random model's can go either way)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ingot.artifacts import verify_artifact
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.evaluate import EvalGateError

from fixtures import write_recipe

DEMO = Path(__file__).parents[2] / "recipes" / "demo"
ASYM_INT4 = [
    {
        "method": "rtn",
        "bits": 4,
        "group_size": 32,
        "symmetric": False,
        "targets": ["re:layers\\..*"],
        "ignore": ["lm_head"],
    }
]


def _recipe(tmp_path: Path, name: str, max_delta: float | None, **overrides) -> Path:
    shutil.copyfile(DEMO / "pydoc-heldin.txt", tmp_path / "eval.txt")
    perplexity = {"dataset": "eval.txt", "seq_len": 64, "max_windows": 4, "max_delta": max_delta}
    return write_recipe(
        tmp_path / name,
        DEMO / "pydoc-tiny",
        quantize=ASYM_INT4,
        export={"max_seq_len": 64},
        evaluate={"perplexity": perplexity},
        interop=["gptq", "awq", "compressed-tensors"],
        **{"targets": [{"engine": "onnxruntime", "matmul_accuracy_level": 4}], **overrides},
    )


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_evaluate_interop_and_the_gate(tmp_path):
    cache = StageCache(tmp_path / "cache")
    first = build(_recipe(tmp_path, "a.yaml", 100.0), tmp_path / "out", cache=cache)

    manifest = verify_artifact(first.artifact)
    ppl = manifest.eval["perplexity"]
    assert set(ppl) == {
        "dataset",
        "windows",
        "seq_len",
        "original",
        "quantized",
        "delta",
        "engine",
        "engine_delta",
        "engine_name",
        "max_delta",
    }
    assert (ppl["dataset"], ppl["windows"], ppl["seq_len"]) == ("eval.txt", 4, 64)
    assert ppl["delta"] == pytest.approx(ppl["quantized"] - ppl["original"], abs=1e-5)
    assert ppl["engine_delta"] == pytest.approx(ppl["engine"] - ppl["original"], abs=1e-5)
    # The engine (int8 activations) is scored as it serves: close to the IR, not equal to it.
    assert ppl["engine_name"] == "onnxruntime-cpu"
    assert ppl["engine"] != ppl["quantized"]
    assert ppl["engine"] == pytest.approx(ppl["quantized"], rel=0.02)
    assert "export_check" in manifest.eval
    report = json.loads((first.artifact / "eval" / "report.json").read_text())["perplexity"]
    assert report["original"] == ppl["original"] and report["tokens_scored"] == 4 * 63
    assert (first.artifact / "eval" / "report.md").read_text().startswith("# Evaluation")
    assert [i.format for i in manifest.interop] == ["gptq", "awq", "compressed-tensors"]
    for info in manifest.interop:
        config = json.loads((first.artifact / info.path / "config.json").read_text())
        assert config["quantization_config"] == info.quantization_config
        assert (first.artifact / info.path / "model.safetensors").is_file()
        assert (first.artifact / info.path / "tokenizer.json").is_file()
    lock = json.loads((first.artifact / "ingot.lock").read_text())
    assert lock["eval_dataset"]["text"].startswith("sha256:")

    # A gate the model misses: the build fails naming both numbers, before packaging.
    before = _files(first.artifact)
    strict = _recipe(tmp_path, "b.yaml", 0.0)
    events: list[tuple[str, str]] = []
    with pytest.raises(EvalGateError) as err:
        build(strict, tmp_path / "out", cache=cache, on_stage=lambda s, e: events.append((s, e)))
    assert f"{ppl['engine']:.4f}" in str(err.value) and f"{ppl['original']:.4f}" in str(err.value)
    assert ("evaluate", "cached") in events  # the gate re-judges; it does not re-measure
    assert ("package", "start") not in events
    assert _files(first.artifact) == before

    # Relaxing the gate again packages from the cache alone.
    again = build(_recipe(tmp_path, "c.yaml", 100.0), tmp_path / "out", cache=cache)
    assert all(s.cached for s in again.stages if s.stage != "package")
    assert again.digest == first.digest

    # Another engine is measured again (its digest is in the evaluate stage's key): at
    # accuracy level 0 it computes the IR's numbers.
    exact = [{"engine": "onnxruntime", "matmul_accuracy_level": 0}]
    level0 = build(
        _recipe(tmp_path, "d.yaml", 100.0, targets=exact), tmp_path / "out0", cache=cache
    )
    runs = {s.stage: s.cached for s in level0.stages}
    assert runs["quantize"] and runs["export"] and not runs["evaluate"]
    ppl0 = verify_artifact(level0.artifact).eval["perplexity"]
    assert ppl0["original"] == ppl["original"] and ppl0["quantized"] == ppl["quantized"]
    assert ppl0["engine"] == pytest.approx(ppl0["quantized"], rel=1e-5)
