"""Open an engine and its drafter from files: the runtime below the artifact.

`LoadedModel.load` (model.py) reads these files from a verified artifact's manifest; the
build's evaluate stage from its stage outputs, before anything is packaged (the export's
graph.json, the engine stage's engine.json and engine file, the heads or eagle stage's
graphs). Either way `open_engine` builds the pool from the layout the engine's runtime plug-in
declares, opens the target's session through the plug-in, and opens the drafter on a pool of
as many blocks as the target's (the target's block tables address both).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ingot.artifacts import EngineInfo, GraphInfo
from ingot.artifacts.manifest import EagleInfo
from ingot.runtime.engines import ENGINE_RUNTIMES
from ingot.runtime.engines.base import EngineRunner, SessionSettings
from ingot.runtime.kv_pool import KVLayout, KVPool
from ingot.runtime.speculative.eagle import EagleDraft, eagle_kv_layout
from ingot.runtime.speculative.load import DraftModel
from ingot.runtime.speculative.medusa import MedusaHeads

__all__ = ["DrafterFiles", "EngineFiles", "OpenedEngine", "local_layers", "open_engine"]


def local_layers(graph: GraphInfo) -> tuple[int, ...]:
    """The layers of a graph mixing local and global layers whose pools have a block count of
    their own (NBL: pipeline/export/decoder.py); () for every other graph."""
    return tuple(
        layer
        for layer in range(graph.num_layers)
        for spec in graph.inputs
        if spec.name == f"k_pool_{layer}" and spec.shape[:1] == ["NBL"]
    )


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
        """The pool its session reads, as its engine kind's runtime plug-in declares it, with
        the graph's local layers (a model mixing local and global layers)."""
        layout = ENGINE_RUNTIMES.get(self.engine.engine).kv_layout(self.graph, self.engine)
        return replace(layout, local_layers=local_layers(self.graph))


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
    num_local_blocks: int | None = None,
    spinning: bool = True,
    profile_file_prefix: str | None = None,
) -> OpenedEngine:
    """`target` on a pool of `num_blocks` blocks (its local layers', if any, of
    `num_local_blocks`, default as many), and `drafter`. The target's session binds its
    `hidden` output for Medusa heads (which draft from it), `aux_hidden` for an EAGLE-3 draft
    (its features). `spinning=False` lets the engine's threads sleep between calls;
    `profile_file_prefix` turns on the engine's profiler."""
    drafter = drafter or DrafterFiles()
    runtime = ENGINE_RUNTIMES.get(target.engine.engine)
    pool = target.kv_layout().pool(num_blocks, num_local_blocks)
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
