"""A model mixing local and global layers (Qwen2, layer_types: local, global, local; window
24, blocks of 8): the local layers' K/V in a pool of their own, read through a second block
table per sequence (`HybridTable`) that gives blocks back behind the window while the global
layers keep the whole context. Greedy output equals the IR's token for token on a real
artifact whose prompts are longer than the window, and the local pool stays bounded."""

from __future__ import annotations

import pytest
from test_window_freeing import GREEDY, PROMPTS, _ir_greedy

from ingot.runtime import LoadedModel, SamplingParams
from ingot.runtime.generate import Generator, GeneratorConfig
from ingot.runtime.kv_pool import HybridTable, KVPool, OutOfBlocks

from fixtures import SCHEDULER_ARGS, make_checkpoint, write_recipe
from generator_support import RandomSession

LOCAL, FULL = "sliding_attention", "full_attention"
MIXED = dict(
    use_sliding_window=True,
    sliding_window=24,
    num_hidden_layers=3,
    layer_types=[LOCAL, FULL, LOCAL],
)


def _pool(blocks: int = 8, local_blocks: int = 4) -> KVPool:
    return KVPool(
        3, blocks, 4, 1, 2, local_layers=(0, 2), num_local_blocks=local_blocks
    )  # fmt: skip


def test_the_local_layers_have_a_pool_and_a_table_of_their_own():
    pool = _pool()
    assert [len(a) for a in pool.k] == [5, 9, 5]  # + the scratch blocks
    assert pool.scratch_block == 8 and pool.local_scratch_block == 4
    table = pool.new_block_table()
    assert isinstance(table, HybridTable)
    table.reserve(14)  # 4 blocks in each
    assert table.capacity() == 2  # the local pool (4 blocks) is full; the global has room
    with pytest.raises(OutOfBlocks, match="local-layer"):
        table.reserve(3)
    assert len(table.main.block_ids) == 4 and table.num_tokens == 14  # all or nothing
    generation = table.generation
    assert table.free_before(9) == 2  # the local table only
    assert table.local.block_ids[:2] == [4, 4] and table.main.num_freed == 0
    assert table.generation > generation
    table.reserve(6)  # 20 tokens: 5 blocks each, the local two freed ones reused
    table.truncate(15)  # speculative rollback cuts both
    assert len(table.main.block_ids) == len(table.local.block_ids) == 4
    table.release()
    assert pool.allocator.num_free == 8 and pool.local_allocator.num_free == 4


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """(the artifact, each prompt's token ids, the IR's greedy tokens for each)."""
    # The pipeline (torch) loads only where a test builds.
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    tmp = tmp_path_factory.mktemp("qwen2-mixed")
    ckpt = make_checkpoint(tmp / "ckpt", "qwen2", **MIXED)
    targets = [{"engine": "onnxruntime", "matmul_accuracy_level": 0}]  # the IR's numbers
    recipe_path = write_recipe(tmp / "r.yaml", ckpt, targets=targets)
    artifact = build(recipe_path, tmp / "art", cache=StageCache(tmp / "cache")).artifact
    tokenizer = LoadedModel.load(artifact).tokenizer
    ids = [tokenizer.encode(p) for p in PROMPTS]
    assert min(map(len, ids)) > 24 + 8 and max(map(len, ids)) <= 96, list(map(len, ids))
    return artifact, ids, _ir_greedy(recipe_path, ids, 32)


def _run(generator, ids):
    """Each prompt's greedy tokens, the most local blocks any sequence had given back, and
    the most local-pool blocks in use at once."""
    rids = [generator.add(prompt, GREEDY) for prompt in ids]
    freed = local_peak = 0
    while generator.has_unfinished():
        generator.step()
        freed = max([freed, *(s.table.local.num_freed for s in generator.scheduler.running)])
        local_peak = max(local_peak, generator.pool.local_allocator.num_used)
    return [generator.pop_completion(i).token_ids for i in rids], freed, local_peak


