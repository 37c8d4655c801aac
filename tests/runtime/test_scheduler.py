"""The scheduler, prefix cache and generator over a fake session whose next token depends on the
whole context as read back from the pool: a block shared wrongly, a slot written to the wrong
place or a mask off by one changes the tokens, so comparing with a pure-Python reference checks
the KV cache end to end."""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingot.runtime import Generator, SamplingParams, SchedulerStats
from ingot.runtime.kv_pool import KVPool
from ingot.runtime.scheduler import (
    CALL_COST_TOKENS,
    MAX_PREFILL_CALLS,
    Chunk,
    Scheduler,
    SequenceState,
    split_prefill,
)

from generator_support import V, fake_generator, new_kv, picked_rows, step_arrays


def _logits(context_hash: int) -> np.ndarray:
    """[V] logits, a fixed function of the context (distinct values: argmax is unique)."""
    v = np.arange(V)
    return (3 * np.sin(context_hash * 0.37 + v * 1.3) + 0.01 * np.cos(v * context_hash)).astype(
        np.float32
    )


def _context_hash(tokens, window=None) -> int:
    """Of the tokens the last one sees: all, or the last `window` (a sliding window)."""
    first = 0 if window is None else max(0, len(tokens) - window)
    return sum((p + 1) * (tokens[p] + 7) for p in range(first, len(tokens))) % 9973


def reference(prompt, max_tokens, max_seq_len, window=None):
    """What greedy decoding must produce: the fake's rule applied to the true context (the
    last `window` tokens of it, with a sliding window)."""
    tokens, out = list(prompt), []
    while len(out) < max_tokens and len(tokens) < max_seq_len:
        out.append(int(np.argmax(_logits(_context_hash(tokens, window)))))
        tokens.append(out[-1])
    return out


