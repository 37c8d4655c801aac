"""The `interop` section: extra checkpoint formats written for other engines.

Whether the quantized model fits a format is checked against the source model in
`ingot.pipeline.interop.checks`.
"""

from __future__ import annotations

from typing import Literal

from pydantic_core import PydanticCustomError

__all__ = ["InteropFormat"]


InteropFormat = Literal["gptq", "awq", "compressed-tensors", "gguf"]


def _check_unique_formats(formats: list[str]) -> list[str]:
    repeated = sorted({f for f in formats if formats.count(f) > 1})
    if repeated:
        raise PydanticCustomError(
            "duplicate_format", "{formats} listed more than once", {"formats": repeated}
        )
    return formats
