"""The build: run the recipe's stages through the cache and package one artifact."""

from __future__ import annotations

import ast
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .cache import StageCache, stage_key
from .chat_template import recipe_chat_template
from .draft import resolve_draft
from .evaluate import (
    SpeculativePrompts,
    check_perplexity_gate,
    check_speculative_gate,
    perplexity_summary,
    speculative_prompts,
    speculative_summary,
)
from .evaluate.windows import EvalWindows, eval_windows
from .heads.attach import AttachedHeads, resolve_heads
from .heads.eagle_attach import AttachedEagle, resolve_eagle
from .interop import write_interop
from .interop.kv_scheme import KV_SCHEME_FORMATS, kv_scales_digest, read_kv_scales
from .manifest_fields import (
    Compiled,
    eval_and_interop_fields,
    manifest_fields,
    speculative_fields,
)
from .model.config import ModelConfig
from .plan import plan_build
from .preflight import check_recipe_against_model
from .quantize.layerwise import needs_calibration
from .recipe import Quantize, Recipe, RecipeError, load_recipe
from .resources import calibration_device, check_resources, require_resources
from .source import ResolvedSource, resolve_source
from .stage_memory import StagePeak
from .stages.calibrate import PreparedCalibration, prepare_calibration
from .stages.eagle import eagle_aux_layers, run_eagle
from .stages.engine import CHECK_REPORT, ENGINE_RECORD, engine_name, run_engine
from .stages.evaluate import run_evaluate
from .stages.export import run_export
from .stages.heads import run_heads
from .stages.package import run_package
from .stages.quantize import run_quantize

__all__ = ["build", "BuildResult", "StageRun"]

_TOOLS = ("ingot", "torch", "transformers", "safetensors", "onnx", "onnxruntime", "numpy")


@dataclass(slots=True)
class StageRun:
    stage: str
    key: str
    cached: bool
    seconds: float
    digest: str
    peak_rss_bytes: int | None = None  # the process's peak during the stage (stage_memory.py)


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


def tool_versions() -> dict[str, str]:
    """Versions of the tools each stage's output depends on, plus a digest of the code that
    builds the stages: an editable install keeps one version number across code changes, and
    a stage must not be served from a cache entry that older code wrote."""
    versions = {name: version(name) for name in _TOOLS}
    versions["ingot_source"] = _source_digest_of_build_code()
    return versions


