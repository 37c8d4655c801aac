"""Sliding-window freeing (a model whose every layer slides: Mistral): the blocks a sequence's
window has left behind go back to the pool while it runs, its table pointing those entries at
the scratch block, which the mask never shows; greedy output is unchanged (the IR's, token for
token, on a real artifact whose prompts are longer than the window), and a sequence's KV stays
bounded by the window at 8k context (the runtime's own accounting)."""

from __future__ import annotations

import pytest

from ingot.runtime import LoadedModel, SamplingParams
from ingot.runtime.kv_pool import KVPool

from fixtures import (
    SCHEDULER_ARGS,
    SCHEDULER_CASES,
    make_checkpoint,
    openvino_artifact_of,
    write_recipe,
)
from generator_support import RandomSession, fake_generator


def _pool(num_blocks: int = 8) -> KVPool:
    return KVPool(num_layers=1, num_blocks=num_blocks, block_size=4, num_kv_heads=1, head_dim=2)


def test_free_before_gives_back_whole_blocks_only_and_points_them_at_scratch():
    pool = _pool()
    table = pool.new_block_table()
    table.reserve(14)  # blocks of positions 0-3, 4-7, 8-11, 12-13
    first = list(table.block_ids)
    generation = table.generation
    assert table.free_before(7) == 1  # position 7 is in block 1: only block 0 is wholly below
    assert table.block_ids == [pool.scratch_block, *first[1:]] and table.num_freed == 1
    assert table.free_before(7) == 0 and table.free_before(3) == 0
    assert table.generation == generation + 1  # a decode batch built before is rebuilt
    assert pool.allocator.is_free(first[0]) and pool.allocator.num_free == 8 - 3
    table.truncate(9)  # speculative rollback keeps the freed head as it is
    assert table.block_ids == [pool.scratch_block, *first[1:3]]
    table.release()
    assert pool.allocator.num_free == 8 and table.num_freed == 0 and not table.block_ids


def test_a_shared_prefix_block_is_only_unreferenced():
    pool = _pool()
    owner, sharer = pool.new_block_table(), pool.new_block_table()
    owner.reserve(8)
    sharer.share(owner.block_ids[:1])
    sharer.reserve(6)
    assert sharer.free_before(4) == 1  # its block 0: the shared one
    assert pool.allocator.refcount(owner.block_ids[0]) == 1  # still the owner's
    owner.release()
    sharer.release()
    assert pool.allocator.num_free == 8


# Mistral-7B-v0.1's KV: 32 layers, 8 KV heads of 128, fp16; window 4096; blocks of 16.
MISTRAL_7B = {"num_layers": 32, "num_kv_heads": 8, "head_dim": 128, "itemsize": 2}
WINDOW, BLOCK, CONTEXT = 4096, 16, 8192


def _kv_bytes(blocks: int) -> int:
    m = MISTRAL_7B
    return blocks * BLOCK * 2 * m["num_layers"] * m["num_kv_heads"] * m["head_dim"] * m["itemsize"]


@pytest.mark.parametrize(("window", "budget"), [(None, 2048), (WINDOW, 2048), (WINDOW, 256)])
def test_kv_per_sequence_at_8k_context_is_bounded_by_the_window(tokenizer, window, budget):
    """The blocks one sequence holds at its peak (the allocator's count) over a prompt of
    8000 tokens and 192 more generated: all 512 without a window; with it, the window's 256
    plus a prefill chunk's (budget / 16) plus the block being filled."""
    gen = fake_generator(
        RandomSession, tokenizer, num_blocks=CONTEXT // BLOCK, block_size=BLOCK,
        max_seq_len=CONTEXT, sliding_window=window, max_num_batched_tokens=budget,
    )  # fmt: skip
    params = SamplingParams(max_tokens=CONTEXT - 8000, temperature=0, ignore_eos=True)
    gen.add([5] * 8000, params)
    peak = decode_peak = 0
    while gen.has_unfinished():
        gen.step()
        used = gen.pool.allocator.num_used
        peak = max(peak, used)
        running = gen.scheduler.running
        if running and running[0].num_computed > 8000:  # decoding
            decode_peak = max(decode_peak, used)
    whole = CONTEXT // BLOCK
    if window is None:
        assert peak == decode_peak == whole
    else:
        assert decode_peak == WINDOW // BLOCK + 1
        assert peak <= WINDOW // BLOCK + budget // BLOCK + 1
    # The numbers design.md quotes (section 6, sliding-window freeing; Mistral-7B's shape, fp16).
    print(f"window {window} budget {budget}: peak {peak} blocks = {_kv_bytes(peak) >> 20} MiB, "
          f"decoding {decode_peak} = {_kv_bytes(decode_peak) >> 20} MiB")  # fmt: skip


