"""Load a verified artifact: pick its engine, size the KV pool, open the session and drafter.

The files the artifact's manifest names are opened by runtime/loader.py (`open_engine`),
which the build's evaluate stage uses on its stage outputs too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingot.artifacts import EngineInfo, Manifest, safe_relative_path
from ingot.artifacts.reference import is_oci_reference
from ingot.artifacts.resolve import pull_reference
from ingot.artifacts.signing import check_signature
from ingot.artifacts.verify import check_artifact
from ingot.runtime.engine_select import pull_roles, select_engine
from ingot.runtime.engines.base import EngineRunner
from ingot.runtime.generate import DEFAULT_MAX_NUM_SEQS, Generator, GeneratorConfig
from ingot.runtime.kv_pool import KVCacheTooSmall, KVPool
from ingot.runtime.loader import DrafterFiles, EngineFiles, OpenedEngine, open_engine
from ingot.runtime.memory import available_memory, format_bytes
from ingot.runtime.scheduler import SCHEDULING_POLICIES
from ingot.runtime.serving_plan import engine_file_bytes
from ingot.runtime.speculative import Speculation, SpeculativeConfig
from ingot.runtime.speculative.eagle import EagleDraft
from ingot.runtime.speculative.load import DraftModel, make_drafter, resolve_config
from ingot.runtime.speculative.medusa import MedusaHeads
from ingot.runtime.tokenizer import TextTokenizer

__all__ = ["AUTO_KV_CACHE_FRACTION", "DEFAULT_KV_CACHE_BYTES", "LoadedModel", "drafter_files"]

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
    session: EngineRunner  # the engine kind's runtime plug-in opened it
    max_num_seqs: int
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"  # or "priority" (scheduler.SCHEDULING_POLICIES)
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
        engine: str | None = None,
        scheduling_policy: str = "fcfs",
    ) -> LoadedModel:
        """Verify the artifact at `path` (a directory or an `oci://` reference, pulled into the
        local store first), then load it. A directory's files are all hashed; a reference
        pulls only the files of the engine this host would run (`engine` narrows it), checked
        as they stream in, and a load from the store compares each file's recorded stat
        instead of re-hashing it (artifacts/fingerprint.py).

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
        wait (benchmarks/serve_overhead.py compares the two under `ingot serve`). `engine`:
        the artifact's engine of that name ("openvino-cpu") or kind ("openvino") instead of
        the first compatible one in its order (engine_select.py). `scheduling_policy`:
        "fcfs" or "priority" (scheduler.py), vLLM's `--scheduling-policy`.

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
        if scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling_policy {scheduling_policy!r} is not one of "
                f"{', '.join(SCHEDULING_POLICIES)}"
            )
        root, manifest, absent = _verified(path, verify_key, require_signature, engine)
        selected = _selected_engine(manifest, engine, absent)
        speculative = resolve_config(manifest, speculative_config)
        target = _engine_files(root, manifest, selected)
        drafter = drafter_files(root, manifest, selected.name, speculative)
        sizing = _PoolSizing(
            max_num_seqs,
            enable_prefix_caching,
            manifest.model.max_seq_len,
            _local_blocks_per_seq(manifest, target, drafter, max_num_batched_tokens),
        )
        tokenizer = TextTokenizer.from_artifact(root, manifest.tokenizer, chat_template)
        opened, sized = _open_sized(
            manifest, target, drafter, (kv_cache_blocks, kv_cache_bytes), sizing,
            spinning=spinning, profile_file_prefix=profile_file_prefix,
        )  # fmt: skip
        _log_loaded(opened.pool, manifest.graph.kv_dtype, sized, sizing, speculative)
        return cls(
            root,
            manifest,
            selected,
            tokenizer,
            opened.pool,
            opened.session,
            max_num_seqs,
            max_num_batched_tokens,
            enable_prefix_caching,
            scheduling_policy,
            speculative,
            opened.draft,
            opened.heads,
            opened.eagle,
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
            scheduling_policy=self.scheduling_policy,
        )
        speculation = None
        if self.speculative is not None:
            drafter = make_drafter(
                self.speculative, self.draft, self.sliding_window, self.heads, self.eagle
            )
            speculation = Speculation(self.speculative, drafter)
        return Generator(self.session, self.pool, self.tokenizer, config, speculation)


