"""The speculation an artifact is served with: its recipe's default, or what the caller asks.

`resolve_config` merges a caller's vLLM-style dict over the artifact's record
(manifest.speculative) and checks that the artifact has what the method needs; `make_drafter`
makes the method's drafter from what the loader opened (runtime/loader.py `open_engine`): a
draft model's engine on its own pool (`DraftModel`, as many blocks as the target's: the
target's block tables address both), Medusa heads (`MedusaHeads`, medusa.py), an EAGLE-3 draft
(`EagleDraft`, eagle.py: its own one-layer pool, also as many blocks as the target's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ingot.artifacts import Manifest
from ingot.runtime.engines.base import EngineRunner
from ingot.runtime.kv_pool import KVPool
from ingot.runtime.speculative.config import SpeculativeConfig
from ingot.runtime.speculative.draft_model import DraftModelDrafter
from ingot.runtime.speculative.drafter import Drafter
from ingot.runtime.speculative.eagle import EagleDraft, EagleDrafter
from ingot.runtime.speculative.medusa import MedusaDrafter, MedusaHeads
from ingot.runtime.speculative.ngram import NgramDrafter

__all__ = ["DraftModel", "make_drafter", "resolve_config"]

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


@dataclass(slots=True)
class DraftModel:
    """The draft engine's session over its own pool (opened by runtime/loader.py)."""

    session: EngineRunner
    pool: KVPool


def make_drafter(
    config: SpeculativeConfig,
    draft: DraftModel | None,
    sliding_window: int | None,
    heads: MedusaHeads | None = None,
    eagle: EagleDraft | None = None,
) -> Drafter:
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
