"""pipeline/interop: the quantized IR written as checkpoints other engines load unchanged
(GPTQ v1, AWQ GEMM, compressed-tensors: pack-quantized, int-quantized W8A8, float-quantized
FP8; llama.cpp's GGUF), into the artifact's interop/."""

from __future__ import annotations

from pathlib import Path

from .checks import interop_problems
from .errors import InteropError

__all__ = ["FORMATS", "InteropError", "interop_problems", "write_interop"]

FORMATS = ("gptq", "awq", "compressed-tensors", "gguf")


def write_interop(
    fmt: str, ir_dir: Path, source: Path, out: Path, *, export_dir: Path | None = None
) -> None:
    """Write the quantize stage's IR (`ir_dir`) as a `fmt` checkpoint directory `out`.

    compressed-tensors also stores an fp8 KV cache's scales, read from the export stage's
    `export_dir` (graph.json `kv_scales`); the other formats hold no KV cache scheme."""
    from ..quantize.checkpoint import load_ir
    from .awq import write_awq
    from .compressed_tensors import write_compressed_tensors
    from .gguf import write_gguf
    from .gptq import write_gptq
    from .kv_scheme import read_kv_scales

    writers = {
        "gptq": write_gptq,
        "awq": write_awq,
        "compressed-tensors": write_compressed_tensors,
        "gguf": write_gguf,
    }
    if fmt not in writers:
        raise InteropError(f"interop: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    if fmt == "compressed-tensors" and export_dir is not None:
        write_compressed_tensors(load_ir(ir_dir), source, out, read_kv_scales(export_dir))
        return
    writers[fmt](load_ir(ir_dir), source, out)
