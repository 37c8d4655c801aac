"""The checks every family passes on its trained tiny checkpoint (issue 29), from one table:
GPTQ W4, AWQ W4, W8A8 with an int8 KV cache and FP8 builds pass the perplexity gate on the
model's own text, and EAGLE-3, Medusa and draft-model builds decode exactly as plain greedy
(harness.py). What is particular to a family is tested in its own module."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from test_gemma3 import FEATURES as GEMMA3
from test_mixtral import MIXTRAL
from test_phi3 import TRAINED as PHI3
from test_qwen3_moe import EXPERTS as QWEN3_MOE

from harness import (
    EAGLE,
    MAX_DELTA,
    MEDUSA,
    SCHEMES,
    TRAINED_VOCAB,
    gated_build,
    speculative_and_plain,
    trained_checkpoint,
)


@dataclass(frozen=True)
class Trained:
    """A family's trained checkpoint: its config over harness.TINY, and its draft model's
    over that (a smaller model of the family on the same tokenizer)."""

    model_type: str
    config: dict[str, Any] = field(default_factory=dict)
    draft: dict[str, Any] = field(default_factory=lambda: {"num_hidden_layers": 1})
    eagle_steps: int = 20


FAMILIES = {
    "qwen3": Trained("qwen3", {"head_dim": 32}),
    # A draft mixing local and global layers is refused (one block table): one global layer.
    "gemma3": Trained(
        "gemma3_text", GEMMA3, draft={"num_hidden_layers": 1, "sliding_window_pattern": 1}
    ),
    # EAGLE-3's draft is a Llama layer: it rotates with plain RoPE of the target's base, which
    # its training learns (at 20 steps no token of the tiny Phi-3's draft was accepted).
    "phi3": Trained("phi3", PHI3, eagle_steps=60),
    "mixtral": Trained("mixtral", {k: v for k, v in MIXTRAL.items() if k != "sliding_window"}),
    # A dense layer between two sparse ones, weights not renormalised.
    "qwen3_moe": Trained(
        "qwen3_moe",
        dict(QWEN3_MOE, norm_topk_prob=False, mlp_only_layers=[1], num_hidden_layers=3),
        draft={"num_hidden_layers": 1, "mlp_only_layers": []},
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    case = FAMILIES[request.param]
    path = tmp_path_factory.mktemp(f"{request.param}-trained")
    return case, trained_checkpoint(path, case.model_type, **case.config)


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_quantized_builds_pass_the_gate(family, tmp_path, scheme):
    _, trained = family
    quantize, fields = SCHEMES[scheme]
    report = gated_build(trained, tmp_path, quantize, **fields)
    # Trained: far below the uniform model's perplexity, the vocabulary's size.
    assert report["original"] < TRAINED_VOCAB / 4
    assert report["engine_delta"] < MAX_DELTA


@pytest.mark.parametrize("method", ["eagle", "medusa", "draft_model"])
def test_speculative_decoding_equals_plain(family, tmp_path, tmp_path_factory, method):
    case, trained = family
    if method == "eagle":
        spec = {**EAGLE, "heads": {"train": {**EAGLE["heads"]["train"], "steps": case.eagle_steps}}}
    elif method == "medusa":
        spec = MEDUSA
    else:
        path = tmp_path_factory.mktemp(f"{case.model_type}-draft")
        draft = trained_checkpoint(
            path, case.model_type, steps=150, **{**case.config, **case.draft}
        )
        spec = {
            "method": "draft_model",
            "num_speculative_tokens": 3,
            "draft": {"source": {"path": str(draft)}},
        }
    got, want, stats = speculative_and_plain(trained, tmp_path, spec)
    assert got == want
    assert stats.num_draft_tokens >= stats.num_accepted_tokens > 0  # all, at times
