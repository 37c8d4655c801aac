"""A built variant's quality and size, read from its artifact: the engine's mean per-token KL
to the original and its perplexity on the base recipe's evaluation text (the evaluate stage's
eval/report.json), its perplexity on the axes file's out-of-domain text (computed here, on the
same engine, through the runtime's loader), and the artifact's bytes on disk."""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ingot.artifacts import safe_relative_path, verify_artifact
from ingot.runtime.loader import EngineFiles

from ..evaluate.engine import engine_perplexity
from ..evaluate.perplexity import token_windows, tokenize
from ..evaluate.text import EvalText
from .recipes import VariantRecipe

__all__ = ["OodWindows", "Quality", "measure_quality"]

REPORT = Path("eval") / "report.json"


@dataclass(frozen=True, slots=True)
class Quality:
    kl: float  # the engine's mean KL(original || engine) per token, nats
    perplexity: float  # the engine's, on the base recipe's evaluation text
    perplexity_ood: float  # the engine's, on the out-of-domain text
    artifact_bytes: int  # every file of the artifact directory


class OodWindows:
    """The out-of-domain text's windows, [W, seq_len] int64, per (tokenizer, seq_len,
    max_windows) the variants use: tokenized once each, before any build (too short a text
    fails there)."""

    def __init__(self, text: EvalText, variants: list[VariantRecipe]) -> None:
        self._windows: dict[tuple, np.ndarray] = {}
        tokens: dict[Path, list[int]] = {}
        for v in variants:
            if v.error is None and _key(v) not in self._windows:
                ids = tokens.setdefault(v.tokenizer, tokenize(text.text, v.tokenizer))
                windows = token_windows(ids, v.seq_len, v.max_windows)
                self._windows[_key(v)] = windows.numpy()

    def of(self, variant: VariantRecipe) -> np.ndarray:
        return self._windows[_key(variant)]


def _key(v: VariantRecipe) -> tuple:
    return (v.tokenizer, v.seq_len, v.max_windows)


def measure_quality(artifact: Path, ood: np.ndarray) -> Quality:
    """The artifact's numbers (verified first); `ood` is its out-of-domain windows. The
    engine scored is the one its evaluate stage scored (the report names it)."""
    manifest = verify_artifact(artifact)
    report = json.loads((artifact / REPORT).read_text())["perplexity"]
    engine = next(e for e in manifest.engines if e.name == report["engine_name"])
    files = EngineFiles(
        manifest.graph,
        engine,
        safe_relative_path(artifact, engine.path),
        manifest.model.sliding_window,
    )
    perplexity_ood = engine_perplexity(files, ood)
    gc.collect()  # the engine's session, before the next variant's
    size = sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file())
    return Quality(report["engine_kl"], report["engine"], perplexity_ood, size)
