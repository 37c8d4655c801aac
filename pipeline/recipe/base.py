"""What every recipe section shares: the strict base model and the JSON Schema dialect.

Every model forbids unknown keys (a typo must not silently fall back to a default) and is strict
(YAML already gives typed values, so "4" for `bits` is a mistake, not something to coerce).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["JSON_SCHEMA_DIALECT"]

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
