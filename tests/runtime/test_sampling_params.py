"""vLLM's sampling options beyond temperature/top-k/top-p: penalties, logit_bias, min_tokens,
stop strings kept in the text, stop_reason, n / best_of (fan_out, pick_best) and the
cumulative logprob best_of ranks by."""

import numpy as np
import pytest
from test_generate import BACKTICK, EOS, FakeSession

from ingot.runtime import Completion, SamplingParams
from ingot.runtime.generate import RequestError
from ingot.runtime.logits import LogitsProcessor, apply_penalties
from ingot.runtime.n_best import pick_best
from ingot.runtime.sampling import fan_out, make_rng, sample

from generator_support import RandomSession, V, fake_generator

GREEDY = {"temperature": 0}


def _fake(tokenizer, **options):
    return fake_generator(FakeSession, tokenizer, **{"eos_token_ids": (EOS,), **options})


def _random(tokenizer, **options):
    return fake_generator(RandomSession, tokenizer, **{"eos_token_ids": (EOS,), **options})


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 0),
        ("best_of", 0),
        ("presence_penalty", 2.5),
        ("presence_penalty", float("nan")),
        ("frequency_penalty", -2.1),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", float("inf")),
        ("logit_bias", {-1: 1.0}),
        ("logit_bias", {"x": 1.0}),
        ("logit_bias", {3: float("nan")}),
        ("logit_bias", [1, 2]),
        ("min_tokens", -1),
        ("include_stop_str_in_output", "yes"),
        ("structured", {"type": "json_object"}),
    ],
)
def test_invalid_options_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_best_of_below_n_and_min_tokens_above_max_tokens_are_refused():
    with pytest.raises(ValueError, match=r"best_of must be >= n \(3\)"):
        SamplingParams(n=3, best_of=2)
    with pytest.raises(ValueError, match="min_tokens must be at most max_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)
    assert SamplingParams(n=2).num_samples == 2 and SamplingParams(n=2, best_of=5).num_samples == 5


def test_logit_bias_is_clipped_and_takes_json_string_keys():
    params = SamplingParams(logit_bias={"5": 500, 7: -1000.0, 9: 0.5})
    assert params.logit_bias == {5: 100.0, 7: -100.0, 9: 0.5}


def test_logit_bias_outside_the_vocabulary_is_a_request_error(tokenizer):
    gen = _fake(tokenizer, vocab_size=V)
    params = SamplingParams(logit_bias={V: 1.0, 3: 1.0})
    with pytest.raises(
        RequestError, match=rf"logit_bias token ids must be in \[0, {V}\), got \[{V}\]"
    ):
        gen.validate([BACKTICK], params)
    with pytest.raises(RequestError, match="logit_bias"):
        gen.add([BACKTICK], params)


# -- penalties -------------------------------------------------------------------------------


def test_penalties_match_a_hand_computation():
    logits = np.array([2.0, -1.0, 0.5, 3.0, -2.0], np.float32)
    counts = np.array([0, 1, 0, 2, 0], np.int32)  # output so far: 3, 1, 3
    apply_penalties(logits, np.array([0, 1]), counts, 0.25, 0.5, 2.0)
    # Seen (prompt 0, 1; output 1, 3): positive / 2, negative * 2. Then output tokens lose
    # 0.5 * count + 0.25: token 1: -2 - 0.75, token 3: 1.5 - 1.25.
    np.testing.assert_allclose(logits, [1.0, -2.75, 0.5, 0.25, -2.0])


def test_processor_counts_output_tokens_and_leaves_the_raw_logits_alone():
    params = SamplingParams(presence_penalty=0.25, frequency_penalty=0.5, repetition_penalty=2.0)
    processor = LogitsProcessor(params, prompt_ids=[0, 1])
    for token in (3, 1, 3):
        processor.accept(token)
    raw = np.array([2.0, -1.0, 0.5, 3.0, -2.0], np.float32)
    out = processor.process(raw)
    np.testing.assert_allclose(out, [1.0, -2.75, 0.5, 0.25, -2.0])
    np.testing.assert_array_equal(raw, [2.0, -1.0, 0.5, 3.0, -2.0])  # logprobs read these
    # Greedy sees the penalised logits: 3 would win the raw argmax, 0 wins after.
    assert sample(out, SamplingParams(temperature=0), make_rng(0)) == 0


def test_plain_params_pass_the_logits_through_untouched():
    raw = np.arange(5, dtype=np.float32)
    processor = LogitsProcessor(SamplingParams(), prompt_ids=[1, 2], eos_token_ids=[1])
    assert not processor.active and processor.process(raw) is raw


def test_repetition_penalty_stops_repeats_in_the_loop(tokenizer):
    gen = _random(tokenizer)
    base = {"max_tokens": 30, "ignore_eos": True, **GREEDY}
    [plain] = gen.generate([[3]], SamplingParams(**base))
    assert len(set(plain.token_ids)) < 30  # greedy over these logits repeats itself
    [c] = gen.generate([[3]], SamplingParams(repetition_penalty=1000.0, **base))
    # A seen token's positive logit shrinks to ~0, a negative one grows: some unseen token
    # always has a larger logit.
    assert len(set(c.token_ids + [3])) == 31


def test_logit_bias_forces_a_token(tokenizer):
    gen = _fake(tokenizer)
    [c] = gen.generate([[BACKTICK]], SamplingParams(max_tokens=4, logit_bias={70: 100}, **GREEDY))
    assert c.token_ids == [70, 70, 70, 70]
    # A bias too small to beat the fake's 10 changes nothing.
    [c] = gen.generate([[BACKTICK]], SamplingParams(max_tokens=2, logit_bias={70: 5}, **GREEDY))
    assert c.token_ids == [66, 67]


# -- min_tokens, stop strings, stop_reason ---------------------------------------------------


def test_min_tokens_delays_eos(tokenizer):
    gen = _fake(tokenizer)
    [c] = gen.generate([[V - 1]], SamplingParams(max_tokens=8, **GREEDY))  # -> 0, then EOS
    assert c.token_ids == [0, EOS] and c.finish_reason == "stop"
    [c] = gen.generate([[V - 1]], SamplingParams(max_tokens=8, min_tokens=4, **GREEDY))
    # EOS is masked for the first 4 tokens (the fake then has all-zero logits: argmax 0).
    assert c.token_ids == [0, 0, 0, 0, EOS] and c.finish_reason == "stop"
    assert c.stop_reason is None


def test_min_tokens_delays_stop_token_ids_and_stop_strings(tokenizer):
    gen = _fake(tokenizer)
    params = SamplingParams(max_tokens=8, stop_token_ids=[67], min_tokens=2, **GREEDY)
    [c] = gen.generate([[BACKTICK]], params)  # 66, then 67 is masked: 0 ... never stops
    assert 67 not in c.token_ids and c.token_ids[:2] == [66, 0]
    params = SamplingParams(max_tokens=8, stop_token_ids=[67], min_tokens=1, **GREEDY)
    [c] = gen.generate([[BACKTICK]], params)
    assert c.token_ids == [66, 67] and c.finish_reason == "stop" and c.stop_reason == 67
    # "c" is the 3rd token: it ends the request once 3 tokens are allowed, not with 4.
    [c] = gen.generate(["`"], SamplingParams(max_tokens=6, stop="c", min_tokens=3, **GREEDY))
    assert c.text == "ab" and c.finish_reason == "stop" and c.stop_reason == "c"
    [c] = gen.generate(["`"], SamplingParams(max_tokens=6, stop="c", min_tokens=4, **GREEDY))
    assert c.text == "abcdef" and c.finish_reason == "length" and c.stop_reason is None


def test_include_stop_str_in_output(tokenizer):
    gen = _fake(tokenizer)
    params = SamplingParams(max_tokens=10, stop=["xyz", "de"], **GREEDY)
    [cut] = gen.generate(["`"], params)
    assert cut.text == "abc" and cut.stop_reason == "de"
    params.include_stop_str_in_output = True
    [kept] = gen.generate(["`"], params)
    assert kept.text == "abcde" and kept.stop_reason == "de" and kept.finish_reason == "stop"
    assert kept.token_ids == cut.token_ids
    deltas = list(gen.stream([BACKTICK], params))
    assert "".join(deltas) == "abcde"


def test_stop_reason_in_step_outputs_and_completions(tokenizer):
    gen = _fake(tokenizer)
    a = gen.add([BACKTICK], SamplingParams(max_tokens=10, stop_token_ids=[67], **GREEDY))
    b = gen.add([BACKTICK], SamplingParams(max_tokens=10, stop="bc", **GREEDY))
    c = gen.add([V - 1], SamplingParams(max_tokens=10, **GREEDY))
    d = gen.add([BACKTICK], SamplingParams(max_tokens=1, **GREEDY))
    finished = {}
    while gen.has_unfinished():
        for out in gen.step():
            assert out.finished or out.stop_reason is None
            if out.finished:
                finished[out.request_id] = (out.finish_reason, out.stop_reason)
    assert finished == {a: ("stop", 67), b: ("stop", "bc"), c: ("stop", None), d: ("length", None)}
    assert [gen.pop_completion(i).stop_reason for i in (a, b, c, d)] == [67, "bc", None, None]


# -- cumulative logprob, n and best_of -------------------------------------------------------


def test_cumulative_logprob_is_the_sum_of_the_raw_logprobs(tokenizer):
    gen = _random(tokenizer)
    base = {"max_tokens": 6, "temperature": 0.7, "seed": 3, "ignore_eos": True}
    [scored, ranked, plain] = gen.generate(
        [[5, 6]] * 3,
        [SamplingParams(logprobs=0, **base), SamplingParams(ranked=True, **base)]
        + [SamplingParams(**base)],
    )
    assert scored.token_ids == ranked.token_ids == plain.token_ids
    assert scored.cumulative_logprob == pytest.approx(sum(scored.logprobs))
    # A ranked sample tracks it without logprobs; a plain request does not (vLLM: None).
    assert ranked.cumulative_logprob == pytest.approx(scored.cumulative_logprob, rel=1e-5)
    assert ranked.cumulative_logprob < 0 and ranked.logprobs is None
    assert plain.cumulative_logprob is None


def test_fan_out_seeds_sample_i_with_seed_plus_i():
    params = SamplingParams(n=2, best_of=3, seed=10, max_tokens=5, presence_penalty=0.5)
    fanned = fan_out(params)
    assert [p.seed for p in fanned] == [10, 11, 12]
    assert all(p.n == 1 and p.best_of is None and p.presence_penalty == 0.5 for p in fanned)
    assert all(p.ranked for p in fanned)  # best_of > n: pick_best ranks them
    assert not any(p.ranked for p in fan_out(SamplingParams(n=3)))  # all returned: no ranking
    assert params.n == 2 and params.best_of == 3  # the original is unchanged
    assert [p.seed for p in fan_out(SamplingParams(n=2))] == [None, None]
    assert len(fan_out(SamplingParams())) == 1


def test_the_generator_refuses_more_than_one_sample(tokenizer):
    gen = _fake(tokenizer)
    with pytest.raises(ValueError, match="fan_out"):
        gen.add([BACKTICK], SamplingParams(n=2))
    with pytest.raises(ValueError, match="fan_out"):
        gen.add([BACKTICK], SamplingParams(best_of=2))


def _completion(i: int, cumulative: float | None) -> Completion:
    return Completion(i, [1], [2], "x", "length", cumulative_logprob=cumulative)


def test_pick_best_by_cumulative_logprob():
    samples = [
        _completion(0, -3.0),
        _completion(1, -1.0),
        _completion(2, -2.0),
        _completion(3, -1.0),
    ]
    assert [c.request_id for c in pick_best(samples, 2)] == [1, 3]  # ties: sample order
    assert [c.request_id for c in pick_best(samples, 3)] == [1, 3, 2]
    assert [c.request_id for c in pick_best(samples, 4)] == [0, 1, 2, 3]  # n == best_of: order
    with pytest.raises(ValueError, match="n must be"):
        pick_best(samples, 5)
    with pytest.raises(ValueError, match="ranked"):  # samples nobody tracked cannot be ranked
        pick_best([*samples, _completion(4, None)], 2)


def test_n_samples_through_the_generator_are_seeded_and_differ(tokenizer):
    gen = _random(tokenizer)
    params = SamplingParams(n=3, seed=42, max_tokens=8, temperature=1.0, ignore_eos=True)
    first = gen.generate([[7]] * 3, fan_out(params))
    again = gen.generate([[7]] * 3, fan_out(params))
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert len({tuple(c.token_ids) for c in first}) == 3
    [alone] = gen.generate([[7]], SamplingParams(seed=43, max_tokens=8, ignore_eos=True))
    assert alone.token_ids == first[1].token_ids  # sample 1 is seed 42 + 1


def test_batched_equals_alone_with_penalties_and_bias(tokenizer):
    gen = _random(tokenizer, max_num_seqs=4)
    prompts = [[5, 6, 7], [9], [11, 12], [3]]
    params = [
        SamplingParams(
            max_tokens=12,
            temperature=0.8,
            seed=s,
            presence_penalty=0.5,
            frequency_penalty=0.3,
            repetition_penalty=1.3,
            logit_bias={4: 2.0},
            min_tokens=3,
        )
        for s in range(len(prompts))
    ]
    together = gen.generate(prompts, params)
    for prompt, p, c in zip(prompts, params, together, strict=True):
        [alone] = gen.generate([prompt], p)
        assert alone.token_ids == c.token_ids
        assert alone.cumulative_logprob == pytest.approx(c.cumulative_logprob)
