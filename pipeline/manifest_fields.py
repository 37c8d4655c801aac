"""The manifest's fields from what the stages wrote: the model, graph and engine records of
the target, and of a draft model under `speculative.draft`; the recipe as written; eval and
interop. The build hands them to `write_manifest` (through `run_package`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .heads.eagle_export import FC_FILE as EAGLE_FC
from .heads.eagle_export import MODEL_FILE as EAGLE_MODEL
from .heads.export import MODEL_FILE as HEADS_MODEL
from .model.config import ModelConfig
from .recipe import Recipe
from .stages.eagle import EAGLE_RECORD
from .stages.export import GRAPH_INFO
from .stages.heads import HEADS_RECORD
from .stages.package import DRAFT_DIR, EAGLE_DIR, HEADS_DIR

__all__ = ["Compiled", "eval_and_interop_fields", "manifest_fields", "speculative_fields"]


@dataclass(slots=True)
class Compiled:
    """What one model's stages wrote: the IR, the exported graph, an engine per target."""

    quantize_dir: Path
    quantize_digest: str
    export_dir: Path
    engine_dirs: dict[str, Path] = field(default_factory=dict)
    engine_digests: dict[str, str] = field(default_factory=dict)
    records: list[dict] = field(default_factory=list)  # engine.json, in target order
    checks: list[dict] = field(default_factory=list)  # check.json, in target order
    calibrated: tuple[Path, str] | None = None  # the calibrate stage's (directory, digest)


def manifest_fields(
    recipe: Recipe, recipe_path: Path, cfg: ModelConfig, target: Compiled
) -> dict[str, Any]:
    """Every manifest field the target's stages decide (all but eval's measurements, interop,
    speculative, tokenizer's template, lock and files)."""
    return {
        "format": "ingot.artifact",
        "format_version": 1,
        "name": recipe.artifact.name,
        "version": recipe.artifact.version,
        "recipe": _recipe_as_written(recipe, recipe_path),
        "model": _model_fields(recipe, cfg, target.quantize_dir),
        "tokenizer": {"path": "tokenizer.json", "bos_token": None, "eos_token": None},
        "graph": json.loads((target.export_dir / GRAPH_INFO).read_text()),
        "engines": [
            _engine_entry(r, c) for r, c in zip(target.records, target.checks, strict=True)
        ],
        "eval": {"export_check": target.checks[0]},
    }


def _model_fields(recipe: Recipe, cfg: ModelConfig, q_dir: Path) -> dict:
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
        "bos_token_id": cfg.bos_token_id,
        "eos_token_ids": list(cfg.eos_token_ids),
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "quantization": json.loads((q_dir / "quantize.json").read_text()),
    }


def speculative_fields(
    recipe: Recipe,
    draft: ModelConfig | None,
    drafted: Compiled | None,
    heads_dir: Path | None = None,
    eagle_dir: Path | None = None,
) -> dict[str, Any]:
    """The manifest's `speculative`: the recipe's section, for draft_model the draft's model
    (of config `draft`), graph interface and engines under draft/ (its graph's path is its
    first engine's: no portable graph of the draft is shipped), for medusa the heads (the
    heads stage's record in ``heads_dir``) under draft/heads/, for eagle the EAGLE-3 draft (the
    eagle stage's record in ``eagle_dir``) under draft/eagle/."""
    fields = recipe.speculative.model_dump(mode="json", exclude={"draft", "heads"})
    if eagle_dir is not None:
        record = json.loads((eagle_dir / EAGLE_RECORD).read_text())
        fields["eagle"] = {
            "method": "eagle",
            **record,
            "path": f"{EAGLE_DIR}{EAGLE_MODEL}",
            "fc_path": f"{EAGLE_DIR}{EAGLE_FC}",
        }
    if heads_dir is not None:
        record = json.loads((heads_dir / HEADS_RECORD).read_text())
        fields["heads"] = {
            "method": "medusa",
            **{k: record[k] for k in ("num_heads", "num_layers", "hidden_size", "vocab_size")},
            "origin": record["origin"],
            "path": f"{HEADS_DIR}{HEADS_MODEL}",
            "training": record["training"],
            "check": record["check"],
        }
    if draft is None or drafted is None:
        return fields
    engines = [
        _engine_entry(r, c, root=DRAFT_DIR)
        for r, c in zip(drafted.records, drafted.checks, strict=True)
    ]
    graph = json.loads((drafted.export_dir / GRAPH_INFO).read_text())
    fields["draft"] = {
        "model": _model_fields(recipe, draft, drafted.quantize_dir),
        "graph": {**graph, "path": engines[0]["path"]},
        "engines": engines,
    }
    return fields


def _engine_entry(record: dict, check: dict, root: str = "") -> dict:
    """The manifest's engine entry: the stage's record, its path inside the artifact (under
    ``root``: "" for the target, "draft/" for the draft), and the check of that engine against
    the IR under ``build.check`` (the entry's schema admits no new top-level field; ``build``
    is free-form and informational)."""
    return {
        **record,
        "path": f"{root}engines/{record['name']}/{Path(record['path']).name}",
        "build": {**record["build"], "check": check},
    }


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
    checks: list[dict], eval_fields: dict[str, Any], extra_dirs: dict[str, Path]
) -> dict[str, Any]:
    """`eval` (the first engine's check, plus ``eval_fields``) and `interop` (one entry per
    ``interop/<format>`` of ``extra_dirs``)."""
    interop = [
        {
            "format": rel.removeprefix("interop/"),
            "path": rel,
            "quantization_config": json.loads((d / "config.json").read_text())[
                "quantization_config"
            ],
        }
        for rel, d in extra_dirs.items()
        if rel.startswith("interop/")
    ]
    # eval.export_check: the first engine's check (the engine preferred at load time); every
    # engine's own is in its record (engines[i].build.check).
    return {"eval": {"export_check": checks[0], **eval_fields}, "interop": interop}
