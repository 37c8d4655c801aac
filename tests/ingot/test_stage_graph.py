"""The declared stage graph: the keys a build records are the documented formula over each
stage's slice and inputs (computed here by hand, not through the graph), the graph lists
every stage after what it reads, the walk refuses a graph that does not, and a new stage is a
declaration: a toy one, keyed on an earlier stage and reading it through its contract, is
walked and cached like the others."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from ingot.pipeline.build import build, tool_versions
from ingot.pipeline.cache import StageCache, stage_key
from ingot.pipeline.plan import plan_build
from ingot.pipeline.recipe import load_recipe
from ingot.pipeline.stages.export import ExportOutput
from ingot.pipeline.stages.graph import declare_stages
from ingot.pipeline.stages.prepare import prepare
from ingot.pipeline.stages.stage import Stage, StageJob, StageOutput
from ingot.pipeline.stages.walk import Walk

from fixtures import make_checkpoint, write_recipe

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "recipes" / "demo"
EXACT = [{"engine": "onnxruntime", "matmul_accuracy_level": 0}]


def _demo_recipe(tmp_path: Path) -> Path:
    shutil.copyfile(DEMO / "pydoc-heldin.txt", tmp_path / "eval.txt")
    return write_recipe(
        tmp_path / "r.yaml",
        DEMO / "pydoc-tiny",
        export={"max_seq_len": 64},
        targets=EXACT,
        interop=["gptq"],
        evaluate={"perplexity": {"dataset": "eval.txt", "seq_len": 64, "max_windows": 2}},
    )


def _sha256_json(value) -> str:
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _runtime_source_digest() -> str:
    """Every .py of the runtime package, sorted by relative path: path, then bytes."""
    root = REPO / "runtime"
    digest = hashlib.sha256()
    for file in sorted(root.rglob("*.py")):
        digest.update(file.relative_to(root).as_posix().encode())
        digest.update(file.read_bytes())
    return "sha256:" + digest.hexdigest()


def test_each_key_is_the_formula_over_its_slice_and_inputs(tmp_path):
    path = _demo_recipe(tmp_path)
    result = build(path, tmp_path / "out", cache=StageCache(tmp_path / "cache"))
    lock = json.loads((result.artifact / "ingot.lock").read_text())
    recipe, tools, stages = load_recipe(path), lock["tools"], lock["stages"]
    source = _sha256_json(lock["source"]["files"])
    quantize, export = stages["quantize"]["output"], stages["export"]["output"]
    entries = [entry.model_dump(mode="json") for entry in recipe.quantize]
    perplexity = recipe.evaluate.perplexity.model_dump(mode="json", exclude={"max_delta"})
    expected = {
        "quantize": ("quantize", {"quantize": entries}, {"source": source}),
        "export": ("export", recipe.stage_slice("export"), {"quantize": quantize}),
        "engine:onnxruntime-cpu": (
            "engine",
            recipe.targets[0].model_dump(mode="json"),
            {"export": export, "quantize": quantize},
        ),
        "interop:gptq": ("interop", {"interop": "gptq"}, {"quantize": quantize, "source": source}),
        "evaluate": (
            "evaluate",
            {"engine": "onnxruntime-cpu", "perplexity": perplexity},
            {
                "engine": stages["engine:onnxruntime-cpu"]["output"],
                "source": source,
                "quantize": quantize,
                "dataset": lock["eval_dataset"]["text"],
                "runtime": _runtime_source_digest(),  # the whole package, not a module list
            },
        ),
    }
    keys = {name: stage_key(kind, s, inputs, tools) for name, (kind, s, inputs) in expected.items()}
    assert {name: entry["key"] for name, entry in stages.items()} == keys
    assert [run.stage for run in result.stages] == [*expected, "package"]


def test_the_graph_lists_each_stage_after_what_it_reads(tmp_path):
    target = make_checkpoint(tmp_path / "target", "llama")
    draft = make_checkpoint(tmp_path / "draft", "llama", seed=1, num_hidden_layers=1)
    shutil.copyfile(DEMO / "pydoc-heldin.txt", tmp_path / "text.txt")
    path = write_recipe(
        tmp_path / "r.yaml",
        target,
        calibration={"dataset": "text.txt", "samples": 4, "seq_len": 32},
        quantize=[{"method": "gptq", "bits": 4, "group_size": 32, "ignore": ["lm_head"]}],
        kv_cache={"dtype": "fp8", "block_size": 8},
        targets=EXACT,
        interop=["compressed-tensors"],
        speculative={
            "method": "draft_model",
            "num_speculative_tokens": 3,
            "draft": {"source": {"path": str(draft)}},
        },
        evaluate={"speculative": {"dataset": "text.txt", "prompts": 2, "prompt_tokens": 8}},
    )
    graph = declare_stages(prepare(path))
    stages = graph.stages()
    assert [s.name for s in stages] == [
        "calibrate",
        "quantize",
        "export",
        "engine:onnxruntime-cpu",
        "draft-calibrate",
        "draft-quantize",
        "draft-export",
        "draft-engine:onnxruntime-cpu",
        "interop:compressed-tensors",
        "evaluate",
    ]
    for i, stage in enumerate(stages):
        assert {s.name for s in stage.upstream} <= {s.name for s in stages[:i]}, stage.name
    by_name = {s.name: s for s in stages}
    # The interop checkpoint of an fp8 KV cache is keyed on the export's scales, not its graph.
    assert set(by_name["interop:compressed-tensors"].inputs) == {"quantize", "source", "kv_scales"}
    evaluate = by_name["evaluate"]
    assert set(evaluate.inputs) == {
        "engine",
        "source",
        "speculative_dataset",
        "draft_engine",
        "runtime",
    }
    assert evaluate.inputs["draft_engine"] is by_name["draft-engine:onnxruntime-cpu"]
    # Read, not keyed: the export graphs the engines were built from.
    assert {"export", "draft-export"} <= {s.name for s in evaluate.upstream}

    walk = Walk(StageCache(tmp_path / "cache"), {})
    with pytest.raises(ValueError, match="draft-quantize reads draft-calibrate, not run before"):
        walk.run(stages[5:6])


@pytest.mark.parametrize(
    "recipe", sorted(p.name for p in (REPO / "recipes").glob("demo*.yaml")), ids=str
)
def test_the_plan_estimates_the_stages_the_graph_declares(recipe):
    # `ingot plan` lists its stages itself (it reads config.json alone: no stage can be keyed
    # without the hashed source and the tokenized data); they must be the graph's, plus the
    # source's hashing and the package step, without interop (counted as disk only).
    path = REPO / "recipes" / recipe
    inputs = prepare(path)
    declared = [s.name for s in declare_stages(inputs).stages()]
    plan = plan_build(inputs.recipe, path, inputs.source.hf_config, inputs.source.path)
    estimated = [s.stage for s in plan.stages if s.stage not in ("source", "draft-source")]
    assert estimated == [n for n in declared if not n.startswith("interop:")] + ["package"]


@dataclass(frozen=True, slots=True)
class GraphInputsOutput(StageOutput):
    """The toy stage's contract: ``inputs.json``, the graph's input names."""

    NAMES: ClassVar[str] = "inputs.json"

    def names(self) -> list[str]:
        return self._json(self.NAMES)


def graph_inputs_stage(export: Stage[ExportOutput]) -> Stage[GraphInputsOutput]:
    """The toy stage: keyed on the export stage's output, reading it through its contract."""

    def produce(job: StageJob) -> None:
        names = [t["name"] for t in job[export].graph_info()["inputs"]]
        (job.out / GraphInputsOutput.NAMES).write_text(json.dumps(names))

    return Stage("graph-inputs", GraphInputsOutput, {}, {"export": export}, produce)


def test_a_new_stage_is_a_declaration(tmp_path):
    graph = declare_stages(prepare(_demo_recipe(tmp_path)))
    toy = graph_inputs_stage(graph.target.export)
    cache, versions = StageCache(tmp_path / "cache"), tool_versions()
    first = Walk(cache, versions)
    first.run([*graph.stages(), toy])
    names = first[toy].names()
    assert names[0] == "input_ids" and "block_tables" in names
    assert first.runs[-1].stage == "graph-inputs" and not first.runs[-1].cached
    again = Walk(cache, versions)
    again.run([*graph.stages(), toy])
    assert all(run.cached for run in again.runs)
    assert again[toy].digest == first[toy].digest

    # A stage reads only the stages it declared.
    quantize = graph.target.quantize
    sneaky = Stage("sneaky", StageOutput, {}, {}, lambda job: job[quantize])
    with pytest.raises(KeyError, match="stage quantize was not declared as read"):
        again.run([sneaky])
