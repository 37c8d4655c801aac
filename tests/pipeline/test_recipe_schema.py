"""The checked-in recipes/recipe.schema.json must be what the models generate (CI catches drift)."""

from __future__ import annotations

import json
from pathlib import Path

from ingot.pipeline.recipe import recipe_json_schema

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "recipes" / "recipe.schema.json"
REGENERATE = "ingot schema > recipes/recipe.schema.json"


def test_schema_file_is_in_sync_with_models() -> None:
    generated = json.dumps(recipe_json_schema(), indent=2, sort_keys=True) + "\n"
    assert SCHEMA_FILE.read_text() == generated, (
        f"schema out of date; regenerate with:\n{REGENERATE}"
    )


def test_every_field_is_documented() -> None:
    schema = recipe_json_schema()
    models = {"Recipe": schema, **schema["$defs"]}
    undocumented = [
        f"{model}.{field}"
        for model, definition in models.items()
        for field, prop in definition.get("properties", {}).items()
        if not prop.get("description")
    ]
    assert undocumented == []
    assert all(definition.get("description") for definition in models.values())


def test_schema_forbids_unknown_keys() -> None:
    schema = recipe_json_schema()
    models = {"Recipe": schema, **schema["$defs"]}
    assert all(definition["additionalProperties"] is False for definition in models.values())