class ContextFake:
    """Logits from the keys the mask shows each query: past ones read back from the pool."""

    def __init__(self, pool: KVPool):
        self.pool = pool
        self.calls: list[tuple[int, int]] = []  # (S, Q)

    def run(self, batch):
        input_ids, positions, block_tables, context_lens, attention_mask = step_arrays(batch)
        S, Q = input_ids.shape
        B = self.pool.block_size
        K = block_tables.shape[1] * B
        self.calls.append((S, Q))
        logits = np.zeros((S, Q, V), np.float32)
        for s in range(S):
            for q in range(Q):
                past = np.nonzero(attention_mask[s, 0, q, :K])[0]  # key positions
                assert (past < context_lens[s]).all()
                blocks, offsets = block_tables[s, past // B], past % B
                np.testing.assert_array_equal(self.pool.k[0][blocks, offsets, 0, 0], past + 1)
                new = np.nonzero(attention_mask[s, 0, q, K:])[0]
                pos = np.concatenate([past, positions[s, new]])
                tok = np.concatenate([self.pool.v[1][blocks, offsets, 0, 0], input_ids[s, new]])
                logits[s, q] = _logits(int(((pos + 1) * (tok.astype(np.int64) + 7)).sum() % 9973))
        return picked_rows(batch, logits), new_kv(positions, input_ids)


def _generator(tokenizer, **options) -> Generator:
    return fake_generator(ContextFake, tokenizer, **options)


GREEDY = SamplingParams(max_tokens=6, temperature=0)


def _check_invariants(gen: Generator) -> None:
    """Every reference is a live sequence's; a block two sequences hold is a cached full block
    with the same tokens in both; free blocks are exactly the unreferenced ones."""
    scheduler, alloc, cache = gen.scheduler, gen.pool.allocator, gen.pool.prefix_cache
    B = gen.pool.block_size
    assert all(not seq.table.block_ids for seq in scheduler.waiting)
    assert len(scheduler.running) <= scheduler.max_num_seqs
    holders: dict[int, list] = {}
    for seq in scheduler.running:
        table = seq.table
        held = table.block_ids[table.num_freed :]  # the rest the window left behind
        assert table.block_ids[: table.num_freed] == [table.released_block] * table.num_freed
        assert len(set(held)) == len(held)
        assert len(table.block_ids) == -(-seq.num_computed // B)
        for i, block in enumerate(held, start=table.num_freed):
            holders.setdefault(block, []).append((seq, i))
    for block in range(gen.pool.num_blocks):
        held = holders.get(block, [])
        assert alloc.refcount(block) == len(held)
        assert alloc.is_free(block) == (not held)
        if len(held) > 1:
            assert cache.hash_of(block) is not None
            contents = set()
            for seq, i in held:
                assert seq.num_computed >= (i + 1) * B  # full, never written again
                contents.add(tuple(seq.token_ids[: (i + 1) * B]))
            assert len(contents) == 1, "a block is shared by sequences with different tokens"
    stats = gen.stats()
    assert stats.kv_cache_usage == pytest.approx(len(holders) / gen.pool.num_blocks)
    assert (stats.num_running, stats.num_waiting) == (
        len(scheduler.running),
        len(scheduler.waiting),
    )


_PREFIXES = [[10, 11, 12, 13], [10, 11, 12, 13, 14, 15, 16, 17], [3] * 8, [20, 21, 22], []]
_prompts = st.builds(
    lambda prefix, suffix: (prefix + suffix) or [5],
    st.sampled_from(_PREFIXES),
    st.lists(st.integers(0, 40), max_size=5),
)
_adds = st.lists(st.tuples(_prompts, st.integers(1, 12)), min_size=1, max_size=8)
_ops = st.lists(st.sampled_from(["add", "step", "step", "abort"]), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    block_size=st.sampled_from([2, 4]),
    extra_blocks=st.integers(0, 3),
    max_num_seqs=st.integers(1, 4),
    budget=st.integers(1, 16),
    caching=st.booleans(),
    policy=st.sampled_from(["fcfs", "priority"]),
    window=st.sampled_from([None, 2, 3, 5]),
    adds=_adds,
    ops=_ops,
    abort_picks=st.lists(st.integers(0, 7), max_size=8),
)
def test_no_block_is_leaked_or_shared_wrongly(
    tokenizer,
    block_size,
    extra_blocks,
    max_num_seqs,
    budget,
    caching,
    policy,
    window,
    adds,
    ops,
    abort_picks,
):
    max_seq_len = 16
    gen = _generator(
        tokenizer,
        num_blocks=max_seq_len // block_size + extra_blocks,
        block_size=block_size,
        max_seq_len=max_seq_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
        scheduling_policy=policy,
        sliding_window=window,
    )
    added, aborted = {}, set()
    # Every request is added at some point; the rest runs to completion.
    for op in [*ops, *["add"] * len(adds), *["step"] * 300]:
        if op == "add" and adds:
            prompt, max_tokens = adds.pop()
            params = SamplingParams(max_tokens=max_tokens, temperature=0)
            added[gen.add(prompt, params, priority=max_tokens % 3)] = (
                prompt,
                max_tokens,
            )
        elif op == "abort" and added and abort_picks:
            rid = sorted(added)[abort_picks.pop() % len(added)]
            gen.abort(rid)
            aborted.add(rid)
        elif op == "step" and gen.has_unfinished():
            before = len(gen.session.calls)
            gen.step()
            # One decode call, the prefill in at most MAX_PREFILL_CALLS.
            assert len(gen.session.calls) - before <= 1 + MAX_PREFILL_CALLS
        _check_invariants(gen)
    assert not gen.has_unfinished()
    assert gen.pool.allocator.num_free == gen.pool.num_blocks
    for rid, (prompt, max_tokens) in added.items():
        if rid not in aborted:
            want = reference(prompt, max_tokens, max_seq_len, window)
            assert gen.pop_completion(rid).token_ids == want


def test_chunked_prefill_spreads_a_long_prompt_over_steps(tokenizer):
    gen = _generator(tokenizer, max_num_batched_tokens=6)
    short = gen.add([5], GREEDY)
    long_prompt = list(range(30, 50))  # 20 tokens
    long = gen.add(long_prompt, GREEDY)
    first_token_step, step = {}, 0
    while gen.has_unfinished():
        before = len(gen.session.calls)
        outputs = gen.step()
        calls = gen.session.calls[before:]
        assert len(calls) <= 1 + MAX_PREFILL_CALLS
        # The budget holds for what the engine computes: decodes plus the padded prefill.
        assert sum(s * q for s, q in calls) <= 6
        for out in outputs:
            first_token_step.setdefault(out.request_id, step)
        step += 1
    assert first_token_step[short] == 0
    assert first_token_step[long] >= 4  # 3 + 5 + 5 + 5 + 2 tokens, one chunk per step
    assert gen.pop_completion(long).token_ids == reference(long_prompt, 6, 64)
    assert gen.pop_completion(short).token_ids == reference([5], 6, 64)
    assert gen.pool.allocator.num_free == gen.pool.num_blocks


def _cost(calls: list[list[int]]) -> int:
    """Padded tokens plus CALL_COST_TOKENS per call, of calls given as chunk lengths."""
    return sum(len(c) * max(c) + CALL_COST_TOKENS for c in calls)


def _best_cost(lengths: list[int]) -> int:
    """The cheapest split of `lengths` into at most MAX_PREFILL_CALLS calls of runs of the
    sorted lengths, by trying every set of cut points."""
    ordered = sorted(lengths, reverse=True)
    n, best = len(ordered), None
    for k in range(min(MAX_PREFILL_CALLS, n)):
        for cuts in itertools.combinations(range(1, n), k):
            bounds = [0, *cuts, n]
            calls = [ordered[a:b] for a, b in itertools.pairwise(bounds)]
            best = _cost(calls) if best is None else min(best, _cost(calls))
    return best


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=9))
def test_split_prefill_finds_the_cheapest_split(lengths):
    chunks = [Chunk(None, 0, n) for n in lengths]
    calls = split_prefill(chunks)
    assert len(calls) <= MAX_PREFILL_CALLS
    # Every chunk once; calls in order of their first chunk, chunks in their order.
    indices = [[next(i for i, c in enumerate(chunks) if c is x) for x in call] for call in calls]
    assert sorted(i for call in indices for i in call) == list(range(len(chunks)))
    assert all(call == sorted(call) for call in indices) and indices == sorted(indices)
    assert _cost([[c.num_tokens for c in call] for call in calls]) == _best_cost(lengths)


