"""pipeline/interop: the quantized IR written as checkpoints other engines load unchanged
(GPTQ v1, AWQ GEMM, compressed-tensors pack-quantized, llama.cpp's GGUF), into the artifact's
interop/."""

from __future__ import annotations

from pathlib import Path

from .checks import interop_problems
from .errors import InteropError

__all__ = ["FORMATS", "InteropError", "interop_problems", "write_interop"]

FORMATS = ("gptq", "awq", "compressed-tensors", "gguf")


def write_interop(fmt: str, ir_dir: Path, source: Path, out: Path) -> None:
    """Write the quantize stage's IR (`ir_dir`) as a `fmt` checkpoint directory `out`."""
    from ..quantize.checkpoint import load_ir
    from .awq import write_awq
    from .compressed_tensors import write_compressed_tensors
    from .gguf import write_gguf
    from .gptq import write_gptq

    writers = {
        "gptq": write_gptq,
        "awq": write_awq,
        "compressed-tensors": write_compressed_tensors,
        "gguf": write_gguf,
    }
    if fmt not in writers:
        raise InteropError(f"interop: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    writers[fmt](load_ir(ir_dir), source, out)