def _source_digest_of_build_code() -> str:
    import ingot.artifacts
    import ingot.calibration
    import ingot.pipeline

    digest = hashlib.sha256()
    for package in (ingot.pipeline, ingot.calibration, ingot.artifacts):
        root = Path(package.__file__).parent
        for file in sorted(root.rglob("*.py")):
            digest.update(file.relative_to(root).as_posix().encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


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
    recipe_path = Path(recipe_path)
    recipe = load_recipe(recipe_path)
    source = resolve_source(recipe.stage_slice("source")["source"])
    model_cfg = ModelConfig.from_hf(source.hf_config)
    check_recipe_against_model(recipe, model_cfg)
    draft = resolve_draft(recipe, source, model_cfg)  # a draft that cannot serve fails here
    attached = resolve_heads(recipe, recipe_path, model_cfg)  # and attached Medusa heads
    attached_eagle = resolve_eagle(recipe, recipe_path, model_cfg)  # and an EAGLE-3 draft
    sign_key = _sign_key(recipe, recipe_path)  # a missing key fails before any stage runs
    chat_template = recipe_chat_template(recipe, recipe_path)  # and a missing template
    evaluation = eval_windows(recipe, recipe_path, source.path)  # unreadable data fails here
    spec_eval = speculative_prompts(recipe, recipe_path, source.path)  # and too little of it
    calibration = prepare_calibration(recipe, recipe_path, source.path, model_cfg)  # and here
    draft_calibration = None
    if draft is not None:  # the same data, tokenized by the draft's (equal) tokenizer
        draft_calibration = prepare_calibration(
            recipe, recipe_path, draft.source.path, draft.cfg, draft.quantize
        )
    cache = cache or StageCache()
    out_dir = Path(out) if out else Path("out") / recipe.artifact.name
    # RAM, GPU and disk the plan estimates against this machine: one line if they do not fit
    needs = plan_build(recipe, recipe_path, source.hf_config, source.path)
    calibrated = calibration is not None or draft_calibration is not None
    device = calibration_device(recipe) if calibrated else None
    check = check_resources(needs, cache_dir=cache.root, out_dir=out_dir, device=device)
    require_resources(check)  # unless $INGOT_SKIP_RESOURCE_CHECK=1
    versions = tool_versions()
    runs: list[StageRun] = []
    known_digests: dict[Path, str] = {}  # every stage file's sha256, as the cache verified it
    report = on_stage or (lambda stage, event: None)
    peak = StagePeak()

    def stage(
        name: str, slice_: Any, inputs: dict[str, str], produce, resumable: bool = False
    ) -> tuple[Path, str]:
        key = stage_key(name.split(":")[0], slice_, inputs, versions)
        report(name, "start")
        peak.start()
        started = time.perf_counter()
        hit = cache.get(name.split(":")[0], key)
        path = hit or cache.put(name.split(":")[0], key, produce, resumable=resumable)
        digest = cache.digest(path)
        known_digests.update(cache.file_digests(path))
        seconds = time.perf_counter() - started
        runs.append(StageRun(name, key, hit is not None, seconds, digest, peak.peak()))
        report(name, "cached" if hit else "done")
        return path, digest

    source_digest = _source_digest(source)
    method = recipe.speculative.method if recipe.speculative is not None else None
    aux_layers = None  # the target layers an EAGLE-3 draft reads (the graph outputs them)
    if method == "eagle":
        aux_layers = eagle_aux_layers(
            recipe.speculative.heads, model_cfg.num_layers, attached_eagle
        )
    target = _compile(
        stage,
        recipe,
        _Model("", source.path, source_digest, recipe.quantize, calibration),
        aux_layers,
    )
    heads = eagle = None
    if method == "medusa":
        heads = _heads(stage, recipe, target, attached, calibration)
    elif method == "eagle":
        verifier = getattr(recipe.source, "hub", None) or source.path.name  # for speculators
        eagle = _eagle(stage, recipe, target, attached_eagle, calibration, verifier)
    drafted = None
    if draft is not None:
        # The draft goes through the same stages under names of its own (draft-quantize, ...)
        # with its source in their inputs: neither model's change re-keys the other's stages.
        model = _Model(
            "draft-",
            draft.source.path,
            _source_digest(draft.source),
            draft.quantize,
            draft_calibration,
        )
        drafted = _compile(stage, recipe, model)
    q_dir, q_digest = target.quantize_dir, target.quantize_digest
    extra_dirs: dict[str, Path] = {}  # artifact directory -> stage output copied into it
    for fmt in recipe.stage_slice("interop")["interop"]:
        inputs, x_dir = {"quantize": q_digest, "source": source_digest}, None
        if recipe.kv_cache.quantized and fmt in KV_SCHEME_FORMATS:
            # It stores the export stage's K/V scales: keyed on them, not on the whole graph.
            x_dir = target.export_dir
            inputs["kv_scales"] = kv_scales_digest(read_kv_scales(x_dir))
        i_dir, _ = stage(
            f"interop:{fmt}",
            {"interop": fmt},
            inputs,
            lambda tmp, fmt=fmt, x_dir=x_dir: write_interop(
                fmt, q_dir, source.path, tmp, export_dir=x_dir
            ),
        )
        extra_dirs[f"interop/{fmt}"] = i_dir
    eval_fields = {}
    if evaluation is not None or spec_eval is not None:
        # The engine scored is the first target's: the one the runtime prefers (and the
        # draft model's engine of that name: the one the runtime pairs with it).
        first = engine_name(recipe.targets[0])
        dirs = {
            "source": (source.path, source_digest),
            "quantize": (q_dir, q_digest),
            "engine": (target.engine_dirs[first], target.engine_digests[first]),
            # The graph interface the engine was built from (graph.json), which the runtime
            # opens it with; not a key input: the engine's digest covers it.
            "export": (target.export_dir, ""),
        }
        if drafted is not None:
            dirs["draft_engine"] = (drafted.engine_dirs[first], drafted.engine_digests[first])
            dirs["draft_export"] = (drafted.export_dir, "")
        if heads is not None:
            dirs["heads"] = heads
        if eagle is not None:
            dirs["eagle"] = eagle
        e_dir = _evaluate(
            stage, evaluation, spec_eval, dirs, first, model_cfg, recipe.export.max_seq_len
        )
        measured = json.loads((e_dir / "report.json").read_text())
        # The gates run before packaging: the previous artifact and every cached stage stay.
        if evaluation is not None:
            check_perplexity_gate(measured, evaluation.spec.max_delta)
            eval_fields["perplexity"] = perplexity_summary(measured, evaluation.spec.max_delta)
        if spec_eval is not None:
            threshold = spec_eval.spec.min_accepted_length
            check_speculative_gate(measured, threshold)
            eval_fields["speculative"] = speculative_summary(measured, threshold)
        extra_dirs["eval"] = e_dir

    lock = _lock(recipe_path, source, runs, versions)
    if calibration is not None:
        lock["calibration"] = calibration.lock_entry
    if evaluation is not None:
        lock["eval_dataset"] = {"dataset": evaluation.spec.dataset, "text": evaluation.digest}
    if draft is not None:
        lock["draft"] = {"source": {"revision": draft.source.revision, "files": draft.source.files}}
        if draft_calibration is not None:
            lock["draft"]["calibration"] = draft_calibration.lock_entry
    fields = {
        **manifest_fields(recipe, recipe_path, model_cfg, target),
        **eval_and_interop_fields(target.checks, eval_fields, extra_dirs),
    }
    if recipe.speculative is not None:
        draft_cfg = draft.cfg if draft is not None else None
        heads_dir = heads[0] if heads is not None else None
        eagle_dir = eagle[0] if eagle is not None else None
        fields["speculative"] = speculative_fields(recipe, draft_cfg, drafted, heads_dir, eagle_dir)
    report("package", "start")
    peak.start()
    started = time.perf_counter()
    _, digest = run_package(
        out_dir,
        source=source.path,
        export_dir=target.export_dir,
        engine_dirs=target.engine_dirs,
        draft_engine_dirs=drafted.engine_dirs if drafted is not None else None,
        heads_dir=heads[0] if heads is not None else None,
        eagle_dir=eagle[0] if eagle is not None else None,
        lock=lock,
        manifest_fields=fields,
        extra_dirs=extra_dirs,
        sign_key=sign_key,
        chat_template=chat_template,
        known_digests=known_digests,
    )
    seconds = time.perf_counter() - started
    runs.append(StageRun("package", "", False, seconds, digest, peak.peak()))
    report("package", "done")
    return BuildResult(out_dir, digest, runs)


@dataclass(frozen=True, slots=True)
class _Model:
    """One model the recipe compiles: the target (stage names as they are), or the draft
    (stage names prefixed ``draft-``)."""

    prefix: str
    source: Path
    source_digest: str
    quantize: Sequence[Quantize]
    calibration: PreparedCalibration | None


def _compile(
    stage, recipe: Recipe, model: _Model, aux_layers: tuple[int, ...] | None = None
) -> Compiled:
    """[calibrate ->] quantize -> export -> engine per target, for one model, with the recipe's
    kv_cache, export and targets (a draft's block size must be the target's); `aux_layers`:
    the graph also outputs those layers' entering states (an EAGLE-3 draft's inputs)."""
    calibrated = _calibrate(stage, model)
    q_dir, q_digest = _quantize(stage, model, calibrated)
    export_slice, export_inputs, c_dir = recipe.stage_slice("export"), {"quantize": q_digest}, None
    if recipe.kv_cache.quantized:
        # The K/V scales are calibrated on the windows in this stage: they key it too.
        c_dir, c_digest = calibrated
        export_slice = {**export_slice, "calibration": model.calibration.key_slice}
        export_inputs |= {"dataset": model.calibration.calibration.dataset_digest}
        export_inputs |= {"calibrate": c_digest}
    if aux_layers is not None:  # absent otherwise: other recipes keep their keys
        export_slice = {**export_slice, "aux_layers": list(aux_layers)}
    x_dir, x_digest = stage(
        f"{model.prefix}export",
        export_slice,
        export_inputs,
        lambda tmp: run_export(
            q_dir,
            recipe.export,
            recipe.kv_cache,
            tmp,
            calibration_dir=c_dir,
            aux_layers=aux_layers,
        ),
    )
    compiled = Compiled(q_dir, q_digest, x_dir, calibrated=calibrated)
    for target in recipe.targets:
        name = engine_name(target)
        # The engine stage also reads the IR: it checks the engine it builds against it.
        e_dir, compiled.engine_digests[name] = stage(
            f"{model.prefix}engine:{name}",
            target.model_dump(mode="json"),
            {"export": x_digest, "quantize": q_digest},
            lambda tmp, target=target: run_engine(x_dir, q_dir, target, tmp),
        )
        compiled.engine_dirs[name] = e_dir
        compiled.records.append(json.loads((e_dir / ENGINE_RECORD).read_text()))
        compiled.checks.append(json.loads((e_dir / CHECK_REPORT).read_text()))
    return compiled


def _heads(
    stage,
    recipe: Recipe,
    target: Compiled,
    attached: AttachedHeads | None,
    calibration: PreparedCalibration | None,
) -> tuple[Path, str]:
    """The Medusa heads stage: attached heads keyed by their files' digest, trained ones by
    the quantized target and the calibration windows they learn on (resumable)."""
    spec = recipe.speculative.heads
    # The attach path is not in the key (its files' digest is): moving the checkpoint is free.
    slice_: dict[str, Any] = {"heads": spec.model_dump(mode="json", exclude={"attach"})}
    if attached is not None:
        return stage(
            "heads",
            slice_,
            {"attach": attached.digest},
            lambda tmp: run_heads(spec, tmp, attached=attached),
        )
    c_dir, c_digest = target.calibrated
    slice_["calibration"] = calibration.key_slice
    inputs = {
        "quantize": target.quantize_digest,
        "calibrate": c_digest,
        "dataset": calibration.calibration.dataset_digest,
    }
    return stage(
        "heads",
        slice_,
        inputs,
        lambda tmp, work: run_heads(
            spec, tmp, ir_dir=target.quantize_dir, calibration_dir=c_dir, work_dir=work
        ),
        resumable=True,
    )


def _eagle(
    stage,
    recipe: Recipe,
    target: Compiled,
    attached: AttachedEagle | None,
    calibration: PreparedCalibration | None,
    verifier: str,
) -> tuple[Path, str]:
    """The EAGLE-3 stage: keyed by the quantized target (its embedding feeds the draft, and a
    trained draft learns from it) and an attached checkpoint's files' digest, or the
    calibration windows a trained draft learns on (resumable)."""
    spec = recipe.speculative.heads
    slice_: dict[str, Any] = {
        "eagle": spec.model_dump(mode="json", exclude={"attach"}),
        "max_seq_len": recipe.export.max_seq_len,
        "kv_block_size": recipe.kv_cache.block_size,
        "num_speculative_tokens": recipe.speculative.num_speculative_tokens,
    }
    slice_["verifier"] = verifier  # written into the speculators config.json
    inputs = {"quantize": target.quantize_digest}
    common = {
        "ir_dir": target.quantize_dir,
        "max_seq_len": recipe.export.max_seq_len,
        "kv_block_size": recipe.kv_cache.block_size,
        "num_speculative_tokens": recipe.speculative.num_speculative_tokens,
        "verifier": verifier,
    }
    if attached is not None:
        return stage(
            "eagle",
            slice_,
            {**inputs, "attach": attached.digest},
            lambda tmp: run_eagle(spec, tmp, attached=attached, **common),
        )
    c_dir, c_digest = target.calibrated
    slice_["calibration"] = calibration.key_slice
    inputs |= {"calibrate": c_digest, "dataset": calibration.calibration.dataset_digest}
    return stage(
        "eagle",
        slice_,
        inputs,
        lambda tmp, work: run_eagle(spec, tmp, calibration_dir=c_dir, work_dir=work, **common),
        resumable=True,
    )


def _calibrate(stage, model: _Model) -> tuple[Path, str] | None:
    """The calibrate stage, when a GPTQ / AWQ entry or an int8 / fp8 KV cache needs the
    windows (`prepare_calibration` prepared them); None otherwise."""
    calibration = model.calibration
    if calibration is None:
        return None
    data = {"source": model.source_digest, "dataset": calibration.calibration.dataset_digest}
    return stage(f"{model.prefix}calibrate", calibration.key_slice, data, calibration.save)


def _quantize(stage, model: _Model, calibrated: tuple[Path, str] | None) -> tuple[Path, str]:
    """The quantize stage, on the calibrate stage's windows when a GPTQ / AWQ entry needs them
    (an RTN recipe's key holds no calibration, even when its KV cache's scales need one)."""
    entries, calibration, source_path = model.quantize, model.calibration, model.source
    # The slice is the entries' JSON (what Recipe.stage_slice("quantize") gives the target)
    quantize_slice = {"quantize": [entry.model_dump(mode="json") for entry in entries]}
    if not needs_calibration(entries):
        return stage(
            f"{model.prefix}quantize",
            quantize_slice,
            {"source": model.source_digest},
            lambda tmp: run_quantize(source_path, entries, tmp),
        )
    c_dir, c_digest = calibrated
    data = {"source": model.source_digest, "dataset": calibration.calibration.dataset_digest}
    return stage(
        f"{model.prefix}quantize",
        {**quantize_slice, "calibration": calibration.key_slice},
        {**data, "calibrate": c_digest},
        lambda tmp, work: run_quantize(
            source_path, entries, tmp, calibration_dir=c_dir, work_dir=work
        ),
        resumable=True,
    )


def _evaluate(
    stage,
    evaluation: EvalWindows | None,
    spec_eval: SpeculativePrompts | None,
    dirs: dict[str, tuple[Path, str]],
    engine: str,
    cfg: ModelConfig,
    max_seq_len: int,
) -> Path:
    """The evaluate stage over the stage outputs ``dirs`` ({"source" | "quantize" | "engine" |
    "export" | "draft_engine" | "draft_export" | "heads" | "eagle": (directory, digest)}, the
    draft's with a draft model,
    the heads with Medusa, the EAGLE-3 stage's with eagle); ``engine`` names the engine
    measured. Perplexity with ``evaluation``, speculation with ``spec_eval``."""
    (s_dir, s_digest), (q_dir, _), (e_dir, e_digest) = (
        dirs[name] for name in ("source", "quantize", "engine")
    )
    slice_: dict[str, Any] = {"engine": engine}
    inputs = {"engine": e_digest, "source": s_digest}
    # The runtime's loader, and the engine plug-in it finds by name (not by an import).
    runtime = ["ingot.runtime.loader", "ingot.runtime.engines.onnxruntime"]
    if evaluation is not None:
        # max_delta is left out of the key: changing the gate re-judges, it does not re-measure.
        slice_["perplexity"] = evaluation.spec.model_dump(mode="json", exclude={"max_delta"})
        inputs |= {"quantize": dirs["quantize"][1], "dataset": evaluation.digest}
    draft_dir = draft_export_dir = heads_dir = eagle_dir = None
    if spec_eval is not None:
        slice_["speculative"] = spec_eval.key_slice()
        inputs["speculative_dataset"] = spec_eval.digest
        if spec_eval.method.method == "draft_model":
            draft_dir, inputs["draft_engine"] = dirs["draft_engine"]
            draft_export_dir = dirs["draft_export"][0]
        if spec_eval.method.method == "medusa":
            heads_dir, inputs["heads"] = dirs["heads"]
        if spec_eval.method.method == "eagle":
            eagle_dir, inputs["eagle"] = dirs["eagle"]
        runtime += [
            "ingot.runtime.generate",
            "ingot.runtime.speculative.load",
            "ingot.runtime.speculative.draft_model",
            "ingot.runtime.speculative.ngram",
            "ingot.runtime.speculative.medusa",
            "ingot.runtime.speculative.eagle",
        ]
    inputs["runtime"] = _runtime_digest(runtime)
    out, _ = stage(
        "evaluate",
        slice_,
        inputs,
        lambda tmp: run_evaluate(
            tmp,
            source_path=s_dir,
            ir_dir=q_dir,
            engine_dir=e_dir,
            export_dir=dirs["export"][0],
            perplexity_windows=evaluation,
            speculative=spec_eval,
            draft_engine_dir=draft_dir,
            draft_export_dir=draft_export_dir,
            heads_dir=heads_dir,
            eagle_dir=eagle_dir,
            cfg=cfg,
            max_seq_len=max_seq_len,
        ),
    )
    return out


def _runtime_digest(modules: Sequence[str]) -> str:
    """sha256 of the runtime modules the evaluate stage runs the engine through and of every
    runtime module they import (found in their source: ``ingot.runtime.*`` imports, however
    deep): they are not in `tool_versions`' build-code digest (a runtime edit must not re-key
    every stage), but they compute the stage's numbers."""
    import ingot.runtime

    root = Path(ingot.runtime.__file__).parent
    files: dict[str, Path] = {}
    todo = list(modules)
    while todo:
        name = todo.pop()
        file = _runtime_module_file(root, name)
        if file is None or name in files:
            continue
        files[name] = file
        for node in ast.walk(ast.parse(file.read_bytes())):
            if isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # `from ingot.runtime.x import y`: module x, or y when it is a submodule
                todo += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode())
        digest.update(files[name].read_bytes())
    return "sha256:" + digest.hexdigest()