# A real artifact whose layers all slide: window 24, blocks of 8, prompts longer than that.
GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 5,
    "def add(a, b):\n    return a + b\n\n" * 3,
    "The quick brown fox jumps over the lazy dog. " * 5 + "Then it",
    "import os\nimport sys\nprint(os.path.join(sys.argv[0], 'x'))\n" * 2,
]


def _ir_greedy(recipe_path, prompts: list[list[int]], n: int) -> list[list[int]]:
    """The quantized IR's greedy tokens (the pipeline, torch, loads only here)."""
    from ingot.pipeline.model.load import load_model
    from ingot.pipeline.quantize.apply import quantize_model
    from ingot.pipeline.recipe import load_recipe

    recipe = load_recipe(recipe_path)
    model = load_model(recipe.source.path)
    quantize_model(model, recipe.quantize)
    return [model.generate_greedy(p, n, stop_at_eos=False) for p in prompts]


def _run(generator, ids: list[list[int]]) -> tuple[list[list[int]], int]:
    """Each prompt's greedy tokens, and the most blocks any sequence had given back."""
    rids = [generator.add(prompt, GREEDY) for prompt in ids]
    freed = 0
    while generator.has_unfinished():
        generator.step()
        freed = max([freed, *(s.table.num_freed for s in generator.scheduler.running)])
    return [generator.pop_completion(i).token_ids for i in rids], freed


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    """(the artifact, each prompt's token ids, the IR's greedy tokens for each)."""
    # The pipeline (torch) loads only where a test builds.
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    tmp = tmp_path_factory.mktemp("mistral-window")
    ckpt = make_checkpoint(tmp / "ckpt", "mistral", sliding_window=24)
    targets = [{"engine": "onnxruntime", "matmul_accuracy_level": 0}]  # the IR's numbers
    recipe_path = write_recipe(tmp / "r.yaml", ckpt, targets=targets)
    artifact = build(recipe_path, tmp / "art", cache=StageCache(tmp / "cache")).artifact
    tokenizer = LoadedModel.load(artifact).tokenizer
    ids = [tokenizer.encode(p) for p in PROMPTS]
    # Longer than the window by more than a block; room for 32 more in max_seq_len 128.
    assert min(map(len, ids)) > 24 + 8 and max(map(len, ids)) <= 96, list(map(len, ids))
    return artifact, ids, _ir_greedy(recipe_path, ids, 32)


@pytest.mark.parametrize(SCHEDULER_ARGS, [*SCHEDULER_CASES, (False, 16, 2048)])
@pytest.mark.parametrize("speculative", [False, {"method": "ngram", "adaptive": False}])
def test_greedy_equals_the_ir_while_blocks_are_freed(
    mistral, caching, kv_cache_blocks, budget, speculative
):
    artifact, ids, expected = mistral
    model = LoadedModel.load(
        artifact,
        kv_cache_blocks=kv_cache_blocks,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
        speculative_config=speculative,
    )
    assert model.sliding_window == 24
    generator = model.generator()
    for _ in range(2):  # the second round finds the first one's blocks in the cache
        got, freed = _run(generator, ids)
        assert got == expected
        assert freed >= 4  # blocks of positions far behind the window went back
    if kv_cache_blocks is not None:
        # 16 blocks hold one full-length sequence; these four (34 blocks of prompts) decode
        # together in them, each holding what its window needs. (Preemption with a window:
        # test_scheduler's invariants test.)
        assert generator.stats().num_preemptions == 0
    assert model.pool.allocator.num_free == model.pool.num_blocks


def test_openvino_reads_freed_table_entries_harmlessly(tmp_path_factory):
    """Blocks of 32 (OpenVINO's), window 24: the op's `block_indices` list the scratch block
    for freed blocks, and its `sliding_window` never reads them; greedy equals the IR's."""
    artifact = openvino_artifact_of(tmp_path_factory, "ov-window", "mistral", sliding_window=24)
    model = LoadedModel.load(artifact, engine="openvino", max_num_batched_tokens=16)
    ids = [model.tokenizer.encode(p) for p in PROMPTS]
    got, freed = _run(model.generator(), ids)
    assert got == _ir_greedy(artifact.parent / "r.yaml", ids, 32)
    assert freed >= 1  # a block of 32 left 24 behind
    assert model.pool.allocator.num_free == model.pool.num_blocks
