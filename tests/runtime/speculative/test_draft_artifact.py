"""An artifact built with a draft model speculates with it by default: the draft's engine on
its own pool of as many blocks as the target's (the KV budget paying for both), greedy output
equal to plain decoding's, and the caller's speculative_config over the artifact's."""

from __future__ import annotations

import pytest

from ingot.runtime import LoadedModel, SamplingParams
from ingot.runtime.kv_pool import KVPool
from ingot.runtime.speculative.draft_model import DraftModelDrafter
from ingot.runtime.speculative.ngram import NgramDrafter

from fixtures import make_checkpoint, write_recipe

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
PROMPTS = ["a b c d a b c d a b", "def add(a, b):", "import os\nprint(os.path"]
DRAFT_SHAPE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
)
EXACT = [{"engine": "onnxruntime", "device": "cpu", "matmul_accuracy_level": 0}]
# Two random models: drafts are rarely accepted; draft in every step anyway.
NO_BACKOFF = {"min_acceptance_rate": 0.0, "adaptive": False}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    # The pipeline (torch) loads only when a test builds the artifact.
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    tmp = tmp_path_factory.mktemp("draft-artifact")
    draft = make_checkpoint(tmp / "draft", seed=1, **DRAFT_SHAPE)
    speculative = {
        "method": "draft_model",
        "num_speculative_tokens": 3,
        "draft": {"source": {"path": str(draft)}},
    }
    recipe = write_recipe(
        tmp / "r.yaml", make_checkpoint(tmp / "target"), speculative=speculative, targets=EXACT
    )
    return build(recipe, tmp / "art", cache=StageCache(tmp / "cache")).artifact


def test_the_artifacts_draft_model_is_the_default_and_keeps_greedy_output(artifact):
    plain = LoadedModel.load(artifact, speculative_config=False).generator()
    assert plain.speculation is None
    expected = [c.token_ids for c in plain.generate(PROMPTS, GREEDY)]

    model = LoadedModel.load(artifact, speculative_config=NO_BACKOFF)
    generator = model.generator()
    assert model.speculative.method == "draft_model"
    assert model.speculative.num_speculative_tokens == 3  # the recipe's
    assert isinstance(generator.speculation.drafter, DraftModelDrafter)
    assert model.draft.pool.num_blocks == model.pool.num_blocks
    assert model.draft.pool.num_layers == 1
    assert [c.token_ids for c in generator.generate(PROMPTS, GREEDY)] == expected
    assert generator.speculation.stats.num_draft_tokens > 0


def test_the_kv_budget_pays_for_both_pools(artifact):
    budget = 1 << 20
    model = LoadedModel.load(artifact, kv_cache_bytes=budget)
    graph, draft = model.manifest.graph, model.manifest.speculative.draft.graph

    def per_block(g):
        return KVPool.bytes_per_block(g.num_layers, g.kv_block_size, g.num_kv_heads, g.head_dim)

    assert model.pool.num_blocks == budget // (per_block(graph) + per_block(draft))
    assert model.pool.nbytes + model.draft.pool.nbytes <= budget


def test_the_callers_config_overrides_the_artifacts(artifact):
    model = LoadedModel.load(artifact, speculative_config={"num_speculative_tokens": 2})
    assert (model.speculative.method, model.speculative.num_speculative_tokens) == (
        "draft_model",
        2,
    )
    model = LoadedModel.load(artifact, speculative_config={"method": "ngram"})
    assert model.draft is None  # no draft pool for a method that does not use it
    assert isinstance(model.generator().speculation.drafter, NgramDrafter)


def test_above_the_batch_limit_the_draft_skips_prefills_and_catches_up_later(artifact):
    plain = LoadedModel.load(artifact, speculative_config=False).generator()
    expected = [c.token_ids for c in plain.generate(PROMPTS, GREEDY)]
    # Three requests at once, drafting only at batch size 1: the prefills (all three running)
    # skip the draft; drafting starts when one request runs alone, after catching up.
    config = {**NO_BACKOFF, "disable_by_batch_size": 1}
    generator = LoadedModel.load(artifact, speculative_config=config).generator()
    drafter = generator.speculation.drafter
    observed = []
    real = drafter.observe

    def spy(batch, chunks):
        observed.append(len(chunks))
        real(batch, chunks)

    drafter.observe = spy
    lengths = [24, 8, 16]  # the first request ends alone, its last 8 tokens drafted
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lengths]
    got = [c.token_ids for c in generator.generate(PROMPTS, params)]
    assert observed == []  # every prefill ran with three requests
    assert got == [want[:n] for want, n in zip(expected, lengths, strict=True)]
    assert generator.speculation.stats.num_draft_tokens > 0  # it drafted once alone
