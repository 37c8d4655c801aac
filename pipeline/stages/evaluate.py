"""Stage: perplexity of the original model, the quantized IR and the engine that ships, on the
same token windows; and the mean accepted length of the recipe's speculative decoding.

The original and the IR are scored in torch; the engine (the artifact's first target, the
engine stage's output) as the runtime runs it (`evaluate/engine.py`), so an engine that
quantizes activations to int8 is measured as it will serve. Speculation runs through the
runtime's own Generator on that engine (and the draft model's engine of the same name),
`evaluate/speculative.py`. Both open the stage outputs through the runtime's loader
(runtime/loader.py): the export's graph interface, the engine's record and file, the drafter's
graphs, as a manifest would name them once packaged.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

from ingot.artifacts import EngineInfo, GraphInfo
from ingot.artifacts.manifest import EagleInfo
from ingot.runtime.loader import DrafterFiles, EngineFiles

from ..engines import ENGINE_BUILDERS
from ..evaluate.engine import engine_perplexity
from ..evaluate.markdown import render_markdown
from ..evaluate.perplexity import perplexity
from ..evaluate.report import perplexity_report
from ..evaluate.speculative import SpeculativePrompts, measure_speculation
from ..evaluate.windows import EvalWindows
from ..heads.eagle_export import FC_FILE as EAGLE_FC
from ..heads.eagle_export import MODEL_FILE as EAGLE_MODEL
from ..heads.export import MODEL_FILE as HEADS_MODEL
from ..model.config import ModelConfig
from ..model.load import load_model
from ..quantize.checkpoint import load_ir
from .eagle import EAGLE_RECORD
from .engine import ENGINE_RECORD
from .export import GRAPH_INFO

__all__ = ["engine_files", "run_evaluate"]


def run_evaluate(
    out: Path,
    *,
    source_path: Path,
    ir_dir: Path,
    engine_dir: Path,
    export_dir: Path,
    perplexity_windows: EvalWindows | None = None,
    speculative: SpeculativePrompts | None = None,
    draft_engine_dir: Path | None = None,
    draft_export_dir: Path | None = None,
    heads_dir: Path | None = None,
    eagle_dir: Path | None = None,
    cfg: ModelConfig | None = None,
    max_seq_len: int | None = None,
) -> None:
    """Write report.json and report.md (measurements only: the gates are the build's call, so
    changing `max_delta` or `min_accepted_length` re-uses this stage). `engine_dir` is the first
    target's engine stage output, `export_dir` the graph it was built from. `speculative` needs
    the model's `cfg` and the exported `max_seq_len`, for draft_model the draft's engine stage
    output of the first target's name and its export (`draft_engine_dir`, `draft_export_dir`),
    for medusa the heads stage's output (`heads_dir`), for eagle the eagle stage's
    (`eagle_dir`)."""
    engine = engine_files(export_dir, engine_dir)
    report = {}
    if perplexity_windows is not None:
        report["perplexity"] = _perplexity(source_path, ir_dir, engine, perplexity_windows)
    if speculative is not None:
        if cfg is None or max_seq_len is None:
            raise ValueError("measuring speculation needs the model's config and max_seq_len")
        draft = None
        if draft_engine_dir is not None and draft_export_dir is not None:
            draft = engine_files(draft_export_dir, draft_engine_dir)
        report["speculative"] = measure_speculation(
            speculative,
            engine,
            _drafter(speculative.method.method, draft, heads_dir, eagle_dir),
            source_path / "tokenizer.json",
            max_seq_len=max_seq_len,
            sliding_window=cfg.sliding_window,
            vocab_size=cfg.vocab_size,
            eos_token_ids=tuple(cfg.eos_token_ids),
        )
        gc.collect()
    builder = ENGINE_BUILDERS.get(engine.engine.engine)
    label = builder.describe(engine.engine.model_dump(mode="json"), engine_dir)
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    (out / "report.md").write_text(render_markdown(report, label))


def engine_files(export_dir: Path, engine_dir: Path) -> EngineFiles:
    """An engine stage's output as the runtime opens it (runtime/loader.py): the graph
    interface of the export it was built from, its record and its engine file."""
    graph = GraphInfo.model_validate(json.loads((export_dir / GRAPH_INFO).read_text()))
    record = json.loads((engine_dir / ENGINE_RECORD).read_text())
    path = engine_dir / Path(record["path"]).name
    return EngineFiles(graph, EngineInfo.model_validate(record), path)


def _drafter(
    method: str, draft: EngineFiles | None, heads_dir: Path | None, eagle_dir: Path | None
) -> DrafterFiles:
    """What `method` drafts with, from the stage outputs (a manifest's `speculative` names
    the same files once packaged: manifest_fields.py)."""
    if method == "draft_model":
        if draft is None:
            raise ValueError("speculative method draft_model: no draft engine to measure")
        return DrafterFiles(draft=draft)
    if method == "medusa":
        if heads_dir is None:
            raise ValueError("speculative method medusa: no heads graph to measure")
        return DrafterFiles(heads=heads_dir / HEADS_MODEL)
    if method == "eagle":
        if eagle_dir is None:
            raise ValueError("speculative method eagle: no EAGLE-3 draft to measure")
        record = json.loads((eagle_dir / EAGLE_RECORD).read_text())
        paths = {"method": "eagle", "path": EAGLE_MODEL, "fc_path": EAGLE_FC}
        return DrafterFiles(eagle=(eagle_dir, EagleInfo.model_validate({**record, **paths})))
    return DrafterFiles()


def _perplexity(source_path: Path, ir_dir: Path, engine: EngineFiles, evaluation: EvalWindows):
    windows, spec = evaluation.windows, evaluation.spec
    # One model in memory at a time: evaluation must not double the build's peak.
    model = load_model(source_path)
    original = perplexity(model, windows)
    del model
    gc.collect()
    model = load_ir(ir_dir)
    quantized = perplexity(model, windows)
    del model
    gc.collect()
    engine_ppl = engine_perplexity(engine, windows.numpy())
    gc.collect()
    return perplexity_report(
        dataset=spec.dataset,
        dataset_sha256=evaluation.digest,
        seq_len=spec.seq_len,
        windows=int(windows.shape[0]),
        original=original,
        quantized=quantized,
        engine=engine_ppl,
        engine_name=engine.engine.name,
        # The report's field since ONNX Runtime was the only engine (None for an engine
        # without MatMulNBits levels); report.md describes the engine through its plug-in.
        matmul_accuracy_level=engine.engine.build.get("matmul_accuracy_level"),
    )