def _verified(
    path: Path | str,
    verify_key: Path | str | None,
    require_signature: bool | None,
    engine: str | None,
) -> tuple[Path, Manifest, tuple[str, ...]]:
    """The artifact's directory (an `oci://` reference pulled into the local store first), its
    manifest and the files a partial pull left out; its signature checked as asked and its
    files verified before any is opened."""

    def check(root: Path) -> None:
        check_signature(root, verify_key=verify_key, require=require_signature)

    if is_oci_reference(path):  # the signature before any blob but manifest.json is fetched
        pulled = pull_reference(str(path), roles=pull_roles(engine), check=check)
        return pulled.path, pulled.manifest, pulled.absent
    check(Path(path))
    verified = check_artifact(path)
    return Path(path), verified.manifest, verified.absent


def _selected_engine(
    manifest: Manifest, requested: str | None, absent: tuple[str, ...]
) -> EngineInfo:
    engine, skipped = select_engine(manifest, requested=requested, absent=absent)
    log.info("engine %s (%s on %s) selected", engine.name, engine.engine, engine.device)
    for reason in skipped:
        log.info("engine skipped: %s", reason)
    return engine


def _engine_files(root: Path, manifest: Manifest, engine: EngineInfo) -> EngineFiles:
    path = safe_relative_path(root, engine.path)
    return EngineFiles(manifest.graph, engine, path, manifest.model.sliding_window)


def drafter_files(
    root: Path, manifest: Manifest, engine_name: str, speculative: SpeculativeConfig | None
) -> DrafterFiles:
    """What `speculative`'s method opens of the artifact at `root` beside its engine
    `engine_name`: for draft_model the draft's engine of that name."""
    spec, method = getattr(manifest, "speculative", None), getattr(speculative, "method", None)
    if method == "draft_model":
        engines = {e.name: e for e in spec.draft.engines}
        if engine_name not in engines:
            raise ValueError(
                f"the draft model has no engine {engine_name!r} (it has {sorted(engines)})"
            )
        engine = engines[engine_name]
        path = safe_relative_path(root, engine.path)
        window = spec.draft.model.sliding_window
        return DrafterFiles(draft=EngineFiles(spec.draft.graph, engine, path, window))
    if method == "medusa":
        return DrafterFiles(heads=safe_relative_path(root, spec.heads.path))
    if method == "eagle":
        return DrafterFiles(eagle=(root, spec.eagle))
    return DrafterFiles()


def _open_sized(
    manifest: Manifest,
    target: EngineFiles,
    drafter: DrafterFiles | None,
    budget: tuple[int | None, int | None],
    sizing: _PoolSizing,
    **session: Any,
) -> tuple[OpenedEngine, str]:
    """The engine opened on a pool of the blocks `budget` (kv_cache_blocks, kv_cache_bytes)
    buys under `sizing`, and how that pool was sized (for the log)."""
    blocks, sized = _pool_blocks(manifest, target, drafter, *budget, sizing)
    local = local_pool_blocks(blocks, sizing)
    return open_engine(target, blocks, drafter, num_local_blocks=local, **session), sized


