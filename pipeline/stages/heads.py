"""Stage: Medusa heads (speculative.method: medusa), trained against the quantize stage's IR
on the calibration windows or attached from a checkpoint, exported to ONNX and checked.

Writes ``model.onnx`` + ``model.onnx.data`` (the graph the artifact ships under draft/heads/),
``vllm/`` (the heads in vLLM's Medusa layout: config.json + model.safetensors) and
``heads.json`` (origin, sizes, the training report, the graph's check).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from ingot.calibration.dataset import CalibrationSet

from ..heads.attach import AttachedHeads, load_attached
from ..heads.export import DATA_FILE, MODEL_FILE, check_heads, export_heads
from ..heads.train import final_hidden, train_heads
from ..model.medusa import MedusaHeadsModel, save_medusa
from ..quantize.ir_layers import IRLayers
from ..recipe import MedusaHeads, Recipe
from .calibrate import Calibrated
from .quantize import QuantizeOutput
from .stage import Input, Stage, StageJob, StageOutput

__all__ = ["HeadsOutput", "heads_stage", "run_heads"]

_CHECK_ROWS = 64  # hidden states the graph is checked on


@dataclass(frozen=True, slots=True)
class HeadsOutput(StageOutput):
    """``model.onnx`` + ``model.onnx.data`` (the heads' graph: what the artifact ships),
    ``vllm/`` (the heads in vLLM's layout) and ``heads.json`` (origin, sizes, training,
    check)."""

    GRAPH: ClassVar[str] = MODEL_FILE
    SHIPPED: ClassVar[tuple[str, ...]] = (MODEL_FILE, DATA_FILE)
    VLLM: ClassVar[str] = "vllm"
    RECORD: ClassVar[str] = "heads.json"

    @property
    def graph(self) -> Path:
        return self.dir / self.GRAPH

    def record(self) -> dict[str, Any]:
        return self._json(self.RECORD)


def heads_stage(
    recipe: Recipe,
    quantize: Stage[QuantizeOutput],
    calibrated: Calibrated | None,
    attached: AttachedHeads | None,
) -> Stage[HeadsOutput]:
    """The Medusa heads stage: attached heads keyed by their files' digest, trained ones by
    the quantized target and the calibration windows they learn on (resumable)."""
    spec = recipe.speculative.heads
    # The attach path is not in the key (its files' digest is): moving the checkpoint is free.
    key_slice: dict[str, Any] = {"heads": spec.model_dump(mode="json", exclude={"attach"})}
    if attached is not None:
        return Stage(
            "heads",
            HeadsOutput,
            key_slice,
            {"attach": attached.digest},
            lambda job: run_heads(spec, job.out, attached=attached),
        )
    if calibrated is None:
        raise ValueError("heads: training needs the calibrate stage")
    key_slice["calibration"] = calibrated.key_slice
    inputs: dict[str, Input] = {"quantize": quantize, **calibrated.inputs()}
    c = calibrated.stage

    def train(job: StageJob) -> None:
        ir_dir, c_dir = job[quantize].dir, job[c].dir
        run_heads(spec, job.out, ir_dir=ir_dir, calibration_dir=c_dir, work_dir=job.work)

    return Stage("heads", HeadsOutput, key_slice, inputs, train, resumable=True)


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
    save_medusa(heads, out / HeadsOutput.VLLM)
    export_heads(heads, out)
    check = check_heads(heads, out / HeadsOutput.GRAPH, rows)
    record = {
        "origin": "train" if spec.train is not None else "attach",
        **_sizes(heads),
        "training": training,
        "check": check,
    }
    (out / HeadsOutput.RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _sizes(heads: MedusaHeadsModel) -> dict[str, int]:
    cfg = heads.cfg
    return {
        "num_heads": cfg.num_heads,
        "num_layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
    }
