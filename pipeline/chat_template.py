"""The chat template a source checkpoint ships, read by the stages that need it (calibrate
renders chat-shaped calibration data with it, package copies it into the artifact), and the one
a recipe names (`artifact.chat_template`), which the package stage ships instead."""

from __future__ import annotations

import json
from pathlib import Path

from ingot.runtime.tokenizer import ChatTemplateError, check_chat_template

from .recipe import Recipe, RecipeError

__all__ = ["chat_template_of", "recipe_chat_template"]


def chat_template_of(source: Path) -> str | None:
    """The checkpoint's chat template: chat_template.jinja, else tokenizer_config.json's."""
    if (source / "chat_template.jinja").is_file():
        return (source / "chat_template.jinja").read_text()
    cfg_file = source / "tokenizer_config.json"
    template = json.loads(cfg_file.read_text()).get("chat_template") if cfg_file.is_file() else None
    if isinstance(template, list):  # named templates: the default one is what chat uses
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template


def recipe_chat_template(recipe: Recipe, recipe_path: Path) -> str | None:
    """The text of `artifact.chat_template`, resolved against the recipe's directory like
    source.path and checked to compile where the runtime renders it; None if not set. A
    missing, unreadable or broken template is a RecipeError, before any stage runs."""
    if recipe.artifact.chat_template is None:
        return None
    where = f"{recipe_path}: artifact.chat_template"
    file = recipe_path.absolute().parent / Path(recipe.artifact.chat_template).expanduser()
    try:
        source = file.read_text(encoding="utf-8")
        check_chat_template(source)
    except FileNotFoundError:
        raise RecipeError([f"{where}: {file}: no such file"]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise RecipeError([f"{where}: {file}: cannot read it: {e}"]) from None
    except ChatTemplateError as e:
        raise RecipeError([f"{where}: {file}: {e}"]) from None
    return source