def test_a_mixed_length_prefill_runs_as_calls_of_similar_lengths(tokenizer):
    gen = _generator(tokenizer, num_blocks=256, max_seq_len=256, max_num_batched_tokens=2048)
    prompts = [list(range(150)), [7] * 5, [(3 * i) % V for i in range(140)], [9, 8, 7, 6]]
    out = gen.generate(prompts, GREEDY)
    # One call padded to 150 would compute 600 tokens; two compute 2 x 150 + 2 x 5.
    assert gen.session.calls[:2] == [(2, 150), (2, 5)]
    assert [c.token_ids for c in out] == [reference(p, 6, 256) for p in prompts]


def test_preemption_is_counted_and_recomputation_gives_the_same_tokens(tokenizer):
    prompts = [[10, 11, 12], [20, 21], [30, 31, 32, 33]]
    params = SamplingParams(max_tokens=10, temperature=0)
    gen = _generator(tokenizer, num_blocks=8, block_size=2, max_seq_len=16)
    out = gen.generate(prompts, params)
    assert [c.token_ids for c in out] == [reference(p, 10, 16) for p in prompts]
    assert gen.stats().num_preemptions > 0
    assert gen.pool.allocator.num_free == gen.pool.num_blocks


def test_on_preempt_hears_of_each_preempted_sequence_once_its_blocks_went_back():
    pool = KVPool(num_layers=1, num_blocks=4, block_size=2, num_kv_heads=1, head_dim=2)
    heard = []

    def on_preempt(seq):
        heard.append(
            (seq.id, list(seq.table.block_ids), seq.num_computed, seq in scheduler.waiting)
        )

    scheduler = Scheduler(pool, 4, 64, enable_prefix_caching=False, on_preempt=on_preempt)
    old, new = (SequenceState(i, [1, 2, 3, 4], 4, pool.new_block_table()) for i in (0, 1))
    scheduler.add(old)
    scheduler.add(new)
    assert len(scheduler.schedule().prefill) == 2 and pool.allocator.num_free == 0
    assert heard == []
    old.token_ids.append(5)
    new.token_ids.append(5)
    plan = scheduler.schedule()  # `old` needs a block: the newest running one gives its two
    assert [c.seq for c in plan.decode] == [old] and scheduler.num_preemptions == 1
    assert heard == [(1, [], 0, True)]


def test_prefix_cache_reuses_full_blocks_and_counts_tokens(tokenizer):
    gen = _generator(tokenizer)  # blocks of 4
    shared = list(range(100, 108))  # two full blocks
    [first] = gen.generate([shared + [1, 2]], GREEDY)
    stats = gen.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (10, 0)

    gen.session.calls.clear()
    [second] = gen.generate([shared + [3, 4]], GREEDY)
    assert second.token_ids == reference(shared + [3, 4], 6, 64)
    assert gen.session.calls[0] == (1, 2)  # only the two new tokens were computed
    stats = gen.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (20, 8)

    # A fully cached prompt still computes its last token: its last block is recomputed.
    gen.session.calls.clear()
    [third] = gen.generate([shared], GREEDY)
    assert third.token_ids == reference(shared, 6, 64)
    assert gen.session.calls[0] == (1, 4)
    assert gen.stats().prefix_cache_hits == 12
    assert isinstance(stats, SchedulerStats) and stats.num_blocks == 64 and stats.block_size == 4


def test_prefix_caching_off_shares_nothing(tokenizer):
    gen = _generator(tokenizer, enable_prefix_caching=False)
    prompt = list(range(100, 110))
    gen.generate([prompt], GREEDY)
    gen.session.calls.clear()
    [again] = gen.generate([prompt], GREEDY)
    assert gen.session.calls[0] == (1, 10) and again.token_ids == reference(prompt, 6, 64)
    stats = gen.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (0, 0)
    assert len(gen.pool.prefix_cache) == 0


