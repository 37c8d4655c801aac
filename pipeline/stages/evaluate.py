"""Stage: perplexity of the original model, the quantized IR and the engine that ships, on the
same token windows; and the mean accepted length of the recipe's speculative decoding.

The original and the IR are scored in torch; the engine (the artifact's first target, the
engine stage's output) through ONNX Runtime as the runtime runs it (`evaluate/engine.py`), so
an engine whose MatMulNBits quantize activations to int8 is measured as it will serve.
Speculation runs through the runtime's own Generator on that engine (and the draft model's
engine of the same name), `evaluate/speculative.py`.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

from ..evaluate.engine import engine_perplexity
from ..evaluate.perplexity import perplexity
from ..evaluate.report import perplexity_report, render_markdown
from ..evaluate.speculative import SpeculativePrompts, measure_speculation
from ..evaluate.windows import EvalWindows
from ..heads.export import MODEL_FILE as HEADS_MODEL
from ..model.config import ModelConfig
from ..model.load import load_model
from ..quantize.checkpoint import load_ir
from .engine import ENGINE_RECORD

__all__ = ["run_evaluate"]


def run_evaluate(
    out: Path,
    *,
    source_path: Path,
    ir_dir: Path,
    engine_dir: Path,
    perplexity_windows: EvalWindows | None = None,
    speculative: SpeculativePrompts | None = None,
    draft_engine_dir: Path | None = None,
    heads_dir: Path | None = None,
    eagle_dir: Path | None = None,
    cfg: ModelConfig | None = None,
    max_seq_len: int | None = None,
) -> None:
    """Write report.json and report.md (measurements only: the gates are the build's call, so
    changing `max_delta` or `min_accepted_length` re-uses this stage). `speculative` needs the
    model's `cfg` and the exported `max_seq_len`, for draft_model the draft's engine stage
    output of the first target's name (`draft_engine_dir`), for medusa the heads stage's output
    (`heads_dir`), for eagle the eagle stage's (`eagle_dir`)."""
    report = {}
    if perplexity_windows is not None:
        report["perplexity"] = _perplexity(source_path, ir_dir, engine_dir, perplexity_windows)
    if speculative is not None:
        if cfg is None or max_seq_len is None:
            raise ValueError("measuring speculation needs the model's config and max_seq_len")
        report["speculative"] = measure_speculation(
            speculative,
            engine_dir,
            draft_engine_dir,
            source_path / "tokenizer.json",
            max_seq_len=max_seq_len,
            sliding_window=cfg.sliding_window,
            vocab_size=cfg.vocab_size,
            eos_token_ids=tuple(cfg.eos_token_ids),
            heads_file=heads_dir / HEADS_MODEL if heads_dir is not None else None,
            eagle_dir=eagle_dir,
        )
        gc.collect()
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    (out / "report.md").write_text(render_markdown(report))


def _perplexity(source_path: Path, ir_dir: Path, engine_dir: Path, evaluation: EvalWindows):
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
    record = json.loads((engine_dir / ENGINE_RECORD).read_text())
    engine_file = engine_dir / Path(record["path"]).name
    engine = engine_perplexity(engine_file, record["session_options"], windows.numpy())
    gc.collect()
    return perplexity_report(
        dataset=spec.dataset,
        dataset_sha256=evaluation.digest,
        seq_len=spec.seq_len,
        windows=int(windows.shape[0]),
        original=original,
        quantized=quantized,
        engine=engine,
        engine_name=record["name"],
        matmul_accuracy_level=record["build"]["matmul_accuracy_level"],
    )