def _local_blocks_per_seq(
    manifest: Manifest, target: EngineFiles, drafter: DrafterFiles, max_num_batched_tokens: int
) -> int | None:
    """The most local-layer blocks one sequence holds: those of its window behind a prefill
    chunk of max_num_batched_tokens, plus a block the chunk may start in (the scheduler frees
    the rest); a full-length sequence's under an EAGLE-3 draft, which keeps every block. None
    when the graph has no local layers."""
    layout = target.kv_layout()
    if not layout.local_layers:
        return None
    full = -(-manifest.model.max_seq_len // layout.block_size)
    window = manifest.model.sliding_window or 0
    if drafter.eagle is not None:
        return full
    return min(full, -(-(window - 1 + max_num_batched_tokens) // layout.block_size) + 1)


@dataclass(frozen=True, slots=True)
class _PoolSizing:
    """What bounds the pool besides its budget: max_num_seqs full-length sequences."""

    max_num_seqs: int
    prefix_caching: bool
    max_seq_len: int
    # A model mixing local and global layers: the blocks one sequence's local layers hold at
    # most (window + a prefill chunk + a block; None: no local layers).
    local_blocks_per_seq: int | None = None


def _pool_blocks(
    manifest: Manifest,
    target: EngineFiles,
    drafter: DrafterFiles,
    blocks: int | None,
    budget_bytes: int | None,
    sizing: _PoolSizing,
) -> tuple[int, str]:
    """The pool's blocks, and how they were chosen (for the log line). A budget pays for the
    drafter's pool too (the same number of blocks)."""
    layout = target.kv_layout()
    block_size, per_block = layout.block_size, layout.bytes_per_block + drafter.bytes_per_block()
    blocks_per_seq = -(-sizing.max_seq_len // block_size)
    full = sizing.max_num_seqs * blocks_per_seq  # what max_num_seqs full-length sequences use
    local_cap = sizing.max_num_seqs * (sizing.local_blocks_per_seq or 0)
    local_bytes = layout.local_bytes_per_block
    auto = None
    if blocks is not None:
        sized = "a fixed number of blocks"
    elif budget_bytes is not None:
        blocks = _blocks_in(budget_bytes, per_block, local_bytes, local_cap)
        sized = f"budget {format_bytes(budget_bytes)}"
        if not sizing.prefix_caching:
            # Blocks beyond max_num_seqs full-length sequences would be dead memory; with
            # prefix caching they hold cached prefixes instead.
            blocks = min(blocks, full)
    else:
        available = _available_after_weights(manifest, target.engine)
        if available is None:
            budget = DEFAULT_KV_CACHE_BYTES
            auto = f"available memory unknown: {format_bytes(budget)}"
        else:
            budget = int(available * AUTO_KV_CACHE_FRACTION)
            auto = f"{AUTO_KV_CACHE_FRACTION:g} of {format_bytes(available)} available"
        blocks = min(_blocks_in(budget, per_block, local_bytes, local_cap), full)
        sized = f"auto: {auto}, at most {sizing.max_num_seqs} sequences of "
        sized += f"{sizing.max_seq_len} tokens"
    if blocks < blocks_per_seq:
        raise KVCacheTooSmall(
            f"a KV cache of {blocks} blocks ({blocks * block_size} tokens) cannot "
            f"hold one sequence of max_seq_len {sizing.max_seq_len} "
            f"({format_bytes(blocks_per_seq * per_block)})",
            capacity_tokens=blocks * block_size,
            needs=f"one sequence of max_seq_len {sizing.max_seq_len}",
            needed_bytes=blocks_per_seq * per_block,
            auto=auto,
        )
    return blocks, sized


def _blocks_in(budget: int, per_block: int, local_bytes: int, local_cap: int) -> int:
    """The global layers' blocks a budget holds beside the local layers' pool, which has as
    many blocks up to `local_cap` (what max_num_seqs windows use) and no more: n with
    n * per_block + min(n, local_cap) * local_bytes <= budget."""
    if not local_bytes or budget < local_cap * (per_block + local_bytes):
        return budget // (per_block + local_bytes)
    return local_cap + (budget - local_cap * (per_block + local_bytes)) // per_block


def local_pool_blocks(blocks: int, sizing: _PoolSizing) -> int | None:
    """The local layers' pool beside `blocks` global ones: as many, at most what max_num_seqs
    sequences' windows hold (`_PoolSizing.local_blocks_per_seq`); None: no local layers."""
    if sizing.local_blocks_per_seq is None:
        return None
    return min(blocks, sizing.max_num_seqs * sizing.local_blocks_per_seq)


def _log_loaded(
    pool: KVPool,
    kv_dtype: str,
    sized: str,
    sizing: _PoolSizing,
    speculative: SpeculativeConfig | None,
) -> None:
    tokens = pool.num_blocks * pool.block_size
    log.info(
        "KV cache: %d blocks of %d tokens = %d tokens (%s, %d bytes/token, %s); %s; "
        "prefix caching %s; room for %d sequences of max_seq_len %d",
        pool.num_blocks,
        pool.block_size,
        tokens,
        format_bytes(pool.nbytes),
        pool.nbytes // tokens,
        kv_dtype,
        sized,
        "on" if sizing.prefix_caching else "off",
        pool.num_blocks // -(-sizing.max_seq_len // pool.block_size),
        sizing.max_seq_len,
    )
    if pool.local_allocator is not None:
        log.info(
            "KV cache of the local (sliding-window) layers %s: %d blocks of their own, at most "
            "%d per sequence (window, a prefill chunk, a block); prefix caching off",
            list(pool.local_layers),
            pool.local_allocator.num_blocks,
            sizing.local_blocks_per_seq,
        )
    if speculative is not None:
        log.info(
            "speculative decoding: %s, %d tokens per step",
            speculative.method,
            speculative.num_speculative_tokens,
        )


def _available_after_weights(manifest: Manifest, engine: EngineInfo) -> int | None:
    """Available memory less the engine's files, which the session is about to load (the pool
    is sized before the session opens, since the session binds it)."""
    available = available_memory()
    if available is None:
        return None
    return max(0, available - engine_file_bytes(manifest, engine))
