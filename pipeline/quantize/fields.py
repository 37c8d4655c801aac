"""The recipe fields that the entries of several quantization methods declare: module patterns
(`targets`, `ignore`) and the weight group size.

Each method's entry model (methods/*.py) declares its own fields, in its own order and with
its own defaults, from these types. Nothing here imports the recipe package: the recipe
assembles its `quantize` union from the plug-ins, which import this.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

__all__ = ["GROUP_SIZES", "GroupSize", "Ignore", "ModulePattern", "Targets"]


def _check_module_pattern(pattern: str) -> str:
    if pattern.startswith("re:"):
        try:
            re.compile(pattern[3:])
        except re.error as exc:
            raise PydanticCustomError(
                "bad_regex", "invalid regular expression: {reason}", {"reason": str(exc)}
            ) from None
    return pattern


ModulePattern = Annotated[
    str,
    Field(min_length=1),
    AfterValidator(_check_module_pattern),
]

GroupSize = Annotated[
    Literal[32, 64, 128, -1],
    Field(description="Input channels sharing one scale; -1 = one scale per output channel."),
]
# The group sizes a recipe may ask for besides -1: the Literal above, not a second copy.
GROUP_SIZES: tuple[int, ...] = tuple(g for g in get_args(get_args(GroupSize)[0]) if g > 0)

Targets = Annotated[
    list[ModulePattern],
    Field(
        min_length=1,
        description="Modules to quantize: IR module names (`layers.0.attn.q_proj`, `lm_head`) "
        "or regular expressions prefixed `re:` that must match the whole name.",
    ),
]
Ignore = Annotated[
    list[ModulePattern],
    Field(
        description="Modules to leave unquantized, even if `targets` selects them "
        "(same syntax as `targets`).",
    ),
]
