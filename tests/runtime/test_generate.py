"""The generation loop over a fake session: next token = (last token + 1) % V.

The fake also checks, on every call, that each key the mask shows it is the right token:
past slot j of a sequence must hold the K written for position j. That exercises the block
tables, the slot scatter and recompute after preemption end to end, without a model.
"""

import numpy as np
import pytest

from ingot.runtime import Completion, Generator, SamplingParams
from ingot.runtime.kv_pool import KVPool, OutOfBlocks

from generator_support import V, fake_generator, new_kv, picked_rows, step_arrays

EOS = 1
BACKTICK, A = 65, 66  # token ids of "`" and "a": a prompt of [BACKTICK] generates "abcd..."


class FakeSession:
    def __init__(self, pool: KVPool):
        self.pool = pool
        self.calls: list[tuple[int, int]] = []  # (S, Q) per call

    def run(self, batch):
        input_ids, positions, block_tables, context_lens, attention_mask = step_arrays(batch)
        S, Q = input_ids.shape
        B = self.pool.block_size
        self.calls.append((S, Q))
        assert attention_mask.shape == (S, 1, Q, block_tables.shape[1] * B + Q)
        assert attention_mask.any(axis=-1).all(), "a query row with no key gives NaN"
        for s in range(S):
            visible = np.nonzero(attention_mask[s, 0, :, : block_tables.shape[1] * B].any(axis=0))[
                0
            ]
            assert (visible < context_lens[s]).all()
            blocks = block_tables[s, visible // B]
            stored = self.pool.k[0][blocks, visible % B, 0, 0]
            np.testing.assert_array_equal(stored, visible + 1)  # K holds position + 1
        logits = np.zeros((S, Q, V), np.float32)
        np.put_along_axis(logits, ((input_ids + 1) % V)[..., None], 10.0, axis=-1)
        return picked_rows(batch, logits), new_kv(positions, input_ids)


def _generator(tokenizer, **options) -> Generator:
    return fake_generator(FakeSession, tokenizer, **{"eos_token_ids": (EOS,), **options})


def _all_free(gen):
    return gen.pool.allocator.num_free == gen.pool.num_blocks


def test_greedy_max_tokens_and_blocks_freed(tokenizer):
    gen = _generator(tokenizer)
    [c] = gen.generate([[BACKTICK]], SamplingParams(max_tokens=5, temperature=0))
    assert isinstance(c, Completion)
    assert c.prompt_token_ids == [BACKTICK] and c.token_ids == [66, 67, 68, 69, 70]
    assert c.text == "abcde" and c.finish_reason == "length"
    assert _all_free(gen) and not gen.has_unfinished()
    assert gen.session.calls == [(1, 1)] * 5  # one prefill, then four decodes


def test_requests_of_different_lengths_run_together(tokenizer):
    gen = _generator(tokenizer)
    prompts = [[40, 41, 42, 43, 44, 45], [BACKTICK], [10, 11, 12]]
    out = gen.generate(prompts, SamplingParams(max_tokens=3, temperature=0))
    assert [c.token_ids for c in out] == [[46, 47, 48], [66, 67, 68], [13, 14, 15]]
    assert [c.request_id for c in out] == [0, 1, 2]
    assert gen.session.calls == [(3, 6), (3, 1), (3, 1)]
    assert _all_free(gen)


def test_eos_stops_unless_ignored(tokenizer):
    gen = _generator(tokenizer)
    [c] = gen.generate([[V - 1]], SamplingParams(max_tokens=8, temperature=0))  # -> 0, then 1
    assert c.token_ids == [0, EOS] and c.finish_reason == "stop" and c.text == ""
    [c] = gen.generate([[V - 1]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert c.token_ids == [0, 1, 2, 3] and c.finish_reason == "length"
    assert _all_free(gen)


def test_stop_token_ids(tokenizer):
    gen = _generator(tokenizer)
    [c] = gen.generate(
        [[BACKTICK]], SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[69])
    )
    assert c.token_ids == [66, 67, 68, 69] and c.text == "abc" and c.finish_reason == "stop"


def test_stop_string_truncates_the_text(tokenizer):
    gen = _generator(tokenizer)
    params = SamplingParams(max_tokens=10, temperature=0, stop=["xyz", "de"])
    [c] = gen.generate(["`"], params)
    assert c.text == "abc" and c.finish_reason == "stop"
    assert c.token_ids == [66, 67, 68, 69, 70]  # generation stopped at the token completing "de"
    assert _all_free(gen)


def test_max_seq_len_finishes_with_length(tokenizer):
    gen = _generator(tokenizer, max_seq_len=8)
    [c] = gen.generate([[10, 11, 12, 13, 14, 15]], SamplingParams(max_tokens=10, temperature=0))
    assert c.token_ids == [16, 17] and c.finish_reason == "length"
    with pytest.raises(ValueError, match="no room"):
        gen.add(list(range(8)))
    with pytest.raises(ValueError, match="empty"):
        gen.add([])


def test_stream_yields_deltas_and_holds_back_stop_prefixes(tokenizer):
    gen = _generator(tokenizer)
    deltas = list(gen.stream([BACKTICK], SamplingParams(max_tokens=6, temperature=0)))
    assert "".join(deltas) == "abcdef" and len(deltas) == 6
    deltas = list(gen.stream([BACKTICK], SamplingParams(max_tokens=20, temperature=0, stop="def")))
    assert "".join(deltas) == "abc"
    assert _all_free(gen) and not gen.has_unfinished()


def test_abandoned_stream_frees_its_blocks(tokenizer):
    gen = _generator(tokenizer)
    stream = gen.stream([BACKTICK], SamplingParams(max_tokens=20, temperature=0))
    assert next(stream) == "a"
    assert not _all_free(gen)
    stream.close()
    assert _all_free(gen) and not gen.has_unfinished()


def test_step_events_and_abort(tokenizer):
    gen = _generator(tokenizer)
    a = gen.add([BACKTICK], SamplingParams(max_tokens=2, temperature=0))
    b = gen.add([10], SamplingParams(max_tokens=5, temperature=0))
    assert [o[:4] for o in gen.step()] == [(a, 66, False, None), (b, 11, False, None)]
    [out_a, out_b] = gen.step()
    assert out_a == (a, 67, True, "length", "b", None, None, None)  # ..., stop_reason
    assert out_b[:4] == (b, 12, False, None)
    gen.abort(b)
    assert not gen.has_unfinished() and _all_free(gen)
    assert gen.pop_completion(a).text == "ab"


def test_prefill_respects_the_token_budget(tokenizer):
    gen = _generator(tokenizer, max_num_batched_tokens=6)
    out = gen.generate(
        [[10, 11, 12], [20, 21, 22], [BACKTICK] * 8], SamplingParams(max_tokens=2, temperature=0)
    )
    assert [c.token_ids for c in out] == [[13, 14], [23, 24], [66, 67]]
    # step 1 prefills two prompts (2 x 3 tokens); in step 2 their decodes take 2 of the 6
    # tokens, so the 8-token prompt gets a chunk of 4, then the other 4, then decodes.
    assert gen.session.calls == [(2, 3), (2, 1), (1, 4), (1, 4), (1, 1)]


def test_max_num_seqs_limits_running_requests(tokenizer):
    gen = _generator(tokenizer, max_num_seqs=2)
    out = gen.generate([[10], [20], [30]], SamplingParams(max_tokens=2, temperature=0))
    assert [c.token_ids for c in out] == [[11, 12], [21, 22], [31, 32]]
    assert max(s for s, _ in gen.session.calls) == 2


def test_preemption_recomputes_and_gives_the_same_tokens(tokenizer):
    params = SamplingParams(max_tokens=6, temperature=0)
    prompts = [[10, 11], [20, 21], [30, 31]]
    roomy = _generator(tokenizer).generate(prompts, params)
    # 4 blocks of 2 tokens: one 8-token sequence fits, three growing ones do not.
    tight = _generator(tokenizer, num_blocks=4, block_size=2, max_seq_len=8)
    out = tight.generate(prompts, params)
    assert [c.token_ids for c in out] == [c.token_ids for c in roomy]
    assert [c.text for c in out] == [c.text for c in roomy]
    assert _all_free(tight)
    assert any(q > 2 for _, q in tight.session.calls)  # a preempted request was recomputed


def test_seeded_sampling_is_reproducible(tokenizer):
    params = SamplingParams(max_tokens=8, temperature=50.0, seed=3)
    a = _generator(tokenizer).generate([[10], [10]], params)
    b = _generator(tokenizer).generate([[10]], params)
    assert a[0].token_ids == a[1].token_ids == b[0].token_ids


def test_pool_smaller_than_one_sequence_is_refused(tokenizer):
    with pytest.raises(ValueError, match="fewer than max_seq_len"):
        _generator(tokenizer, num_blocks=3, block_size=2, max_seq_len=8)


def test_out_of_blocks_is_raised_not_looped(tokenizer):
    gen = _generator(tokenizer, num_blocks=4, block_size=2, max_seq_len=8)
    hog = gen.pool.new_block_table()
    hog.slots_for(7)  # something outside the generator holds the pool
    gen.add([10, 11])
    with pytest.raises(OutOfBlocks, match="no request could be scheduled"):
        gen.step()
