"""Stage: Medusa heads (speculative.method: medusa), trained against the quantize stage's IR
on the calibration windows or attached from a checkpoint, exported to ONNX and checked.

Writes ``model.onnx`` + ``model.onnx.data`` (the graph the artifact ships under draft/heads/),
``vllm/`` (the heads in vLLM's Medusa layout: config.json + model.safetensors) and
``heads.json`` (origin, sizes, the training report, the graph's check).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ingot.calibration.dataset import CalibrationSet

from ..heads.attach import AttachedHeads, load_attached
from ..heads.export import MODEL_FILE, check_heads, export_heads
from ..heads.train import final_hidden, train_heads
from ..model.medusa import MedusaHeadsModel, save_medusa
from ..quantize.ir_layers import IRLayers
from ..recipe import MedusaHeads

__all__ = ["run_heads", "HEADS_RECORD"]

HEADS_RECORD = "heads.json"
_CHECK_ROWS = 64  # hidden states the graph is checked on


def run_heads(
    spec: MedusaHeads,
    out: Path,
    *,
    attached: AttachedHeads | None = None,
    ir_dir: Path | None = None,
    calibration_dir: Path | None = None,
    work_dir: Path | None = None,
) -> None:
    """Train (``spec.train``: on ``ir_dir``'s model over ``calibration_dir``'s windows,
    checkpointing in ``work_dir``) or load (``attached``) the heads, then export and check."""
    training: dict[str, Any] | None = None
    if spec.train is not None:
        source = IRLayers(ir_dir)
        windows = torch.from_numpy(CalibrationSet.load(calibration_dir).tokens)  # [N, T]
        hidden = final_hidden(source, windows)  # [N, T, H]
        heads, training = train_heads(hidden, source.lm_head(), spec.train, work_dir)
        rows = hidden[-1][:_CHECK_ROWS]  # the last (held-out) window's positions
        del hidden
    else:
        heads = load_attached(attached)
        rows = torch.randn(
            _CHECK_ROWS, heads.cfg.hidden_size, generator=torch.Generator().manual_seed(0)
        )
    save_medusa(heads, out / "vllm")
    export_heads(heads, out)
    check = check_heads(heads, out / MODEL_FILE, rows)
    record = {
        "origin": "train" if spec.train is not None else "attach",
        **_sizes(heads),
        "training": training,
        "check": check,
    }
    (out / HEADS_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _sizes(heads: MedusaHeadsModel) -> dict[str, int]:
    cfg = heads.cfg
    return {
        "num_heads": cfg.num_heads,
        "num_layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
    }
