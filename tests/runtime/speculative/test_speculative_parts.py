"""The pieces of speculative decoding: prompt lookup, the draft policy, the config, the
table cut back after verification."""

from __future__ import annotations

import pytest

from ingot.runtime.kv_pool import BlockAllocator, BlockTable
from ingot.runtime.speculative import SpeculativeConfig
from ingot.runtime.speculative.ngram import propose_ngram
from ingot.runtime.speculative.policy import DraftPolicy, DraftState
from ingot.runtime.speculative.step_rate import PROBE_EVERY, WARMUP, StepRates


@pytest.mark.parametrize(
    ("tokens", "k", "expected"),
    [
        ([1, 2, 3, 4, 1, 2], 3, [3, 4, 1]),  # the longest suffix (1, 2) recurs
        ([1, 2, 3, 9, 2, 3, 7, 2, 3], 2, [7, 2]),  # the latest occurrence wins
        ([1, 2, 3, 4], 2, []),  # nothing recurs
        ([7], 4, []),
        ([5, 6, 5], 4, [6, 5]),  # fewer than k tokens follow
    ],
)
def test_prompt_lookup(tokens, k, expected):
    assert propose_ngram(tokens, k, min_n=1, max_n=3) == expected


def test_prompt_lookup_prefers_the_longest_ngram():
    # Suffix (8, 2): its 2-gram occurred once (followed by 5); the 1-gram (2) later (then 6).
    tokens = [8, 2, 5, 0, 2, 6, 1, 8, 2]
    assert propose_ngram(tokens, 1, min_n=1, max_n=2) == [5]
    assert propose_ngram(tokens, 1, min_n=1, max_n=1) == [6]
    assert propose_ngram(tokens, 1, min_n=3, max_n=3) == []


def test_truncate_returns_the_blocks_past_the_kept_tokens():
    allocator = BlockAllocator(8)
    table = BlockTable(allocator, block_size=4)
    table.slots_for(5)  # 2 blocks
    table.slots_for(6)  # 11 tokens: 3 blocks
    table.truncate(6)
    assert table.num_tokens == 6 and len(table.block_ids) == 2
    assert allocator.num_free == 6
    table.truncate(6)  # nothing to cut
    with pytest.raises(ValueError, match="cannot truncate"):
        table.truncate(7)


def test_policy_backs_off_a_request_whose_drafts_fail_and_retries():
    config = SpeculativeConfig("ngram", num_speculative_tokens=4, backoff_steps=3)
    policy, state = DraftPolicy(config), DraftState()
    assert policy.num_drafts(state) == 4
    for _ in range(10):
        if state.paused:
            break
        policy.update(state, drafted=4, accepted=0)
    assert state.paused == 3
    assert [policy.num_drafts(state) for _ in range(4)] == [0, 0, 0, 4]
    assert policy.step_drafts(config.disable_by_batch_size)
    assert not policy.step_drafts(config.disable_by_batch_size + 1)


def test_a_good_request_keeps_drafting():
    policy, state = DraftPolicy(SpeculativeConfig("ngram")), DraftState()
    for _ in range(50):
        policy.update(state, drafted=4, accepted=1)
    assert not state.paused


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"method": "eagle2"}, "not supported"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "prompt_lookup_min": 5}, "prompt_lookup_min"),
        ({"method": "ngram", "bogus": 1}, "unknown keys"),
        ({"method": "ngram", "model": "x"}, "built into the artifact"),
        ({}, "method is required"),
    ],
)
def test_config_errors_name_the_key(given, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_dict(given)


def test_config_keys_override_the_artifact_default():
    default = SpeculativeConfig("ngram", num_speculative_tokens=2, prompt_lookup_max=3)
    config = SpeculativeConfig.from_dict({"num_speculative_tokens": 5}, default)
    assert (config.method, config.num_speculative_tokens, config.prompt_lookup_max) == (
        "ngram",
        5,
        3,
    )


def test_step_rates_pick_the_faster_kind_per_batch_size_and_probe_the_other():
    rates = StepRates()
    kinds = []
    for _ in range(2 * WARMUP):  # warm-up alternates: both kinds get measured
        kind = rates.speculate(1)
        kinds.append(kind)
        # Batch 1: drafting emits 2 tokens in 4 ms, plain 1 in 1 ms.
        rates.record(1, kind, 2 if kind else 1, 0.004 if kind else 0.001)
    assert kinds.count(True) == kinds.count(False) == WARMUP
    decisions = [rates.speculate(1) for _ in range(PROBE_EVERY)]
    assert decisions.count(True) == 1  # plain is faster: drafting only as a probe
    assert rates.rates(1) == (1000.0, 500.0)
    # Batch 8 is its own bucket, still warming up.
    assert rates.speculate(8) is True