def _runtime_module_file(root: Path, name: str) -> Path | None:
    """The source file of runtime module `name` (a package's __init__.py), or None for one
    outside ingot.runtime, a name that is not a module, or ingot.runtime itself (whose
    __init__ only re-exports)."""
    if not name.startswith("ingot.runtime."):
        return None
    path = root.joinpath(*name.split(".")[2:])
    for file in (path.with_suffix(".py"), path / "__init__.py"):
        if file.is_file():
            return file
    return None


def _sign_key(recipe: Recipe, recipe_path: Path) -> Path | None:
    """artifact.sign.key, resolved against the recipe's directory like source.path."""
    if recipe.artifact.sign is None:
        return None
    key = recipe_path.absolute().parent / Path(recipe.artifact.sign.key).expanduser()
    if not key.is_file():
        raise RecipeError([f"{recipe_path}: artifact.sign.key: {key}: no such key file"])
    return key


def _source_digest(source: ResolvedSource) -> str:
    blob = json.dumps(source.files, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _lock(recipe_path: Path, source: ResolvedSource, runs: list[StageRun], versions) -> dict:
    return {
        "lock_version": 1,
        "recipe_sha256": hashlib.sha256(recipe_path.read_bytes()).hexdigest(),
        "source": {"revision": source.revision, "files": source.files},
        "seeds": {"export_check": 0},
        "stages": {r.stage: {"key": r.key, "output": r.digest} for r in runs},
        "tools": versions,
    }
