"""The speculation an artifact is served with: its recipe's default, or what the caller asks.

`resolve_config` merges a caller's vLLM-style dict over the artifact's record
(manifest.speculative) and checks that the artifact has what the method needs; `DraftModel.open`
opens the draft engine of a draft_model artifact on its own pool, with as many blocks as the
target's (the target's block tables address both). A medusa artifact's heads open with
`MedusaHeads.open` (medusa.py), an eagle artifact's draft layer and fc with `EagleDraft.open`
(eagle.py: its own one-layer pool, also as many blocks as the target's).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ingot.artifacts import Manifest, safe_relative_path
from ingot.runtime.kv_pool import KVPool, kv_numpy_dtype
from ingot.runtime.session import EngineSession
from ingot.runtime.speculative.config import SpeculativeConfig
from ingot.runtime.speculative.draft_model import DraftModelDrafter
from ingot.runtime.speculative.eagle import EagleDraft, EagleDrafter
from ingot.runtime.speculative.medusa import MedusaDrafter, MedusaHeads
from ingot.runtime.speculative.ngram import NgramDrafter

__all__ = ["DraftModel", "draft_bytes_per_block", "make_drafter", "resolve_config"]

_RECORDED = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")


def resolve_config(
    manifest: Manifest, requested: dict[str, Any] | bool | None
) -> SpeculativeConfig | None:
    """None: the artifact's own speculation (none if it records none); False: none; a dict:
    those keys over the artifact's."""
    if requested is False:
        return None
    recorded = getattr(manifest, "speculative", None)
    default = None
    if recorded is not None:
        default = SpeculativeConfig(**{k: getattr(recorded, k) for k in _RECORDED})
    if requested is None or requested is True:
        config = default
    else:
        config = SpeculativeConfig.from_dict(requested, default)
    if config is not None:
        _check_artifact_has(config, recorded)
    return config


def _check_artifact_has(config: SpeculativeConfig, recorded) -> None:
    """What `config`'s method needs of the artifact's speculative record (None: it has none)."""
    if config.method == "draft_model" and (recorded is None or recorded.draft is None):
        raise ValueError(
            "speculative method draft_model needs an artifact built with a draft model "
            "(recipe speculative.method: draft_model)"
        )
    if config.method == "medusa":
        heads = getattr(recorded, "heads", None)  # manifests from before heads have none
        if heads is None:
            raise ValueError(
                "speculative method medusa needs an artifact built with Medusa heads "
                "(recipe speculative.method: medusa)"
            )
        if config.num_speculative_tokens > heads.num_heads:
            raise ValueError(
                f"num_speculative_tokens {config.num_speculative_tokens} exceeds the "
                f"artifact's {heads.num_heads} Medusa heads (one head proposes each token)"
            )
    if config.method == "eagle" and getattr(recorded, "eagle", None) is None:
        raise ValueError(
            "speculative method eagle needs an artifact built with an EAGLE-3 draft "
            "(recipe speculative.method: eagle)"
        )


def draft_bytes_per_block(manifest: Manifest, config: SpeculativeConfig | None) -> int:
    """What the draft's pool adds to each block of the target's (0 without a draft model or an
    EAGLE draft)."""
    if config is not None and config.method == "eagle":
        eagle = manifest.speculative.eagle  # one layer, float32 K/V (EagleDraft.open)
        return KVPool.bytes_per_block(
            1, eagle.kv_block_size, eagle.num_kv_heads, eagle.head_dim, np.float32
        )
    if config is None or config.method != "draft_model":
        return 0
    graph = manifest.speculative.draft.graph
    return KVPool.bytes_per_block(
        graph.num_layers,
        graph.kv_block_size,
        graph.num_kv_heads,
        graph.head_dim,
        kv_numpy_dtype(graph.kv_dtype),
    )


@dataclass(slots=True)
class DraftModel:
    """The draft engine's session over its own pool."""

    session: EngineSession
    pool: KVPool

    @classmethod
    def open(cls, root: Path, manifest: Manifest, engine_name: str, num_blocks: int) -> DraftModel:
        draft = manifest.speculative.draft
        engines = {e.name: e for e in draft.engines}
        if engine_name not in engines:
            raise ValueError(
                f"the draft model has no engine {engine_name!r} (it has {sorted(engines)})"
            )
        engine, graph = engines[engine_name], draft.graph
        pool = KVPool(
            graph.num_layers,
            num_blocks,
            graph.kv_block_size,
            graph.num_kv_heads,
            graph.head_dim,
            kv_numpy_dtype(graph.kv_dtype),
        )
        path = safe_relative_path(root, engine.path)
        # One thread that does not spin between calls: a second thread pool beside the
        # target's would share its cores (4 threads on 2 cores made the target's one-token
        # call 1.4x slower: benchmarks/results/speculative.md), and a draft is small enough
        # that one thread runs it about as fast.
        options = {**engine.session_options, "intra_op_num_threads": 1}
        return cls(EngineSession(path, pool, options, spinning=False), pool)


def make_drafter(
    config: SpeculativeConfig,
    draft: DraftModel | None,
    sliding_window: int | None,
    heads: MedusaHeads | None = None,
    eagle: EagleDraft | None = None,
) -> NgramDrafter | DraftModelDrafter | MedusaDrafter | EagleDrafter:
    if config.method == "ngram":
        return NgramDrafter(config.prompt_lookup_min, config.prompt_lookup_max)
    if config.method == "medusa":
        if heads is None:
            raise ValueError("speculative method medusa needs the artifact's Medusa heads")
        return MedusaDrafter(heads)
    if config.method == "eagle":
        if eagle is None:
            raise ValueError("speculative method eagle needs the artifact's EAGLE-3 draft")
        return EagleDrafter(eagle)
    if draft is None:
        raise ValueError("speculative method draft_model needs the artifact's draft model")
    return DraftModelDrafter(draft.session, draft.pool, sliding_window)
