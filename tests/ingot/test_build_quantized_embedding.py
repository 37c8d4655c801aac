"""A build of the demo model (tied embeddings) whose embedding and lm_head are int8 per row:
the build's own engine check (graph and ONNX Runtime engine against the IR), one table in
the artifact, the entry in the manifest's quantization summary, what the eval report says
they cost, and the runtime's greedy tokens against the IR's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import torch

from ingot.artifacts import verify_artifact
from ingot.pipeline.build import build
from ingot.pipeline.cache import StageCache
from ingot.pipeline.quantize.checkpoint import load_ir
from ingot.runtime import LoadedModel, SamplingParams

from fixtures import write_recipe

DEMO = Path(__file__).parents[2] / "recipes" / "demo"
LAYERS = {"method": "rtn", "bits": 4, "group_size": 32, "targets": ["re:layers\\..*"]}
HEADS = {
    "method": "rtn",
    "bits": 8,
    "group_size": -1,
    "targets": ["embed_tokens", "lm_head"],
    "ignore": [],
}


def test_build_with_quantized_embedding_and_lm_head(tmp_path):
    shutil.copyfile(DEMO / "pydoc-heldin.txt", tmp_path / "eval.txt")
    perplexity = {"dataset": "eval.txt", "seq_len": 64, "max_windows": 4, "max_delta": 100.0}
    recipe = write_recipe(
        tmp_path / "r.yaml",
        DEMO / "pydoc-tiny",
        quantize=[LAYERS, HEADS],
        export={"max_seq_len": 64},
        evaluate={"perplexity": perplexity},
        targets=[{"engine": "onnxruntime", "matmul_accuracy_level": 0}],
        artifact={"name": "tiny", "portable": True},  # the exported graph, inspected below
    )
    built = build(recipe, tmp_path / "out", cache=StageCache(tmp_path / "cache"))
    manifest = verify_artifact(built.artifact)
    heads = manifest.model.quantization[1]
    assert (heads["method"], heads["bits"], heads["modules"]) == ("rtn", 8, 2)

    graph = onnx.load(str(built.artifact / "model.onnx"), load_external_data=False).graph
    table = [i for i in graph.initializer if i.name.startswith("embed_tokens.codes_t")]
    offsets = {next(e.value for e in i.external_data if e.key == "offset") for i in table}
    assert len(offsets) == 1 and table[0].data_type == onnx.TensorProto.INT8  # stored once
    assert not any(
        i.name.startswith(("lm_head.", "embed_tokens.weight")) for i in graph.initializer
    )

    report = json.loads((built.artifact / "eval" / "report.json").read_text())["perplexity"]
    cost = report["embedding_lm_head"]
    assert cost["quantized"] == ["embed_tokens", "lm_head"]
    assert cost["cost"] == round(report["quantized"] - cost["ir_with_them_float"], 6)
    assert (
        "Quantized `embed_tokens` and `lm_head`"
        in (built.artifact / "eval" / "report.md").read_text()
    )

    # The runtime's greedy tokens are the IR's (the engine computes exactly: level 0).
    ir = load_ir(next(p.parent for p in (tmp_path / "cache").rglob("ir_config.json")))
    prompt = [0, 17, 342, 9, 77, 1024, 5]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    generator = LoadedModel.load(built.artifact).generator()
    [completion] = generator.generate([prompt], params)
    with torch.inference_mode():
        want = ir.generate_greedy(prompt, 16, stop_at_eos=False)
    assert completion.token_ids == want
