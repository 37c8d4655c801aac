"""The `quantize` section: a list of passes, each an entry of one quantization method selecting
modules by pattern.

The entry models are the methods' own (`QuantMethod.entry`, in pipeline/quantize/methods/ or
a plug-in distribution): `Quantize` is their union, discriminated by `method`, in the
registry's order, so an unknown method fails with the list of known ones.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter

from ..quantize.method import QUANT_METHODS, QuantEntry

__all__ = ["Quantize", "quantize_entry"]

Quantize = Annotated[
    Union[tuple(method.entry for method in QUANT_METHODS)],  # noqa: UP007 - built at run time
    Field(discriminator="method"),
]


def quantize_entry(data: dict[str, Any]) -> QuantEntry:
    """A quantize entry from its recipe form (`{"method": "rtn", "bits": 4, ...}`), validated
    as the recipe would: for code that quantizes without a recipe file (tests, benchmarks)."""
    return _ENTRY.validate_python(data)


_ENTRY: TypeAdapter[Quantize] = TypeAdapter(Quantize)