def test_logprobs_are_the_log_softmax_of_the_raw_logits(tokenizer):
    gen = _generator(tokenizer)
    prompt = [10, 11, 12]
    params = SamplingParams(max_tokens=5, temperature=0.7, seed=3, logprobs=3)
    rid = gen.add(prompt, params)
    tokens = list(prompt)
    while gen.has_unfinished():
        for out in gen.step():
            logits = _logits(_context_hash(tokens)).astype(np.float64)
            expected = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
            assert out.logprob == pytest.approx(expected[out.token], abs=1e-9)
            top = np.argsort(-expected)[:3]
            assert list(out.top_logprobs) == [int(t) for t in top]  # most likely first
            np.testing.assert_allclose(list(out.top_logprobs.values()), expected[top])
            tokens.append(out.token)
    completion = gen.pop_completion(rid)
    assert completion.token_ids == tokens[len(prompt) :] and len(completion.logprobs) == 5

    [plain] = gen.generate([prompt], SamplingParams(max_tokens=2))
    assert plain.logprobs is None and plain.top_logprobs is None
    gen.add(prompt, SamplingParams(max_tokens=1, logprobs=0))
    [out] = gen.step()
    assert out.top_logprobs == {} and out.logprob is not None


def test_seeded_sampling_is_the_same_batched_or_alone(tokenizer):
    seeded = SamplingParams(max_tokens=10, temperature=1.0, top_k=40, top_p=0.9, seed=42)
    prompt = [7, 8, 9, 10, 11]
    [alone] = _generator(tokenizer).generate([prompt], seeded)
    # With others (unseeded, other parameters), chunked prefill and a pool that preempts.
    gen = _generator(
        tokenizer, num_blocks=12, block_size=2, max_seq_len=24, max_num_batched_tokens=4
    )
    others = [SamplingParams(max_tokens=12, temperature=2.0), SamplingParams(max_tokens=8)]
    out = gen.generate([[1, 2, 3, 4, 5, 6], prompt, [40, 41, 42]], [others[0], seeded, others[1]])
    assert out[1].token_ids == alone.token_ids
    assert gen.stats().num_preemptions > 0
    assert _generator(tokenizer).generate([prompt], seeded)[0].token_ids == alone.token_ids


def test_validate_uses_vllms_context_length_wording(tokenizer):
    gen = _generator(tokenizer, max_seq_len=64)
    gen.validate([1] * 10, SamplingParams(max_tokens=54))  # exactly the context: fine
    with pytest.raises(ValueError) as err:
        gen.validate([1] * 10, SamplingParams(max_tokens=55))
    assert str(err.value) == (
        "This model's maximum context length is 64 tokens. However, you requested 65 tokens "
        "(10 in the messages, 55 in the completion). Please reduce the length of the messages "
        "or completion."
    )
    with pytest.raises(ValueError, match="empty"):
        gen.validate([], SamplingParams())


def test_request_ids_and_token_range(tokenizer):
    gen = _generator(tokenizer, vocab_size=V)
    assert gen.add([5], GREEDY, request_id=1) == 1
    assert gen.add([5], GREEDY) == 0 and gen.add([5], GREEDY) == 2  # auto ids skip used ones
    with pytest.raises(ValueError, match="already in use"):
        gen.add([5], GREEDY, request_id=2)
    with pytest.raises(ValueError, match=r"\[0, 320\)"):
        gen.add([5, V], GREEDY)
    for rid in (0, 1, 2):
        gen.abort(rid)
    gen.abort(99)  # unknown: ignored
    assert not gen.has_unfinished() and gen.pool.allocator.num_free == gen.pool.num_blocks


def test_running_requests_share_cached_prefix_blocks(tokenizer):
    gen = _generator(tokenizer)  # blocks of 4
    shared = list(range(100, 112))  # three full blocks
    a = gen.add(shared + [1], SamplingParams(max_tokens=8, temperature=0))
    gen.step()  # a's prompt is computed and its full blocks cached
    b = gen.add(shared + [2, 3], SamplingParams(max_tokens=8, temperature=0))
    gen.step()
    seq_a, seq_b = gen.scheduler.running
    assert seq_a.table.block_ids[:3] == seq_b.table.block_ids[:3]
    assert seq_a.table.block_ids[3] != seq_b.table.block_ids[3]
    assert all(gen.pool.allocator.refcount(blk) == 2 for blk in seq_a.table.block_ids[:3])
    _check_invariants(gen)
    while gen.has_unfinished():
        gen.step()
    assert gen.pop_completion(a).token_ids == reference(shared + [1], 8, 64)
    assert gen.pop_completion(b).token_ids == reference(shared + [2, 3], 8, 64)
    assert gen.pool.allocator.num_free == gen.pool.num_blocks
