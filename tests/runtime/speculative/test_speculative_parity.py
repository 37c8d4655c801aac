"""On a real (tiny) artifact, speculative greedy output equals plain greedy output, token for
token, for every drafter, whatever the scheduler does (prefix caching, preemption, chunked
prefill), and the drafts were really accepted (the test is not vacuous).

The engine is built with exact float matmuls (conftest.py's `exact_artifact`): with int8
activations a verification call's rows round their activations differently from a one-token
call's, so a near-tie can flip, exactly as between two batch compositions of plain decoding.
"""

from __future__ import annotations

import pytest

from ingot.runtime import LoadedModel, SamplingParams
from ingot.runtime.engines.onnxruntime.session import EngineSession
from ingot.runtime.speculative import SpeculativeConfig
from ingot.runtime.speculative.draft_model import DraftModelDrafter
from ingot.runtime.speculative.load import DraftModel

from fixtures import SCHEDULER_ARGS, SCHEDULER_CASES

GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
LOOP = "a b c d e f g a b c d e f g a b c d e f g a b c"
PROMPTS = [
    LOOP,
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",
    LOOP + " d e",
    "import os\nprint(os.path",
]
# Draft in every step: whether drafting is faster here (adaptive) is not what these test.
ALWAYS = {"adaptive": False}


@pytest.fixture(scope="module")
def plain(exact_artifact):
    generator = LoadedModel.load(exact_artifact, speculative_config=False).generator()
    return [c.token_ids for c in generator.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize(SCHEDULER_ARGS, SCHEDULER_CASES)
def test_ngram_greedy_equals_plain(exact_artifact, plain, caching, kv_cache_blocks, budget):
    model = LoadedModel.load(
        exact_artifact,
        kv_cache_blocks=kv_cache_blocks,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3, **ALWAYS},
    )
    generator = model.generator()
    calls = _count_call_tokens(generator)
    for _ in range(2):  # the second round finds the first one's prompts in the cache
        completions = generator.generate(PROMPTS, GREEDY)
        assert [c.token_ids for c in completions] == plain
    # Drafts count against the token budget: no call, verification included, exceeds it
    # (at 8, four requests verifying three drafts each would be 16).
    assert max(calls) <= budget
    stats = generator.speculation.stats
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0
    assert stats.num_accepted_tokens < stats.num_draft_tokens  # rejections were exercised
    if kv_cache_blocks is not None:
        assert generator.stats().num_preemptions > 0
    # Every reserved slot of a rejected draft went back.
    assert model.pool.allocator.num_free == model.pool.num_blocks


class _CountingSession:
    """An engine session that records the tokens of every call, padding included."""

    def __init__(self, session) -> None:
        self.session, self.calls = session, []

    def run(self, inputs):
        self.calls.append(int(inputs.input_ids.size))
        return self.session.run(inputs)

    def __getattr__(self, name):
        return getattr(self.session, name)


def _count_call_tokens(generator) -> list[int]:
    """The tokens of every engine call `generator` makes from now on."""
    generator.session = _CountingSession(generator.session)
    return generator.session.calls


def test_each_request_alone_equals_plain(exact_artifact, plain):
    """One request at a time: every step speculates (no batch-size cut-off)."""
    generator = LoadedModel.load(
        exact_artifact,
        speculative_config={"method": "ngram", "num_speculative_tokens": 5, **ALWAYS},
    ).generator()
    for prompt, expected in zip(PROMPTS, plain, strict=True):
        assert generator.generate([prompt], GREEDY)[0].token_ids == expected


def _self_drafting(artifact, **load):
    """A generator whose draft model is the target itself (its own engine on a second pool),
    so greedy drafts should all be accepted: what tests the draft's K/V bookkeeping (catch-up,
    the last accepted draft, rejected slots written again, preemption)."""
    model = LoadedModel.load(artifact, speculative_config=False, **load)
    manifest = model.manifest
    draft_pool = type(model.pool)(
        manifest.graph.num_layers,
        model.pool.num_blocks,
        manifest.graph.kv_block_size,
        manifest.graph.num_kv_heads,
        manifest.graph.head_dim,
        model.pool.dtype,
    )
    engine_file = artifact / model.engine.path
    draft = DraftModel(
        EngineSession(engine_file, draft_pool, model.engine.session_options), draft_pool
    )
    config = SpeculativeConfig(
        "draft_model", num_speculative_tokens=4, min_acceptance_rate=0, adaptive=False
    )
    model.speculative, model.draft = config, draft
    generator = model.generator()
    assert isinstance(generator.speculation.drafter, DraftModelDrafter)
    return model, generator


@pytest.mark.parametrize(SCHEDULER_ARGS, SCHEDULER_CASES)
def test_draft_model_greedy_equals_plain(exact_artifact, plain, caching, kv_cache_blocks, budget):
    model, generator = _self_drafting(
        exact_artifact,
        kv_cache_blocks=kv_cache_blocks,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
    )
    for _ in range(2):
        completions = generator.generate(PROMPTS, GREEDY)
        assert [c.token_ids for c in completions] == plain
    stats = generator.speculation.stats
    assert stats.num_drafts > 0
    # The target drafting for itself: every draft but float near-ties is accepted.
    assert stats.num_accepted_tokens >= 0.9 * stats.num_draft_tokens
    if kv_cache_blocks is not None:
        assert generator.stats().num_preemptions > 0
    assert model.pool.allocator.num_free == model.pool.num_blocks
