"""On a real (tiny) artifact, batched greedy output equals each request run alone, token for
token, whatever the scheduler does: prefix caching on or off, preemption forced by a tiny pool,
chunked prefill forced by a small token budget."""

from __future__ import annotations

import pytest

from ingot.runtime import LoadedModel, SamplingParams

from fixtures import make_checkpoint, write_recipe

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
SHARED = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps"
PROMPTS = [
    SHARED + " over the",
    "def add(a, b):",
    SHARED + " again and",
    "import os\nprint(os.path",
    SHARED,
]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    tmp = tmp_path_factory.mktemp("parity")
    recipe = write_recipe(tmp / "r.yaml", make_checkpoint(tmp / "ckpt", "llama"))
    return build(recipe, tmp / "art", cache=StageCache(tmp / "cache")).artifact


@pytest.fixture(scope="module")
def alone(artifact):
    """Each prompt's greedy tokens with nothing else running and nothing cached."""
    generator = LoadedModel.load(artifact, enable_prefix_caching=False).generator()
    return [generator.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


@pytest.mark.parametrize(
    ("caching", "kv_cache_blocks", "budget"),
    [
        (True, None, 2048),
        (False, None, 2048),
        (True, 16, 2048),  # 16 blocks of 8 = one 128-token sequence: preemption
        (False, 16, 2048),
        (True, None, 8),  # chunked prefill
        (True, 16, 8),
    ],
)
def test_batched_equals_alone(artifact, alone, caching, kv_cache_blocks, budget):
    model = LoadedModel.load(
        artifact,
        kv_cache_blocks=kv_cache_blocks,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
    )
    generator = model.generator()
    # Twice: the second round finds the first one's prompts in the cache.
    for _ in range(2):
        completions = generator.generate(PROMPTS, GREEDY)
        assert [c.token_ids for c in completions] == alone
    stats = generator.stats()
    assert (stats.prefix_cache_hits > 0) == caching
    if kv_cache_blocks is not None:
        assert stats.num_preemptions > 0
    assert model.pool.allocator.num_free == model.pool.num_blocks
    assert stats.kv_cache_usage == 0 and stats.num_running == stats.num_waiting == 0
