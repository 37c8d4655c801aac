"""pipeline/interop: the quantized IR written as checkpoints other engines load unchanged
(GPTQ v1, AWQ GEMM, compressed-tensors: pack-quantized, int-quantized W8A8, float-quantized
FP8; llama.cpp's GGUF), into the artifact's interop/. The build runs `write_interop` as one
stage per format (`stages/interop.py`); the recipe's checks read `interop_problems`."""

from __future__ import annotations

from pathlib import Path

from ..model.kv_quant import KVScales
from ..quantize.checkpoint import load_ir
from .awq import write_awq
from .checks import interop_problems
from .compressed_tensors import write_compressed_tensors
from .errors import InteropError
from .gguf import write_gguf
from .gptq import write_gptq

__all__ = ["FORMATS", "InteropError", "interop_problems", "write_interop"]

_WRITERS = {
    "gptq": write_gptq,
    "awq": write_awq,
    "compressed-tensors": write_compressed_tensors,
    "gguf": write_gguf,
}
FORMATS = tuple(_WRITERS)


def write_interop(
    fmt: str, ir_dir: Path, source: Path, out: Path, *, kv_scales: KVScales | None = None
) -> None:
    """Write the quantize stage's IR (`ir_dir`) as a `fmt` checkpoint directory `out`.

    compressed-tensors also stores an fp8 KV cache's scales (`kv_scales`: the export stage's
    calibrated ones); the other formats hold no KV cache scheme."""
    if fmt not in _WRITERS:
        raise InteropError(f"interop: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    if fmt == "compressed-tensors" and kv_scales is not None:
        write_compressed_tensors(load_ir(ir_dir), source, out, kv_scales)
        return
    _WRITERS[fmt](load_ir(ir_dir), source, out)
