"""Qwen3 (dense) through every stage, against transformers' own Qwen3: per-head q/k norms,
head_dim apart from hidden / heads, tied and untied heads, attention biases, sliding layers
mixed with global ones."""

from __future__ import annotations

import pytest

from harness import (
    WINDOW,
    assert_ir_matches_transformers,
    engine_and_reference,
    tiny_checkpoint,
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
