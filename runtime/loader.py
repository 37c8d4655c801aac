"""Open an engine and its drafter from files: the runtime below the artifact.

`LoadedModel.load` (model.py) reads these files from a verified artifact's manifest; the
build's evaluate stage from its stage outputs, before anything is packaged (the export's
graph.json, the engine stage's engine.json and engine file, the heads or eagle stage's
graphs). Either way `open_engine` builds the pool from the layout the engine's runtime plug-in
declares, opens the target's session through the plug-in, and opens the drafter on a pool of
as many blocks as the target's (the target's block tables address both).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ingot.artifacts import EngineInfo, GraphInfo
from ingot.artifacts.manifest import EagleInfo
from ingot.common.errors import IngotError
from ingot.runtime.engines import ENGINE_RUNTIMES
from ingot.runtime.engines.base import EngineRunner, SessionSettings
from ingot.runtime.kv_pool import KVLayout, KVPool
from ingot.runtime.speculative.eagle import EagleDraft, eagle_kv_layout
from ingot.runtime.speculative.load import DraftModel
from ingot.runtime.speculative.medusa import MedusaHeads

__all__ = ["DrafterFiles", "EngineFiles", "MixedWindowsUnsupported", "OpenedEngine", "open_engine"]

# The inputs a graph gives the local layers of a model mixing local and global layers.
_LOCAL_INPUTS = ("block_tables_local", "kv_slots_local", "attention_mask_local")


class MixedWindowsUnsupported(IngotError, NotImplementedError):
    """The graph's local (sliding-window) layers read block tables of their own, which this
    runtime does not fill yet: refused rather than run with the global layers' tables."""


@dataclass(frozen=True, slots=True)
class EngineFiles:
    """One engine as the runtime opens it: the graph interface it was built from (the
    manifest's `graph`, the export's graph.json), its record and its file, and the model's
    attention window (its `ModelInfo.sliding_window`: an engine that applies it in its graph
    is told it; ONNX Runtime's graphs take it from the mask)."""

    graph: GraphInfo
    engine: EngineInfo
    path: Path
    sliding_window: int | None = None

    def kv_layout(self) -> KVLayout:
        """The pool its session reads, as its engine kind's runtime plug-in declares it."""
        return ENGINE_RUNTIMES.get(self.engine.engine).kv_layout(self.graph, self.engine)


@dataclass(frozen=True, slots=True)
class DrafterFiles:
    """What a speculative method opens beside the target: a draft model's engine (of the
    target's engine name), Medusa heads' graph, or an EAGLE-3 draft (the directory its record's
    paths are relative to, and the record); nothing for prompt lookup or no speculation."""

    draft: EngineFiles | None = None
    heads: Path | None = None
    eagle: tuple[Path, EagleInfo] | None = None

    def bytes_per_block(self) -> int:
        """What the drafter's pool adds to each block of the target's (a KV budget pays for
        both pools)."""
        if self.draft is not None:
            return self.draft.kv_layout().bytes_per_block
        if self.eagle is not None:
            return eagle_kv_layout(self.eagle[1]).bytes_per_block
        return 0


@dataclass(slots=True)
class OpenedEngine:
    """The target's session over its pool, and the drafter `DrafterFiles` named."""

    pool: KVPool
    session: EngineRunner
    draft: DraftModel | None = None
    heads: MedusaHeads | None = None
    eagle: EagleDraft | None = None


def open_engine(
    target: EngineFiles,
    num_blocks: int,
    drafter: DrafterFiles | None = None,
    *,
    spinning: bool = True,
    profile_file_prefix: str | None = None,
) -> OpenedEngine:
    """`target` on a pool of `num_blocks` blocks, and `drafter`. The target's session binds its
    `hidden` output for Medusa heads (which draft from it), `aux_hidden` for an EAGLE-3 draft
    (its features). `spinning=False` lets the engine's threads sleep between calls;
    `profile_file_prefix` turns on the engine's profiler."""
    drafter = drafter or DrafterFiles()
    local = [i.name for i in target.graph.inputs if i.name in _LOCAL_INPUTS]
    if local:
        raise MixedWindowsUnsupported(
            f"{target.path}: the graph's local (sliding-window) layers read {', '.join(local)} "
            "(a model mixing local and global layers); this runtime keeps one block table per "
            "sequence and does not run such models yet"
        )
    runtime = ENGINE_RUNTIMES.get(target.engine.engine)
    pool = runtime.kv_layout(target.graph, target.engine).pool(num_blocks)
    settings = SessionSettings(
        hidden=drafter.heads is not None,
        aux=drafter.eagle is not None,
        spinning=spinning,
        profile_file_prefix=profile_file_prefix,
        sliding_window=target.sliding_window,
    )
    session = runtime.open(target.path, target.engine, pool, settings)
    opened = OpenedEngine(pool, session)
    if drafter.draft is not None:
        opened.draft = _open_draft(drafter.draft, pool, session)
    if drafter.heads is not None:
        opened.heads = MedusaHeads.open(drafter.heads)
    if drafter.eagle is not None:
        root, eagle = drafter.eagle
        opened.eagle = EagleDraft.open(root, eagle, num_blocks)
    return opened


def _open_draft(files: EngineFiles, pool: KVPool, target: EngineRunner) -> DraftModel:
    """The draft engine on a pool of as many blocks as the target's `pool`, addressed by the
    target's block tables (so of its block size)."""
    layout = files.kv_layout()
    if layout.block_size != pool.block_size:  # the build gives both the recipe's kv_cache
        raise ValueError(
            f"{files.path}: the draft engine's KV block size {layout.block_size} is not the "
            f"target's {pool.block_size}"
        )
    draft_pool = layout.pool(pool.num_blocks)
    runtime = ENGINE_RUNTIMES.get(files.engine.engine)
    settings = SessionSettings(drafting=True, sliding_window=files.sliding_window)
    session = runtime.open(files.path, files.engine, draft_pool, settings)
    if session.writes_pool != target.writes_pool:
        # The draft runs the target's prefill batches (DraftModelDrafter.observe).
        raise ValueError(
            f"{files.path}: the draft engine and the target engine write the KV pool in "
            "different ways (built by different ingot versions); rebuild the artifact"
        )
    return DraftModel(session, draft_pool)
