"""The manifest's fields from what the stages recorded: the model, graph and engine records of
the target, and of a draft model under `speculative.draft`; the recipe as written; eval and
interop. The package step reads the stage outputs and hands their records here, with the
paths it gives them in the artifact; this module reads no file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .engines.base import reads_graph, weights_engine
from .model.config import ModelConfig
from .recipe import Recipe

__all__ = [
    "ModelRecords",
    "eval_and_interop_fields",
    "manifest_fields",
    "speculative_fields",
]


@dataclass(frozen=True, slots=True)
class ModelRecords:
    """What one model's stages recorded: the quantize stage's summary, the export's graph
    interface, each engine's record and check (in target order), where its engines go in
    the artifact (`root`: "" for the target, "draft/" for a draft model) and whether its
    portable graph goes too (`portable`; engines/base.py `ships_portable`)."""

    quantization: Any
    graph: dict[str, Any]
    engines: list[dict[str, Any]] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    root: str = ""
    portable: bool = True


def manifest_fields(
    recipe: Recipe, recipe_path: Path, cfg: ModelConfig, target: ModelRecords
) -> dict[str, Any]:
    """Every manifest field the target's stages decide (all but eval's measurements, interop,
    speculative, tokenizer's template, lock and files)."""
    return {
        "format": "ingot.artifact",
        "format_version": 1,
        "name": recipe.artifact.name,
        "version": recipe.artifact.version,
        "recipe": _recipe_as_written(recipe, recipe_path),
        "model": _model_fields(recipe, cfg, target.quantization),
        "tokenizer": {"path": "tokenizer.json", "bos_token": None, "eos_token": None},
        "graph": _graph_entry(target),
        "engines": _engine_entries(target),
        "eval": {"export_check": target.checks[0]},
    }


def _model_fields(recipe: Recipe, cfg: ModelConfig, quantization: Any) -> dict:
    return {
        "architecture": cfg.architecture,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_layers": cfg.num_layers,
        "num_heads": cfg.num_heads,
        "num_kv_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "max_seq_len": recipe.export.max_seq_len,
        "sliding_window": cfg.sliding_window,
        "layer_windows": None if cfg.layer_windows is None else list(cfg.layer_windows),
        "bos_token_id": cfg.bos_token_id,
        "eos_token_ids": list(cfg.eos_token_ids),
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "quantization": quantization,
    }


def speculative_fields(
    recipe: Recipe,
    draft: tuple[ModelConfig, ModelRecords] | None = None,
    heads: dict[str, Any] | None = None,
    eagle: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest's `speculative`: the recipe's section, for draft_model the draft's model
    (`draft`: its config and records), graph interface and engines (its graph's path is its
    first engine's: no portable graph of the draft is shipped), for medusa the heads (`heads`:
    the heads stage's record with its graph's `path`), for eagle the EAGLE-3 draft (`eagle`:
    the eagle stage's record with its graphs' `path` and `fc_path`)."""
    fields = recipe.speculative.model_dump(mode="json", exclude={"draft", "heads"})
    if eagle is not None:
        fields["eagle"] = {"method": "eagle", **eagle}
    if heads is not None:
        fields["heads"] = {
            "method": "medusa",
            **{k: heads[k] for k in ("num_heads", "num_layers", "hidden_size", "vocab_size")},
            "origin": heads["origin"],
            "path": heads["path"],
            "training": heads["training"],
            "check": heads["check"],
        }
    if draft is None:
        return fields
    cfg, records = draft
    engines = _engine_entries(records)
    fields["draft"] = {
        "model": _model_fields(recipe, cfg, records.quantization),
        "graph": {**records.graph, "path": engines[0]["path"]},
        "engines": engines,
    }
    return fields


def _graph_entry(model: ModelRecords) -> dict[str, Any]:
    """The graph interface; its path the portable graph's where the artifact ships it, else
    the first engine's file (as a draft model's)."""
    if model.portable:
        return model.graph
    return {**model.graph, "path": _engine_entries(model)[0]["path"]}


def _engine_entries(model: ModelRecords) -> list[dict[str, Any]]:
    """The manifest's engine entries: each stage's record, its path inside the artifact (under
    the model's root: its engine directory; for an engine built at load from the graph's
    weights, the engine file holding them, else the model's portable graph) with what else it
    reads (`_reads`), and the check of that engine against the IR under ``build.check`` (the
    entry's schema admits no new top-level field; ``build`` is free-form and informational)."""
    source = weights_engine(model.engines)
    return [
        {
            **record,
            "path": f"{model.root}{_engine_path(record, source)}",
            **_reads(record, source),
            "build": {**record["build"], "check": check},
        }
        for record, check in zip(model.engines, model.checks, strict=True)
    ]


def _engine_path(record: dict[str, Any], source: Mapping[str, Any] | None) -> str:
    if reads_graph(record):
        if source is not None:  # the weights' one copy: that engine's file
            return _engine_path(source, None)
        return record["path"]  # the model's portable graph, beside engines/
    return f"engines/{record['name']}/{Path(record['path']).name}"


def _reads(record: dict[str, Any], source: Mapping[str, Any] | None) -> dict[str, Any]:
    """{"reads": the file roles an engine built at load reads besides its own}: the engine
    holding the weights (``engine:<name>``), else ``portable``: what a pull for it fetches."""
    if not reads_graph(record):
        return {}
    return {"reads": [f"engine:{source['name']}" if source is not None else "portable"]}


def _recipe_as_written(recipe: Recipe, recipe_path: Path) -> dict[str, Any]:
    """The recipe for the manifest, with the source paths (the target's, a draft's) relative to
    the recipe file, so the artifact does not depend on where the checkout lives."""
    data = recipe.model_dump(mode="json")
    sources = [data["source"]]
    if recipe.draft() is not None:
        sources.append(data["speculative"]["draft"]["source"])
    base = recipe_path.resolve().parent
    for source in sources:
        if "path" in source and Path(source["path"]).is_relative_to(base):
            source["path"] = Path(source["path"]).relative_to(base).as_posix()
    return data


def eval_and_interop_fields(
    target: ModelRecords,
    eval_fields: dict[str, Any],
    interop: Mapping[str, tuple[str, dict[str, Any]]],
) -> dict[str, Any]:
    """`eval` (the first engine's check, plus ``eval_fields``: the gates' summaries) and
    `interop` (``interop``: {format: (its path in the artifact, its quantization_config)})."""
    entries = [
        {"format": fmt, "path": path, "quantization_config": config}
        for fmt, (path, config) in interop.items()
    ]
    # eval.export_check: the first engine's check (the engine preferred at load time); every
    # engine's own is in its record (engines[i].build.check).
    return {"eval": {"export_check": target.checks[0], **eval_fields}, "interop": entries}
