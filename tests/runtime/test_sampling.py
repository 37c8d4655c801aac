import numpy as np
import pytest

from ingot.runtime.sampling import (
    InvalidSamplingParams,
    SamplingParams,
    logsumexp_rows,
    make_rng,
    sample,
)


def _draws(logits, params, n=2000, seed=0):
    rng = make_rng(seed)
    return np.array([sample(logits, params, rng) for _ in range(n)])


def test_temperature_zero_is_argmax():
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    assert sample(logits, SamplingParams(temperature=0), make_rng(0)) == 1


def test_same_seed_same_tokens_different_seed_different_tokens():
    logits = np.random.default_rng(1).normal(size=50).astype(np.float32)
    params = SamplingParams(temperature=1.0)
    a = _draws(logits, params, n=50, seed=7)
    assert (a == _draws(logits, params, n=50, seed=7)).all()
    assert (a != _draws(logits, params, n=50, seed=8)).any()


def test_top_k_keeps_only_the_k_most_likely():
    logits = np.array([1.0, 5.0, 4.0, 3.0, 0.0], dtype=np.float32)
    draws = _draws(logits, SamplingParams(top_k=2, temperature=5.0))
    assert set(draws) == {1, 2}


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probs).astype(np.float32)
    assert set(_draws(logits, SamplingParams(top_p=0.8))) == {0, 1}  # 0.5 + 0.3 reaches 0.8
    assert set(_draws(logits, SamplingParams(top_p=0.81))) == {0, 1, 2}
    assert set(_draws(logits, SamplingParams(top_p=0.01))) == {0}  # always at least one


def _full_sort_top_p(logits, params, rng) -> int:
    """top-p by sorting the whole vocabulary: what `sample` must draw, token for token."""
    scaled = logits.astype(np.float64) / params.temperature
    order = np.argsort(-scaled, kind="stable")  # equal logits in token id order
    probs = np.exp(scaled[order] - scaled.max())
    probs /= probs.sum()
    keep = min(int(np.searchsorted(np.cumsum(probs), params.top_p)) + 1, len(probs))
    cumulative = np.cumsum(probs[:keep])
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(order[min(index, keep - 1)])


@pytest.mark.parametrize("vocab", [50, 4096, 32000])
def test_top_p_over_a_partial_sort_draws_what_a_full_sort_draws(vocab):
    # The nucleus is found among the tokens above the k-th largest logit for growing k; a flat
    # distribution needs many rounds, a peaked one one; rounded logits make ties at the cut.
    rng = np.random.default_rng(vocab)
    for trial in range(60):
        logits = (rng.standard_normal(vocab) * rng.choice([0.3, 3.0, 12.0])).astype(np.float32)
        if trial % 3 == 0:
            logits = np.round(logits)
        params = SamplingParams(
            temperature=float(rng.choice([0.5, 1.0, 1.5])),
            top_p=float(rng.choice([0.05, 0.5, 0.9, 0.999])),
        )
        got = sample(logits, params, make_rng(trial))
        assert got == _full_sort_top_p(logits, params, make_rng(trial)), (trial, params)


def test_top_k_then_top_p():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1])).astype(np.float32)
    # top_k=3 renormalizes to 4/9, 3/9, 2/9; top_p=0.7 then keeps the first two.
    assert set(_draws(logits, SamplingParams(top_k=3, top_p=0.7))) == {0, 1}


def test_distribution_follows_softmax_of_scaled_logits():
    logits = np.log(np.array([0.6, 0.3, 0.1])).astype(np.float32)
    draws = _draws(logits, SamplingParams(temperature=1.0), n=20000)
    freq = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(freq, [0.6, 0.3, 0.1], atol=0.02)
    sharp = _draws(logits, SamplingParams(temperature=0.25), n=20000)
    expected = np.array([0.6, 0.3, 0.1]) ** 4
    np.testing.assert_allclose(
        np.bincount(sharp, minlength=3) / 20000, expected / expected.sum(), atol=0.02
    )


def test_low_temperature_does_not_overflow():
    logits = np.array([1000.0, 999.0, -1000.0], dtype=np.float32)
    assert sample(logits, SamplingParams(temperature=1e-4), make_rng(0)) == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", 1.5),
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("top_k", -2),
        ("top_k", True),
        ("top_k", 1.0),
        ("top_p", 0.0),
        ("top_p", 1.1),
        ("seed", -3),
        ("stop", [""]),
        ("stop_token_ids", [-1]),
        ("ignore_eos", "yes"),
        ("logprobs", -1),
        ("logprobs", 21),
    ],
)
def test_invalid_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", True),
        ("temperature", "1"),
        ("top_k", 2**31),
        ("seed", 2**63),
        ("max_tokens", 2**31),
        ("stop", "a\ud800"),
        ("stop_token_ids", 5),
        ("stop_token_ids", [2**31]),
        ("logit_bias", {"\u00b2": 1.0}),  # a digit int() cannot read
    ],
)
def test_wrong_types_and_out_of_range_values_are_invalid_sampling_params(field, value):
    with pytest.raises(InvalidSamplingParams, match=f"^{field} ") as caught:
        SamplingParams(**{field: value})
    assert caught.value.field == field


def test_vllm_spellings_of_off_and_greedy():
    # vLLM's: top_k -1 and 0 are both "no limit"; a temperature below 1e-5 is greedy.
    assert SamplingParams(top_k=-1).top_k == 0 == SamplingParams(top_k=0).top_k
    assert SamplingParams(temperature=1e-6).temperature == 0.0
    assert SamplingParams(temperature=1e-5).temperature == 1e-5
    with pytest.raises(InvalidSamplingParams, match=r"stop\[0\] has a lone surrogate at index 1"):
        SamplingParams(stop="a\udfff")  # no output could ever match it


def test_defaults_and_stop_string_normalization():
    params = SamplingParams(stop="###")
    assert params.stop == ["###"] and params.max_tokens == 16 and params.top_k == 0
    assert SamplingParams().stop == [] and SamplingParams().stop is not SamplingParams().stop
    assert not hasattr(params, "__dict__")  # slotted


def test_logsumexp_rows_is_each_rows_normalizer():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((5, 4096)) * 8).astype(np.float32)
    logits[2] += 1000.0  # large logits must not overflow exp
    want = [np.log(np.exp(row.astype(np.float64) - row.max()).sum()) + row.max() for row in logits]
    np.testing.assert_allclose(logsumexp_rows(logits), want, rtol=1e-6)
    half = logits.astype(np.float16)
    np.testing.assert_allclose(logsumexp_rows(half), logsumexp_rows(half.astype(np.float32)))