@pytest.mark.parametrize(SCHEDULER_ARGS, [(True, None, 2048), (False, 16, 2048), (False, None, 8)])
@pytest.mark.parametrize("speculative", [False, {"method": "ngram", "adaptive": False}])
def test_greedy_equals_the_ir_with_the_local_layers_in_their_own_pool(
    mixed, caching, kv_cache_blocks, budget, speculative
):
    artifact, ids, expected = mixed
    model = LoadedModel.load(
        artifact,
        kv_cache_blocks=kv_cache_blocks,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
        speculative_config=speculative,
    )
    assert model.manifest.model.layer_windows == [24, None, 24]
    assert model.pool.local_layers == (0, 2)
    generator = model.generator()
    for _ in range(2):
        got, freed, local_peak = _run(generator, ids)
        assert got == expected
        assert freed >= 4  # local blocks far behind the window went back
        # Four sequences at once hold at most their windows in the local pool: 24 tokens,
        # a chunk and the block being filled each.
        chunk = -(-min(budget, 96) // 8)
        assert local_peak <= 4 * (3 + chunk + 1)
    assert model.pool.allocator.num_free == model.pool.num_blocks
    assert model.pool.local_allocator.num_free == model.pool.local_allocator.num_blocks


def test_openvino_reads_the_local_layers_blocks_through_their_own_table(tmp_path_factory):
    """A build with an exact openvino target (its build check runs the rebuilt model against
    the IR with the local inputs), blocks of 32: the local layers get the window and
    block_indices_local; greedy equals the IR's."""
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    tmp = tmp_path_factory.mktemp("ov-mixed")
    targets = [
        {"engine": "onnxruntime", "matmul_accuracy_level": 0},
        {"engine": "openvino", "dynamic_quantization": False},  # f32: exact
    ]
    recipe = write_recipe(
        tmp / "r.yaml",
        make_checkpoint(tmp / "ckpt", "qwen2", **MIXED),
        kv_cache={"dtype": "fp32", "block_size": 32},
        targets=targets,
    )
    artifact = build(recipe, tmp / "art", cache=StageCache(tmp / "cache")).artifact
    model = LoadedModel.load(artifact, engine="openvino", max_num_batched_tokens=16)
    assert model.pool.local_layers == (0, 2)
    ids = [model.tokenizer.encode(p) for p in PROMPTS]
    got, freed, _ = _run(model.generator(), ids)
    assert got == _ir_greedy(recipe, ids, 32)
    assert freed >= 1  # a block of 32 left 24 behind
    assert model.pool.local_allocator.num_free == model.pool.local_allocator.num_blocks


# Gemma-3-4B's KV shape (the motivating case): 34 layers, every sixth global (5), the others
# local with a window of 1024; 4 KV heads of 256, bf16; blocks of 16.
GEMMA3_4B = {"num_layers": 34, "num_global": 5, "num_kv_heads": 4, "head_dim": 256, "itemsize": 2}
WINDOW, BLOCK, CONTEXT = 1024, 16, 8192


class _PoolWritingSession(RandomSession):
    """RandomSession as a graph that writes its K/V into the pool (what a mixed model is)."""

    @property
    def scratch_block(self) -> int:
        return self.pool.scratch_block

    def run(self, batch):
        assert batch.attention_mask_local is not None  # the local layers' inputs are built
        return super().run(batch)[0], []


def _kv_bytes(layers: int, blocks: int) -> int:
    g = GEMMA3_4B
    return layers * blocks * BLOCK * 2 * g["num_kv_heads"] * g["head_dim"] * g["itemsize"]


@pytest.mark.parametrize("budget", [2048, 256])
def test_kv_per_sequence_at_8k_context_all_global_vs_hybrid(tokenizer, budget):
    """One sequence, a prompt of 8000 tokens and 192 more generated, through the scheduler and
    the batches of a pool whose local layers have blocks of their own: the allocators' counts
    at each step, as bytes at Gemma-3-4B's shape, against every layer keeping all 8192."""
    whole = CONTEXT // BLOCK
    pool = KVPool(2, whole, BLOCK, 1, 2, local_layers=(1,), num_local_blocks=whole)
    config = GeneratorConfig(
        max_seq_len=CONTEXT, sliding_window=WINDOW, max_num_batched_tokens=budget
    )
    gen = Generator(_PoolWritingSession(pool), pool, tokenizer, config)
    params = SamplingParams(max_tokens=CONTEXT - 8000, temperature=0, ignore_eos=True)
    gen.add([5] * 8000, params)
    peak = decode = (0, 0)  # (global blocks, local blocks) at the hybrid total's peak
    while gen.has_unfinished():
        gen.step()
        used = (pool.allocator.num_used, pool.local_allocator.num_used)
        g = GEMMA3_4B
        size = _kv_bytes(g["num_global"], used[0]) + _kv_bytes(g["num_layers"] - 5, used[1])
        if size > _kv_bytes(5, peak[0]) + _kv_bytes(29, peak[1]):
            peak = used
        running = gen.scheduler.running
        if running and running[0].num_computed > 8000:
            decode = max(decode, used)
    assert decode[0] == whole  # the global layers keep every block
    assert decode[1] == WINDOW // BLOCK + 1  # the local ones their window's
    assert peak[1] <= WINDOW // BLOCK + budget // BLOCK + 1
    assert pool.allocator.num_free == pool.local_allocator.num_free == whole
    all_global = _kv_bytes(34, whole)
    hybrid = _kv_bytes(5, peak[0]) + _kv_bytes(29, peak[1])
    decoding = _kv_bytes(5, decode[0]) + _kv_bytes(29, decode[1])
    # The numbers design.md quotes (section 6, KV pool).
    print(f"\nbudget {budget}: all-global {all_global >> 20} MiB; hybrid peak {hybrid >> 20} MiB "
          f"(local {peak[1]} blocks), decoding {decoding >> 20} MiB (local {decode[1]} blocks), "
          f"{decoding / all_global:.2f}x")  # fmt: skip


def test_the_budget_pays_for_both_pools_the_local_one_capped_at_the_windows(mixed):
    """max_num_seqs 2, chunks of 16, window 24, blocks of 8: each sequence's local layers
    hold at most ceil((24 - 1 + 16) / 8) + 1 = 6 blocks, so the local pool has 12; the rest
    of the budget goes to the global layers' blocks."""
    artifact = mixed[0]
    per_layer_block = 2 * 8 * 2 * 16 * 4  # K and V, 8 tokens, 2 KV heads of 16, fp32
    budget = 40 * per_layer_block + 12 * 2 * per_layer_block  # 40 blocks of layer 1, 12 of 0, 2
    model = LoadedModel.load(
        artifact, kv_cache_bytes=budget, max_num_seqs=2, max_num_batched_tokens=16
    )
    assert model.pool.local_allocator.num_blocks == 12
    assert model.pool.num_blocks == 40
    assert model.pool.nbytes == budget


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_small_local_pool_preempts_and_releases_both_tables(tokenizer, policy):
    """Four sequences of 30 + 20 tokens, window 8, blocks of 4: a local pool of 12 blocks
    holds fewer windows than run at once, so sequences are preempted (both tables released,
    recomputed later); every sequence still gets its tokens (RandomSession's are a function of
    token and position) and both pools end empty."""

    def run(local_blocks: int) -> tuple[list[list[int]], int]:
        pool = KVPool(2, 64, 4, 1, 2, local_layers=(0,), num_local_blocks=local_blocks)
        config = GeneratorConfig(
            max_seq_len=64, sliding_window=8, max_num_batched_tokens=16, scheduling_policy=policy
        )
        gen = Generator(_PoolWritingSession(pool), pool, tokenizer, config)
        params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
        rids = [gen.add([3 + i] * 30, params, priority=i % 2) for i in range(4)]
        while gen.has_unfinished():
            gen.step()
            for seq in gen.scheduler.running:  # a window's blocks and a chunk's at most
                assert len(seq.table.local.block_ids) - seq.table.local.num_freed <= 2 + 4 + 1
        assert pool.allocator.num_free == 64 and pool.local_allocator.num_free == local_blocks
        outputs = [gen.pop_completion(r).token_ids for r in rids]
        return outputs, gen.stats().num_preemptions

    small, preemptions = run(12)
    assert preemptions > 0
    assert small == run(64)[0]
