"""The axes file: which recipe fields a sweep varies and their values, the out-of-domain text
its quality is also measured on, and the speed measurement's settings.

    axes:                               # dotted recipe paths; list indices are numbers
      quantize.0.method: [rtn, gptq]
      quantize.0.group_size: [32, 64]
      speculative: [null, {method: ngram}]
    variants:                           # optional: these combinations instead of the product
      - {quantize.0.method: rtn, quantize.0.group_size: 32, speculative: null}
    ood_text: ../data/other.txt         # relative to this file (or a Hub dataset id)
    speed: {rounds: 3, output_tokens: 32}

Strict like a recipe (unknown keys and wrong types are errors), one line per problem naming
the field; a value may be anything the recipe field takes (null, a mapping).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from ..recipe.base import _Strict
from ..recipe.errors import format_validation_error
from ..recipe.load import _UniqueKeyLoader
from .errors import SweepError

__all__ = ["Axes", "SpeedSettings", "canonical", "load_axes"]

# A dotted path: field names (a recipe's keys) and list indices (numbers).
_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.([A-Za-z_][A-Za-z0-9_]*|[0-9]+))*")


class SpeedSettings(_Strict):
    """`measure_speed`'s settings (pipeline/sweep/speed.py)."""

    rounds: int = Field(default=3, ge=1, description="Rounds, interleaved across variants.")
    prompt_tokens: int = Field(default=64, ge=1, description="Tokens per prompt.")
    output_tokens: int = Field(default=32, ge=1, description="Tokens generated per request.")
    concurrency: int = Field(default=32, ge=1, description="Requests at once (tok_s_batch32).")
    refuse_loaded: bool = Field(
        default=False, description="Refuse to time on a loaded host instead of reporting it."
    )


class Axes(_Strict):
    axes: dict[str, list[Any]] = Field(
        min_length=1, description="Dotted recipe path -> the values it takes."
    )
    variants: list[dict[str, Any]] | None = Field(
        default=None,
        min_length=1,
        description="Only these combinations (each gives every axis one of its values) "
        "instead of the product of the axes.",
    )
    ood_text: str = Field(
        min_length=1,
        description="Out-of-domain text for perplexity_ood: a local .txt / .jsonl / .parquet "
        "file relative to the axes file, or a Hub dataset id.",
    )
    ood_text_field: str = Field(default="text", min_length=1, description="Its text column.")
    ood_split: str = Field(default="train", min_length=1, description="Split of a Hub dataset.")
    speed: SpeedSettings = Field(default=SpeedSettings(), description="Speed measurement.")

    def combinations(self) -> list[dict[str, Any]]:
        """Every variant's {path: value}, in the file's order (the product's last axis
        varies fastest)."""
        if self.variants is not None:
            return [{path: v[path] for path in self.axes} for v in self.variants]
        combos: list[dict[str, Any]] = [{}]
        for path, values in self.axes.items():
            combos = [{**c, path: v} for c in combos for v in values]
        return combos


def load_axes(path: Path) -> Axes:
    """The axes file at `path`, validated; SweepError (one line per problem) otherwise."""
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except (OSError, UnicodeDecodeError) as e:
        raise SweepError(f"{path}: cannot read the axes file ({e})") from None
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise SweepError(f"{path}: an axes file is a mapping with an `axes:` section")
    try:
        axes = Axes.model_validate(data)
    except ValidationError as e:
        raise SweepError("; ".join(format_validation_error(e, str(path), Axes))) from None
    problems = [*_axis_problems(axes), *_variant_problems(axes)]
    if problems:
        raise SweepError("; ".join(f"{path}: {p}" for p in problems))
    return axes


def _axis_problems(axes: Axes) -> list[str]:
    problems = []
    for path, values in axes.axes.items():
        if not _PATH.fullmatch(path):
            problems.append(
                f"axes.{path}: not a dotted recipe path (field names and list indices, "
                "e.g. quantize.0.group_size)"
            )
        elif not values:
            problems.append(f"axes.{path}: no values (list at least one)")
        elif len({canonical(v) for v in values}) < len(values):
            problems.append(f"axes.{path}: a value is listed twice (got {values!r})")
    return problems


def _variant_problems(axes: Axes) -> list[str]:
    problems = []
    for i, variant in enumerate(axes.variants or []):
        for path in variant:
            if path not in axes.axes:
                problems.append(f"variants.{i}.{path}: not an axis (axes: {', '.join(axes.axes)})")
        for path, values in axes.axes.items():
            if path not in variant:
                problems.append(f"variants.{i}: gives no value for the axis {path}")
            elif canonical(variant[path]) not in {canonical(v) for v in values}:
                problems.append(
                    f"variants.{i}.{path}: {variant[path]!r} is not one of the axis's "
                    f"values {values!r}"
                )
    seen: dict[str, int] = {}
    for i, variant in enumerate(axes.variants or []):
        key = canonical(variant)
        if key in seen:
            problems.append(f"variants.{i}: the same combination as variants.{seen[key]}")
        seen.setdefault(key, i)
    return problems


def canonical(value: Any) -> str:
    """A value's identity for duplicate checks (mappings compare by content)."""
    return json.dumps(value, sort_keys=True, default=str)
