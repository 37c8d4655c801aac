"""auto_precision.py's scores of one built row (imported by its measuring half only: torch):
the IR's KL from the float model and its perplexity on the held-out windows, its KL on the
calibration windows, the stored bytes (the graph's decoder-layer weights, the artifact's
files), the mix of candidates, and the KL the search's sensitivities predict for that mix
(their sum)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from benchmarks.quantize.scoring import eval_windows
from ingot.calibration.dataset import CalibrationSet
from ingot.pipeline.evaluate import perplexity
from ingot.pipeline.evaluate.kl import kl_sum
from ingot.pipeline.model.architecture import linear_names, linear_shape
from ingot.pipeline.model.load import load_model
from ingot.pipeline.quantize.checkpoint import load_ir

__all__ = ["Scorer", "layer_weight_bytes"]

_LAYERS = ("layers.",)


class Scorer:
    """The float model and the held-out windows of one checkpoint."""

    def __init__(
        self,
        checkpoint: Path,
        eval_text: Path,
        max_windows: int | None,
        candidates: list[dict[str, Any]],
    ) -> None:
        self.keys = [_key(c) for c in candidates]  # the search's columns, in order
        self.measurement: Path | None = None  # precision.json of the last auto row
        self.reference = load_model(checkpoint).eval()
        windows, _ = eval_windows(checkpoint, eval_text, max_windows)
        self.windows = torch.as_tensor(windows)

    def score(self, result: Any, cache: Any) -> dict[str, Any]:
        runs = {run.stage: run.key for run in result.stages}
        if "precision" in runs:  # an auto row: its measurement, for every row's prediction
            self.measurement = cache.path("precision", runs["precision"]) / "precision.json"
        quantize = cache.path("quantize", runs["quantize"])
        ir = load_ir(quantize).eval()
        ppl, kl = self._heldout(ir)
        calibration = CalibrationSet.load(cache.path("calibrate", runs["calibrate"]))
        manifest = json.loads((result.artifact / "manifest.json").read_text())
        [record] = manifest["model"]["quantization"]
        resolved = record.get("resolved", [record])  # a uniform row: its one entry
        layer_bytes = layer_weight_bytes(result.artifact / "model.onnx")
        weights = sum(n * k for n, k in _shapes(ir))
        return {
            "windows": int(self.windows.shape[0]),
            "stored_bits": 8 * layer_bytes / weights,
            "layer_bytes": layer_bytes,
            "artifact_bytes": sum(f["size"] for f in manifest["files"]),
            "kl": kl,
            "perplexity": ppl,
            "kl_calib": self._kl(ir, calibration.tokens),
            "mix": ", ".join(_describe(r) for r in resolved),
            "predicted_kl_calib": self.predicted(
                {m: _key(r) for r in resolved for m in _modules(r, ir)}
            ),
        }

    def predicted(self, modules: dict[str, tuple]) -> float:
        """The sum of the units' measured KLs (the last auto row's precision stage: each unit
        alone, on the calibration windows) under the candidate each module got ({module: its
        key})."""
        [measured] = json.loads(self.measurement.read_text()).values()
        total = 0.0
        for unit, kls in zip(measured["units"], measured["kl"], strict=True):
            [key] = {modules[m] for m in unit}  # a unit takes one candidate
            total += kls[self.keys.index(key)]
        return total

    def _heldout(self, ir: Any) -> tuple[float, float]:
        """(perplexity, mean KL per predicted token) on the held-out windows."""

        kl = [0.0, 0]

        def forward(batch: torch.Tensor) -> tuple[torch.Tensor]:
            logits = ir(batch)[0]
            reference = self.reference(batch)[0]
            v = logits.shape[-1]
            scored = (reference[:, :-1].reshape(-1, v), logits[:, :-1].reshape(-1, v))
            kl[0] += kl_sum(*(t.float().numpy() for t in scored))
            kl[1] += scored[0].shape[0]
            return (logits,)

        with torch.inference_mode():
            ppl = perplexity(forward, self.windows)
        return ppl, kl[0] / kl[1]

    def _kl(self, ir: Any, tokens: np.ndarray) -> float:
        """Mean KL per token over every position of the calibration windows (as the search
        measured)."""

        total, count = 0.0, 0
        with torch.inference_mode():
            for batch in torch.as_tensor(tokens).split(8):
                logits, reference = ir(batch)[0], self.reference(batch)[0]
                v = logits.shape[-1]
                total += kl_sum(
                    reference.reshape(-1, v).float().numpy(), logits.reshape(-1, v).float().numpy()
                )
                count += batch.numel()
        return total / count


def _key(entry: dict[str, Any]) -> tuple:
    return (entry["method"], entry["bits"], entry["group_size"])


def _describe(record: dict[str, Any]) -> str:
    group = "per channel" if record["group_size"] == -1 else f"g{record['group_size']}"
    return f"W{record['bits']} {group} x{record['modules']}"


def _modules(record: dict[str, Any], ir: Any) -> list[str]:
    """The modules a record's entry quantized: its exact targets (auto's resolved entries),
    or every decoder-layer linear (a uniform row's one entry)."""
    if all(not t.startswith("re:") for t in record["targets"]):
        return record["targets"]

    return [m for m in linear_names(ir.cfg) if m.startswith(_LAYERS)]


def _shapes(ir: Any) -> list[tuple[int, int]]:

    return [linear_shape(ir.cfg, m) for m in linear_names(ir.cfg) if m.startswith(_LAYERS)]


def layer_weight_bytes(graph: Path) -> int:
    """Bytes of the decoder layers' linear weights (codes, scales, zero points) in the graph."""

    model = onnx.load(str(graph), load_external_data=False)
    total = 0
    for tensor in model.graph.initializer:
        if re.match(r"layers\.\d+\.(attn|mlp)\.", tensor.name):
            lengths = [int(e.value) for e in tensor.external_data if e.key == "length"]
            total += sum(lengths) if lengths else len(tensor.raw_data)
    return total
