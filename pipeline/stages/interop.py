"""Stage: the quantize stage's IR written as a checkpoint another engine loads unchanged
(`interop.write_interop`), one stage per format the recipe's `interop` lists.

Keyed on the IR and the source (the writers copy its tokenizer and config files); a format
that stores a KV cache scheme (compressed-tensors with an fp8 KV cache) also on the export
stage's K/V scales, not on its whole graph: a graph change that leaves the scales alone
re-keys nothing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..interop import write_interop
from ..interop.kv_scheme import KV_SCHEME_FORMATS
from ..model.kv_quant import KVScales
from ..recipe import Recipe
from .export import ExportOutput
from .quantize import QuantizeOutput
from .stage import Input, Part, Stage, StageJob, StageOutput

__all__ = ["InteropOutput", "interop_stage", "kv_scales_digest"]


@dataclass(frozen=True, slots=True)
class InteropOutput(StageOutput):
    """The checkpoint directory, shipped as is under interop/<format>/: ``config.json`` (with
    its `quantization_config`), the weights, the tokenizer files."""

    CONFIG: ClassVar[str] = "config.json"

    def quantization_config(self) -> dict[str, Any]:
        """config.json's `quantization_config`: the manifest's interop entry records it."""
        return self._json(self.CONFIG)["quantization_config"]


def interop_stage(
    fmt: str,
    recipe: Recipe,
    quantize: Stage[QuantizeOutput],
    export: Stage[ExportOutput],
    source: Path,
    source_digest: str,
) -> Stage[InteropOutput]:
    """The `fmt` checkpoint of the target's IR (`source`: its checkpoint, for the tokenizer
    and config files)."""
    inputs: dict[str, Input] = {"quantize": quantize, "source": source_digest}
    stores_kv = recipe.kv_cache.quantized and fmt in KV_SCHEME_FORMATS
    if stores_kv:
        inputs["kv_scales"] = Part(export, _scales_digest)

    def produce(job: StageJob) -> None:
        scales = job[export].kv_scales() if stores_kv else None
        write_interop(fmt, job[quantize].dir, source, job.out, kv_scales=scales)

    return Stage(f"interop:{fmt}", InteropOutput, {"interop": fmt}, inputs, produce)


def _scales_digest(export: ExportOutput) -> str:
    scales = export.kv_scales()
    if scales is None:
        raise ValueError(f"interop: {export.dir} has no K/V scales to store")
    return kv_scales_digest(scales)


def kv_scales_digest(scales: KVScales) -> str:
    """sha256 of the scales and their dtype: what an interop stage that stores them is keyed
    on (not the whole export: a graph change that leaves the scales alone re-keys nothing)."""
    blob = json.dumps({"dtype": scales.dtype, **scales.to_json()}, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()
