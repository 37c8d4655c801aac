"""Qwen3 (dense) through every stage, against transformers' own Qwen3: per-head q/k norms,
head_dim apart from hidden / heads, tied and untied heads, attention biases, sliding layers
mixed with global ones."""

from __future__ import annotations

import pytest

from harness import (
    EAGLE,
    MAX_DELTA,
    MEDUSA,
    SCHEMES,
    WINDOW,
    assert_ir_matches_transformers,
    engine_and_reference,
    gated_build,
    speculative_and_plain,
    tiny_checkpoint,
    trained_checkpoint,
)

# Layers 1 and 2 slide (max_window_layers 1), layer 0 attends to everything.
FEATURES = dict(
    head_dim=32,
    attention_bias=True,
    use_sliding_window=True,
    sliding_window=WINDOW,
    max_window_layers=1,
    num_hidden_layers=3,
)


@pytest.fixture(scope="module", params=["tied", "untied"])
def checkpoint(request, tmp_path_factory):
    tied = request.param == "tied"
    return tiny_checkpoint(
        tmp_path_factory.mktemp(f"qwen3-{request.param}"),
        "qwen3",
        tie_word_embeddings=tied,
        **FEATURES,
    )


def test_ir_logits_match_transformers(checkpoint):
    assert_ir_matches_transformers(checkpoint, seq_len=40)


def test_engines_greedy_match_transformers(checkpoint, tmp_path):
    runs = engine_and_reference(checkpoint, tmp_path)
    assert max(len(prompt) for prompt, _, _ in runs) > WINDOW  # a prompt past the window
    for prompt, engines, reference in runs:
        for engine, tokens in engines.items():
            assert tokens == reference, (engine, prompt)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_checkpoint(tmp_path_factory.mktemp("qwen3-trained"), "qwen3", head_dim=32)


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_quantized_builds_pass_the_gate(trained, tmp_path, scheme):
    quantize, fields = SCHEMES[scheme]
    report = gated_build(trained, tmp_path, quantize, **fields)
    assert report["original"] < 100  # trained: far below the 512-token vocabulary's uniform
    assert report["engine_delta"] < MAX_DELTA


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    """A smaller Qwen3 on the same tokenizer: one layer, trained alike."""
    path = tmp_path_factory.mktemp("qwen3-draft")
    return trained_checkpoint(path, "qwen3", head_dim=32, num_hidden_layers=1, steps=150)


@pytest.mark.parametrize("method", ["eagle", "medusa", "draft_model"])
def test_speculative_decoding_equals_plain(trained, draft, tmp_path, method):
    spec = {
        "eagle": EAGLE,
        "medusa": MEDUSA,
        "draft_model": {
            "method": "draft_model",
            "num_speculative_tokens": 3,
            "draft": {"source": {"path": str(draft)}},
        },
    }[method]
    got, want, stats = speculative_and_plain(trained, tmp_path, spec)
    assert got == want
    assert stats.num_draft_tokens > stats.num_accepted_tokens > 0
