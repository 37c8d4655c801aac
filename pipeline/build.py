"""The build: prepare and check everything, walk the recipe's stage graph through the cache,
judge the gates, package one artifact (docs/design.md, "The stage contract")."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .cache import StageCache, code_digest
from .plan import plan_build
from .quantize.method import method_of
from .resources import calibration_device, check_resources, require_resources
from .stages.evaluate import judge_gates
from .stages.graph import BuildOutputs, declare_stages
from .stages.package import Package, run_package
from .stages.prepare import BuildInputs, prepare
from .stages.walk import StageRun, Walk

__all__ = ["build", "BuildResult", "StageRun", "tool_versions"]

_TOOLS = ("ingot", "torch", "transformers", "safetensors", "onnx", "onnxruntime", "numpy")


@dataclass(slots=True)
class BuildResult:
    artifact: Path
    digest: str  # sha256 of manifest.json: the artifact's identity
    stages: list[StageRun] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "artifact": str(self.artifact),
            "digest": self.digest,
            "stages": [asdict(s) for s in self.stages],
        }


def build(
    recipe_path: str | Path,
    out: str | Path | None = None,
    *,
    cache: StageCache | None = None,
    on_stage: Callable[[str, str], None] | None = None,
) -> BuildResult:
    """Build the artifact a recipe describes. Everything is validated before any stage runs.

    ``on_stage(stage, event)`` reports progress: event is "start", "cached" or "done".
    """
    inputs = prepare(recipe_path)  # bad input of any kind fails here, in seconds
    cache = cache or StageCache()
    out_dir = Path(out) if out else Path("out") / inputs.recipe.artifact.name
    _require_resources(inputs, cache, out_dir)
    graph = declare_stages(inputs)
    walk = Walk(cache, tool_versions(), on_stage)
    walk.run(graph.stages())
    outputs = graph.outputs(walk)
    # The gates run before packaging: the previous artifact and every cached stage stay.
    eval_fields = judge_gates(outputs.evaluation, inputs)
    lock = _lock(inputs, walk.runs, walk.versions, outputs)
    package = Package(inputs, outputs, eval_fields, lock)
    digest = walk.step("package", lambda: run_package(out_dir, package, walk.known_digests)[1])
    return BuildResult(out_dir, digest, walk.runs)


def tool_versions() -> dict[str, str]:
    """Versions of the tools each stage's output depends on, plus a digest of the code that
    builds the stages: an editable install keeps one version number across code changes, and
    a stage must not be served from a cache entry that older code wrote."""
    versions = {name: version(name) for name in _TOOLS}
    versions["ingot_source"] = _source_digest_of_build_code()
    return versions


def _source_digest_of_build_code() -> str:
    # The sweep runs builds and computes no stage: editing it must not re-key every stage.
    return code_digest("ingot.pipeline", "ingot.calibration", "ingot.artifacts", exclude=("sweep",))


def _require_resources(inputs: BuildInputs, cache: StageCache, out_dir: Path) -> None:
    """RAM, GPU and disk the plan estimates against this machine: one line if they do not
    fit (unless $INGOT_SKIP_RESOURCE_CHECK=1)."""
    recipe, source = inputs.recipe, inputs.source
    needs = plan_build(recipe, inputs.recipe_path, source.hf_config, source.path)
    calibrated = inputs.calibration is not None or inputs.draft_calibration is not None
    device = calibration_device(recipe) if calibrated else None
    require_resources(check_resources(needs, cache_dir=cache.root, out_dir=out_dir, device=device))


def _lock(
    inputs: BuildInputs, runs: list[StageRun], versions: dict[str, str], outputs: BuildOutputs
) -> dict:
    """ingot.lock: what the artifact was built from (recipe, source files, data, each stage's
    key and output digest, the tools, and the quantize entries a search resolved)."""
    source = inputs.source
    lock: dict[str, Any] = {
        "lock_version": 1,
        "recipe_sha256": hashlib.sha256(inputs.recipe_path.read_bytes()).hexdigest(),
        "source": {"revision": source.revision, "files": source.files},
        "seeds": {"export_check": 0},
        "stages": {r.stage: {"key": r.key, "output": r.digest} for r in runs},
        "tools": versions,
    }
    if inputs.calibration is not None:
        lock["calibration"] = inputs.calibration.lock_entry
    if inputs.defaulted:  # entries the model's size added (the embedding and lm_head's)
        entries = inputs.recipe.quantize
        lock["quantize_defaults"] = {
            str(i): method_of(entries[i]).record(entries[i]) for i in inputs.defaulted
        }
    resolved = outputs.target.quantize.resolved()  # {index of an auto entry: its entries}
    if resolved is not None:
        lock["quantize_resolved"] = resolved
    if inputs.evaluation is not None:
        spec = inputs.evaluation.spec
        lock["eval_dataset"] = {"dataset": spec.dataset, "text": inputs.evaluation.digest}
    if inputs.draft is not None:
        draft = inputs.draft.source
        lock["draft"] = {"source": {"revision": draft.revision, "files": draft.files}}
        if inputs.draft_calibration is not None:
            lock["draft"]["calibration"] = inputs.draft_calibration.lock_entry
    return lock
