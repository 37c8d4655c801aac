"""What the speculative benchmark runs: the target and draft models, the methods (each row's
speculative_config), the drafters trained in builds of their own, and transformers' cases.
Shared by the benchmark, its workers and its report."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "ADAPTIVE_OFF",
    "CALIBRATION",
    "DRAFT",
    "DRAFT_TOKENS",
    "FORCED",
    "KV_CACHE_BYTES",
    "MAX_ATTEMPTS",
    "METHODS",
    "NGRAM_LOOKUP",
    "OTHERS_LIMIT_CORES",
    "OWN_BUILD",
    "OwnBuild",
    "PEER_CASES",
    "TARGET",
    "ingot_methods",
]

TARGET, DRAFT = "pydoc-16m", "pydoc-tiny"
DRAFT_TOKENS = 4  # the draft model's num_speculative_tokens (the recipe's default)
MEDUSA_TOKENS = 4  # Medusa's num_speculative_tokens: one token from each head
# EAGLE's num_speculative_tokens, EAGLE-3's usual k (recipes/demo-eagle.yaml's too), and the
# drafting steps its training unrolls (ttt_steps): every draft position is one the draft learned
# to draft from its own output. Fewer than Medusa's 4: each EAGLE token is one more draft-layer
# call after the previous one (Medusa's 4 come from one call), for a position accepted only
# after every earlier one.
EAGLE_TOKENS = 3
# Methods: (name, speculative_config for LoadedModel.load). The draft model is built into the
# target's artifact, the Medusa heads and the EAGLE draft into one of their own each; ngram
# needs nothing built.
METHODS: tuple[tuple[str, dict[str, Any] | bool], ...] = (
    ("plain", False),
    ("ngram k=2", {"method": "ngram", "num_speculative_tokens": 2}),
    ("ngram k=4", {"method": "ngram", "num_speculative_tokens": 4}),
    ("draft_model k=4", {"method": "draft_model", "num_speculative_tokens": DRAFT_TOKENS}),
    ("medusa k=4", {"method": "medusa", "num_speculative_tokens": MEDUSA_TOKENS}),
    ("eagle k=3", {"method": "eagle", "num_speculative_tokens": EAGLE_TOKENS}),
)
NGRAM_LOOKUP = {"prompt_lookup_min": 1, "prompt_lookup_max": 4}
# The trained drafters' builds add the calibration windows they learn on.
CALIBRATION = {"samples": 128, "seq_len": 512}
MEDUSA_TRAIN = {
    "num_heads": MEDUSA_TOKENS,
    "num_layers": 1,
    "steps": 600,
    "learning_rate": 0.001,
    "batch_size": 64,
    "seed": 0,
}
EAGLE_TRAIN = {
    "steps": 800,
    "learning_rate": 0.001,
    "batch_size": 8,
    "span": 128,
    "ttt_steps": EAGLE_TOKENS,
    "seed": 0,
}


class OwnBuild(NamedTuple):
    """A method whose drafter is trained in a build of its own."""

    tokens: int  # num_speculative_tokens
    train: dict[str, Any]  # speculative.heads.train
    stage: str  # the build stage that trains it, also its field of the manifest's speculative
    title: str  # what the report calls it


# An artifact holds one drafter: these methods load their own build of the target
# (speculative.py's _build).
OWN_BUILD = {
    "medusa": OwnBuild(MEDUSA_TOKENS, MEDUSA_TRAIN, "heads", "Medusa heads"),
    "eagle": OwnBuild(EAGLE_TOKENS, EAGLE_TRAIN, "eagle", "EAGLE-3 draft"),
}
# Batch 1 only: these methods with the runtime's adaptive drafting off (drafting every step
# it can, however its steps time), which shows what speculation itself costs and gains.
ADAPTIVE_OFF = ("ngram k=4", "draft_model k=4", "medusa k=4", "eagle k=3")
# The "forced" variants above the batch-size threshold: drafting at any batch size, adaptive
# off, so every step of every request drafts.
FORCED = {"disable_by_batch_size": 1024, "adaptive": False}
KV_CACHE_BYTES = 128 << 20  # every case fits (32 x 208 tokens at 12 KiB, target and draft)
# transformers' assisted generation: (name, GenerationConfig fields, uses the assistant).
PEER_CASES: tuple[tuple[str, dict[str, Any], bool], ...] = (
    ("plain", {}, False),
    ("assistant_model (defaults)", {}, True),
    (
        "assistant_model k=4",
        {
            "num_assistant_tokens": DRAFT_TOKENS,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0,
        },
        True,
    ),
    ("prompt_lookup_num_tokens=4", {"prompt_lookup_num_tokens": 4}, False),
)
# A timed run during which other processes (or the hypervisor: steal) used more than this many
# cores is repeated, up to MAX_ATTEMPTS times in all: a few seconds of someone else's work
# barely moves the 1-min load but spoils a run of one method (and so its ratio to plain).
OTHERS_LIMIT_CORES = 0.25
MAX_ATTEMPTS = 4


def ingot_methods() -> dict[str, dict[str, Any] | bool]:
    """Every row's speculative_config: METHODS, then the ADAPTIVE_OFF variants."""
    methods = dict(METHODS)
    for name, config in METHODS:
        if config and config["method"] == "ngram":
            methods[name] = config | NGRAM_LOOKUP
    for name in ADAPTIVE_OFF:
        methods[f"{name} adaptive off"] = methods[name] | {"adaptive": False}
    return methods
