"""Load a verified artifact: pick its engine, open the session, size the KV pool."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingot.artifacts import EngineInfo, Manifest, safe_relative_path, verify_artifact
from ingot.artifacts.resolve import resolve_artifact
from ingot.artifacts.signing import check_signature
from ingot.runtime.engine_select import select_engine
from ingot.runtime.generate import DEFAULT_MAX_NUM_SEQS, Generator, GeneratorConfig
from ingot.runtime.kv_pool import KVCacheTooSmall, KVPool, kv_numpy_dtype
from ingot.runtime.memory import available_memory, format_bytes
from ingot.runtime.session import EngineSession
from ingot.runtime.speculative import Speculation, SpeculativeConfig
from ingot.runtime.speculative.eagle import EagleDraft
from ingot.runtime.speculative.load import (
    DraftModel,
    draft_bytes_per_block,
    make_drafter,
    resolve_config,
)
from ingot.runtime.speculative.medusa import MedusaHeads
from ingot.runtime.tokenizer import TextTokenizer

__all__ = ["AUTO_KV_CACHE_FRACTION", "DEFAULT_KV_CACHE_BYTES", "LoadedModel"]

log = logging.getLogger(__name__)

DEFAULT_KV_CACHE_BYTES = 64 << 20  # LoadedModel.load's own default; LLM and serve size `auto`
# `auto` (kv_cache_bytes=None): this fraction of the memory available once the engine's weights
# are loaded, at most max_num_seqs sequences of max_seq_len tokens.
AUTO_KV_CACHE_FRACTION = 0.5


@dataclass(slots=True)
class LoadedModel:
    """Everything a generator needs, from one artifact directory."""

    root: Path
    manifest: Manifest
    engine: EngineInfo  # the one select_engine picked
    tokenizer: TextTokenizer
    pool: KVPool
    session: EngineSession
    max_num_seqs: int
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    speculative: SpeculativeConfig | None = None
    draft: DraftModel | None = None  # the draft engine, with speculative method draft_model
    heads: MedusaHeads | None = None  # the Medusa heads, with speculative method medusa
    eagle: EagleDraft | None = None  # the EAGLE-3 draft, with speculative method eagle

    @classmethod
    def load(
        cls,
        path: Path | str,
        *,
        kv_cache_blocks: int | None = None,
        kv_cache_bytes: int | None = DEFAULT_KV_CACHE_BYTES,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens: int = 2048,
        enable_prefix_caching: bool = True,
        require_signature: bool | None = None,
        verify_key: Path | str | None = None,
        chat_template: str | None = None,
        profile_file_prefix: str | None = None,
        speculative_config: dict[str, Any] | bool | None = None,
        spinning: bool = True,
    ) -> LoadedModel:
        """Verify the artifact at `path` (a directory or an `oci://` reference, pulled into the
        local store first), then load it.

        With `verify_key` (a PEM public key) model.sig must be a valid signature by its
        private key, else the artifact is refused before anything is loaded; see
        artifacts.signing.check_signature for `require_signature`.

        The pool has `kv_cache_blocks` blocks if given, else as many as `kv_cache_bytes`
        holds. Without prefix caching it is capped at what `max_num_seqs` sequences of
        max_seq_len tokens can use; with it, spare blocks keep cached prefixes (as in vLLM).
        `kv_cache_bytes=None` sizes it automatically: AUTO_KV_CACHE_FRACTION of the memory
        available after the engine's weights, capped at `max_num_seqs` full-length sequences
        (vLLM takes its whole fraction; a tiny model must not take gigabytes). A pool short of
        one full-length sequence raises KVCacheTooSmall, whose numbers callers word with their
        own parameter's name.

        `chat_template` (template source) replaces the artifact's chat template, or supplies
        one where the artifact has none. `profile_file_prefix` turns on ORT's per-node profiler
        (benchmarks read it through `session.end_profiling()`). `spinning=False` makes ONNX
        Runtime's threads sleep between calls instead of spinning, each on a core, while they
        wait (benchmarks/serve_overhead.py compares the two under `ingot serve`).

        `speculative_config` (vLLM's keys: method, num_speculative_tokens, prompt_lookup_min,
        prompt_lookup_max, and ingot's disable_by_batch_size, min_acceptance_rate,
        backoff_steps): None speculates as the artifact's recipe said (if it did), False turns
        speculation off, a dict overrides the artifact's settings. A draft model's pool has
        as many blocks as the target's, and the KV budget pays for both; Medusa heads read the
        target's hidden state (its session binds the `hidden` output) and hold no K/V; an
        EAGLE-3 draft (manifest.speculative.eagle: draft/eagle/model.onnx and fc.onnx) reads
        the target's features (its session binds `aux_hidden`) and has a one-layer float32
        pool of as many blocks as the target's, which the budget pays for too.
        """
        root = resolve_artifact(path)
        check_signature(root, verify_key=verify_key, require=require_signature)
        manifest = verify_artifact(root)  # before anything in the directory is opened
        engine, skipped = select_engine(manifest)
        log.info("engine %s (%s on %s) selected", engine.name, engine.engine, engine.device)
        for reason in skipped:
            log.info("engine skipped: %s", reason)

        speculative = resolve_config(manifest, speculative_config)
        pool, sized = _make_pool(
            manifest,
            engine,
            kv_cache_blocks,
            kv_cache_bytes,
            max_num_seqs,
            enable_prefix_caching,
            draft_bytes_per_block(manifest, speculative),
        )
        tokens = pool.num_blocks * pool.block_size
        max_seq_len = manifest.model.max_seq_len
        log.info(
            "KV cache: %d blocks of %d tokens = %d tokens (%s, %d bytes/token, %s); %s; "
            "prefix caching %s; room for %d sequences of max_seq_len %d",
            pool.num_blocks,
            pool.block_size,
            tokens,
            format_bytes(pool.nbytes),
            pool.nbytes // tokens,
            manifest.graph.kv_dtype,
            sized,
            "on" if enable_prefix_caching else "off",
            pool.num_blocks // -(-max_seq_len // pool.block_size),
            max_seq_len,
        )
        tokenizer = TextTokenizer.from_artifact(root, manifest.tokenizer, chat_template)
        method = speculative.method if speculative is not None else None
        session = EngineSession(
            safe_relative_path(root, engine.path),
            pool,
            engine.session_options,
            profile_file_prefix=profile_file_prefix,
            spinning=spinning,
            hidden=method == "medusa",  # the heads draft from the target's hidden state
            aux=method == "eagle",  # an EAGLE-3 draft reads the target's features
        )
        draft = heads = eagle = None
        if method == "draft_model":
            draft = DraftModel.open(root, manifest, engine.name, pool.num_blocks)
            if draft.session.writes_pool != session.writes_pool:
                # The draft runs the target's prefill batches (DraftModelDrafter.observe).
                raise ValueError(
                    f"{root}: the draft engine and the target engine write the KV pool in "
                    "different ways (built by different ingot versions); rebuild the artifact"
                )
        elif method == "medusa":
            heads = MedusaHeads.open(safe_relative_path(root, manifest.speculative.heads.path))
        elif method == "eagle":
            eagle = EagleDraft.open(root, manifest, pool.num_blocks)
        if speculative is not None:
            log.info(
                "speculative decoding: %s, %d tokens per step",
                speculative.method,
                speculative.num_speculative_tokens,
            )
        return cls(
            root,
            manifest,
            engine,
            tokenizer,
            pool,
            session,
            max_num_seqs,
            max_num_batched_tokens,
            enable_prefix_caching,
            speculative,
            draft,
            heads,
            eagle,
        )

    @property
    def sliding_window(self) -> int | None:
        return getattr(self.manifest.model, "sliding_window", None)

    def generator(self, max_num_batched_tokens: int | None = None) -> Generator:
        config = GeneratorConfig(
            max_seq_len=self.manifest.model.max_seq_len,
            eos_token_ids=tuple(self.manifest.model.eos_token_ids),
            sliding_window=self.sliding_window,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens or self.max_num_batched_tokens,
            enable_prefix_caching=self.enable_prefix_caching,
            vocab_size=self.manifest.model.vocab_size,
        )
        speculation = None
        if self.speculative is not None:
            drafter = make_drafter(
                self.speculative, self.draft, self.sliding_window, self.heads, self.eagle
            )
            speculation = Speculation(self.speculative, drafter)
        return Generator(self.session, self.pool, self.tokenizer, config, speculation)


def _make_pool(
    manifest: Manifest,
    engine: EngineInfo,
    blocks: int | None,
    budget_bytes: int | None,
    max_num_seqs: int,
    prefix_caching: bool,
    draft_per_block: int = 0,
) -> tuple[KVPool, str]:
    """The pool, and how its size was chosen (for the log line). A budget pays for a draft
    model's pool too (`draft_per_block` bytes per block, the same number of blocks)."""
    graph = manifest.graph
    shape = (graph.num_layers, graph.kv_block_size, graph.num_kv_heads, graph.head_dim)
    dtype = kv_numpy_dtype(graph.kv_dtype)
    per_block = KVPool.bytes_per_block(*shape, dtype) + draft_per_block
    max_seq_len = manifest.model.max_seq_len
    blocks_per_seq = -(-max_seq_len // graph.kv_block_size)
    full = max_num_seqs * blocks_per_seq  # what max_num_seqs full-length sequences can use
    auto = None
    if blocks is not None:
        sized = "a fixed number of blocks"
    elif budget_bytes is not None:
        blocks = budget_bytes // per_block
        sized = f"budget {format_bytes(budget_bytes)}"
        if not prefix_caching:
            # Blocks beyond max_num_seqs full-length sequences would be dead memory; with
            # prefix caching they hold cached prefixes instead.
            blocks = min(blocks, full)
    else:
        available = _available_after_weights(manifest, engine)
        if available is None:
            budget = DEFAULT_KV_CACHE_BYTES
            auto = f"available memory unknown: {format_bytes(budget)}"
        else:
            budget = int(available * AUTO_KV_CACHE_FRACTION)
            auto = f"{AUTO_KV_CACHE_FRACTION:g} of {format_bytes(available)} available"
        blocks = min(budget // per_block, full)
        sized = f"auto: {auto}, at most {max_num_seqs} sequences of {max_seq_len} tokens"
    if blocks < blocks_per_seq:
        raise KVCacheTooSmall(
            f"a KV cache of {blocks} blocks ({blocks * graph.kv_block_size} tokens) cannot "
            f"hold one sequence of max_seq_len {max_seq_len} "
            f"({format_bytes(blocks_per_seq * per_block)})",
            capacity_tokens=blocks * graph.kv_block_size,
            needs=f"one sequence of max_seq_len {max_seq_len}",
            needed_bytes=blocks_per_seq * per_block,
            auto=auto,
        )
    pool = KVPool(
        graph.num_layers, blocks, graph.kv_block_size, graph.num_kv_heads, graph.head_dim, dtype
    )
    return pool, sized


def _available_after_weights(manifest: Manifest, engine: EngineInfo) -> int | None:
    """Available memory less the engine's files, which the session is about to load (the pool
    is sized before the session opens, since the session binds it)."""
    available = available_memory()
    if available is None:
        return None
    engine_dir = engine.path.rsplit("/", 1)[0] + "/" if "/" in engine.path else engine.path
    weights = sum(f.size for f in manifest.files if f.path.startswith(engine_dir))
    return max(0, available - weights)
