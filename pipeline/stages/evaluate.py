"""Stage: perplexity of the original model, the quantized IR and the engine that ships, on the
same token windows.

The original and the IR are scored in torch; the engine (the artifact's first target, the
engine stage's output) through ONNX Runtime as the runtime runs it (`evaluate/engine.py`), so
an engine whose MatMulNBits quantize activations to int8 is measured as it will serve.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import torch

from ..evaluate.engine import engine_perplexity
from ..evaluate.perplexity import perplexity
from ..evaluate.report import perplexity_report, render_markdown
from ..model.load import load_model
from ..quantize.checkpoint import load_ir
from ..recipe import Perplexity
from .engine import ENGINE_RECORD

__all__ = ["run_evaluate"]


def run_evaluate(
    source_path: Path,
    ir_dir: Path,
    engine_dir: Path,
    windows: torch.Tensor,
    spec: Perplexity,
    dataset_sha256: str,
    out: Path,
) -> None:
    """Write report.json and report.md (measurements only: the gate is the build's call, so
    changing `max_delta` re-uses this stage)."""
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
    report = {
        "perplexity": perplexity_report(
            dataset=spec.dataset,
            dataset_sha256=dataset_sha256,
            seq_len=spec.seq_len,
            windows=int(windows.shape[0]),
            original=original,
            quantized=quantized,
            engine=engine,
            engine_name=record["name"],
            matmul_accuracy_level=record["build"]["matmul_accuracy_level"],
        )
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    (out / "report.md").write_text(render_markdown(report))
