"""`--speculative-config`, shared by `ingot generate` and `ingot serve`: vLLM's JSON."""

from __future__ import annotations

import json
from typing import Any

import click

__all__ = ["SPECULATIVE_HELP", "SpeculativeConfigParam"]

SPECULATIVE_HELP = (
    'Speculative decoding as vLLM takes it, e.g. \'{"method": "ngram", '
    '"num_speculative_tokens": 4, "prompt_lookup_max": 4}\' (method draft_model needs an '
    "artifact built with a draft, medusa one built with heads, eagle one built with an EAGLE-3 "
    "draft); keys given override the "
    "artifact's recipe; `off` disables it. Default: the artifact's recipe (none unless it has "
    "a speculative section)."
)


class SpeculativeConfigParam(click.ParamType):
    """A JSON object (a dict) or `off` (False)."""

    name = "json|off"

    def convert(self, value, param, ctx) -> dict[str, Any] | bool | None:
        if value is None or isinstance(value, dict | bool):
            return value
        if str(value).strip().lower() == "off":
            return False
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as e:
            self.fail(f"not JSON ({e.msg}): {value!r}", param, ctx)
        if not isinstance(parsed, dict):
            self.fail(f"must be a JSON object, got {value!r}", param, ctx)
        return parsed
