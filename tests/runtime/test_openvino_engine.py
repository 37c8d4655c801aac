"""The openvino engine against the onnxruntime engine on the same (tiny) artifact, token for
token (greedy): alone, batched and joined mid-run, with chunked prefill, prefix caching and
preemption, past a sliding window; speculative output equals plain output on the openvino
engine; engine choice by the recorded preference and by request.

Both engines compute exactly (ONNX Runtime's matmul_accuracy_level 0; OpenVINO f32 with no
dynamic quantization: `EXACT_OPENVINO`), so their greedy tokens can be compared one for one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ingot.artifacts import read_manifest
from ingot.runtime import LoadedModel, SamplingParams
from ingot.runtime.engine_select import EngineUnavailable, select_engine
from ingot.runtime.engines.base import HostInfo, SessionError, SessionSettings
from ingot.runtime.engines.openvino import PLUGIN
from ingot.runtime.speculative import SpeculativeConfig
from ingot.runtime.speculative.load import DraftModel

from fixtures import openvino_artifact_of, with_openvino

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
SHARED = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps"
PROMPTS = [
    SHARED + " over the",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",
    SHARED + " again and",
    "import os\nprint(os.path",
]
ALWAYS = {"adaptive": False}  # draft every step


@pytest.fixture(scope="module")
def artifact(openvino_artifact) -> Path:
    return openvino_artifact


def _generate(artifact: Path, engine: str, prompts=PROMPTS, params=GREEDY, **load) -> list:
    generator = LoadedModel.load(artifact, engine=engine, **load).generator()
    return [c.token_ids for c in generator.generate(prompts, params)]


@pytest.fixture(scope="module")
def alone(artifact) -> list[list[int]]:
    """Each prompt's greedy tokens on ONNX Runtime, run alone with nothing cached."""
    return [
        _generate(artifact, "onnxruntime", [p], enable_prefix_caching=False)[0] for p in PROMPTS
    ]


def test_plain_greedy_equals_onnxruntime(artifact, alone):
    assert _generate(artifact, "openvino-cpu", enable_prefix_caching=False) == alone


@pytest.mark.parametrize(
    ("caching", "kv_cache_blocks", "budget"),
    [
        (True, None, 2048),
        (True, 4, 2048),  # 4 blocks of 32 = one 128-token sequence: preemption
        (False, 4, 2048),
        (True, None, 8),  # chunked prefill
    ],
)
def test_batched_equals_onnxruntime_alone(artifact, alone, caching, kv_cache_blocks, budget):
    model = LoadedModel.load(
        artifact,
        engine="openvino",
        kv_cache_blocks=kv_cache_blocks,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
    )
    generator = model.generator()
    for _ in range(2):  # the second round finds the first one's prompts in the cache
        assert [c.token_ids for c in generator.generate(PROMPTS, GREEDY)] == alone
    stats = generator.stats()
    if kv_cache_blocks is None:  # (a pool of 4 blocks keeps no prefix for the next round)
        assert (stats.prefix_cache_hits > 0) == caching
    else:
        assert stats.num_preemptions > 0
    assert model.pool.allocator.num_free == model.pool.num_blocks


def test_sequences_joining_mid_run(artifact, alone):
    model = LoadedModel.load(artifact, engine="openvino", enable_prefix_caching=False)
    generator = model.generator()
    ids = {generator.add(model.tokenizer.encode(p), GREEDY): i for i, p in enumerate(PROMPTS[:2])}
    for _ in range(5):  # the first two decode a few tokens before the others arrive
        generator.step()
    ids |= {generator.add(model.tokenizer.encode(p), GREEDY): i + 2 for i, p in
            enumerate(PROMPTS[2:])}  # fmt: skip
    got: dict[int, list[int]] = {}
    while generator.has_unfinished():
        for out in generator.step():
            if out.finished:
                got[ids[out.request_id]] = generator.pop_completion(out.request_id).token_ids
    assert [got[i] for i in range(len(PROMPTS))] == alone


def test_sliding_window_past_the_window(tmp_path_factory):
    # A window of 24 tokens, every prompt and its 40 new tokens far past it.
    artifact = openvino_artifact_of(tmp_path_factory, "ov-mistral", "mistral", sliding_window=24)
    assert read_manifest(artifact).model.sliding_window == 24
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    ours = _generate(artifact, "openvino", params=params, max_num_batched_tokens=16)
    assert ours == _generate(artifact, "onnxruntime", params=params)


# Weight forms: asymmetric int4 (u4 codes and zero points) in every layer but v_proj and
# up_proj (float), so q|k|v and gate|up are not fused; lm_head int8 per channel with zero
# points; Qwen2's q/k/v biases on the symmetric default.
ASYMMETRIC = [
    {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": False,
     "ignore": ["lm_head", "re:.*v_proj", "re:.*up_proj"]},
    {"method": "rtn", "bits": 8, "group_size": -1, "symmetric": False, "targets": ["lm_head"],
     "ignore": []},
]  # fmt: skip


FORMS = [("qwen2", None), ("llama", {"quantize": ASYMMETRIC})]


@pytest.mark.parametrize(("arch", "recipe"), FORMS, ids=["qwen2", "asymmetric"])
def test_model_and_weight_forms(tmp_path_factory, arch, recipe):
    artifact = openvino_artifact_of(tmp_path_factory, f"ov-{arch}", arch, recipe)
    assert _generate(artifact, "openvino") == _generate(artifact, "onnxruntime")


# The embedding and lm_head quantized (pipeline/export/embedding.py): one int8 table per row
# that a tied model's lookup and lm_head both read; untied, int8 blocks of 32 with zero points.
HEADS = {
    "tied-per-row": (True, {"group_size": -1, "symmetric": True}),
    "untied-g32-asymmetric": (False, {"group_size": 32, "symmetric": False}),
}


@pytest.mark.parametrize("case", sorted(HEADS))
def test_quantized_embedding_and_lm_head(tmp_path_factory, case):
    tied, grid = HEADS[case]
    heads = {"method": "rtn", "bits": 8, "targets": ["embed_tokens", "lm_head"], "ignore": []}
    recipe = {"quantize": [{"method": "rtn", "bits": 4, "group_size": 32}, {**heads, **grid}]}
    artifact = openvino_artifact_of(
        tmp_path_factory, f"ov-heads-{case}", recipe=recipe, tie_word_embeddings=tied
    )
    assert _generate(artifact, "openvino") == _generate(artifact, "onnxruntime")


def test_ngram_speculation_equals_plain(artifact, alone):
    config = {"method": "ngram", "num_speculative_tokens": 3, **ALWAYS}
    model = LoadedModel.load(artifact, engine="openvino", speculative_config=config)
    generator = model.generator()
    loop = "a b c d e f g a b c d e f g a b c d e f g a b c"
    prompts = [loop, *PROMPTS]
    plain = _generate(artifact, "openvino", prompts)
    for _ in range(2):
        assert [c.token_ids for c in generator.generate(prompts, GREEDY)] == plain
    stats = generator.speculation.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_draft_model_speculation_equals_plain(artifact, alone):
    """The artifact's own engine as its draft, opened as a draft is (one thread), then
    perturbed so drafts are rejected too: speculative output equals plain output."""
    model = LoadedModel.load(artifact, engine="openvino", speculative_config=False)
    layout = PLUGIN.kv_layout(model.manifest.graph, model.engine)
    draft_pool = layout.pool(model.pool.num_blocks)
    path = artifact / model.engine.path
    session = PLUGIN.open(path, model.engine, draft_pool, SessionSettings(drafting=True))
    model.draft = DraftModel(_Perturbed(session), draft_pool)
    model.speculative = SpeculativeConfig("draft_model", num_speculative_tokens=3, **ALWAYS)
    generator = model.generator()
    assert [c.token_ids for c in generator.generate(PROMPTS, GREEDY)] == alone
    stats = generator.speculation.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


class _Perturbed:
    """A draft session whose every fourth call's logits pick another token."""

    def __init__(self, session) -> None:
        self.session, self.calls = session, 0
        self.writes_pool, self.scratch_block = session.writes_pool, session.scratch_block

    def run(self, batch):
        logits, kv = self.session.run(batch)
        self.calls += 1
        if self.calls % 4 == 0:
            logits = logits.copy()
            logits[np.arange(len(logits)), logits.argmax(axis=-1)] = -np.inf
        return logits, kv


def test_engine_order_and_request(artifact, tmp_path):
    manifest = read_manifest(artifact)
    host = HostInfo.detect(("onnxruntime", "openvino"))
    assert select_engine(manifest, host)[0].name == "onnxruntime-cpu"  # the recorded order
    assert select_engine(manifest, host, "openvino")[0].name == "openvino-cpu"  # by kind
    assert select_engine(manifest, host, "openvino-cpu")[0].name == "openvino-cpu"  # by name
    first = with_openvino(artifact.parent / "art", tmp_path / "first", first=True)
    assert LoadedModel.load(first).engine.name == "openvino-cpu"
    with pytest.raises(EngineUnavailable, match=r"'tensorrt'.*has: onnxruntime-cpu \(onnxr"):
        select_engine(manifest, host, "tensorrt")
    old = HostInfo(host.cpu_flags, {"onnxruntime": "1.32.0", "openvino": "2025.1.0"})
    with pytest.raises(EngineUnavailable, match=r"needs openvino >=2026.4,<2026.5, found 2025"):
        select_engine(manifest, old, "openvino")


def test_what_the_engine_refuses(artifact):
    manifest = read_manifest(artifact)
    graph, record = manifest.graph, manifest.engines[1]
    assert record.engine == "openvino"
    with pytest.raises(SessionError, match="kv_block_size 16: .* blocks of 32 tokens"):
        PLUGIN.kv_layout(graph.model_copy(update={"kv_block_size": 16}), record)
    with pytest.raises(SessionError, match="kv_dtype fp8: .*no fp8 form"):
        PLUGIN.kv_layout(graph.model_copy(update={"kv_dtype": "fp8"}), record)
    host = HostInfo(frozenset(), {"openvino": "2026.4.1"})
    assert PLUGIN.problems(record, host) == []
    bad = {**record.session_options, "kv_cache_precision": "f32", "inference_precision": "bf16"}
    problems = PLUGIN.problems(record.model_copy(update={"session_options": bad}), host)
    assert problems == [
        "session_options.kv_cache_precision f32 needs inference_precision f32 (with bf16 "
        "activations a float cache is kept in bf16; u8 works with either)"
    ]
    odd = record.model_copy(update={"requires": {"openvino": ">=2026.4", "gpu": "yes"}})
    assert PLUGIN.problems(odd, host) == ["unknown requirements ['gpu']"]


@pytest.mark.parametrize(
    ("quantize", "why"),
    [
        ([{"method": "smoothquant", "weights": "rtn"}], "its inputs are quantized too"),
        ([{"method": "fp8", "activations": "none"}], r"f8e4m3'> \(FP8 weights\)"),
    ],
    ids=["w8a8", "fp8"],
)
def test_weight_forms_it_cannot_run_are_refused_naming_the_linear(tmp_path_factory, quantize, why):
    text = tmp_path_factory.mktemp("text") / "calibration.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. def add(a, b): return a\n" * 99)
    calibration = {"dataset": str(text), "samples": 4, "seq_len": 64}
    # The portable graph shipped (the openvino record reads it): the weights as exported,
    # not the onnxruntime engine's (whose FP8 weights are folded to fp32).
    portable = {"name": "tiny", "portable": True}
    recipe = {"quantize": quantize, "calibration": calibration, "artifact": portable}
    artifact = openvino_artifact_of(tmp_path_factory, "ov-refused", recipe=recipe)
    with pytest.raises(SessionError, match=rf"^layers\.0\.attn\.qkv_proj: .*{why}"):
        LoadedModel.load(artifact, engine="openvino")


def test_generate_command_takes_an_engine(artifact):
    from click.testing import CliRunner

    from ingot.cli import main

    def generate(engine: str) -> object:
        args = ["generate", str(artifact), "--prompt", PROMPTS[1], "--json", "--engine", engine]
        return CliRunner().invoke(main, args)

    ours, theirs = generate("openvino"), generate("onnxruntime-cpu")
    assert ours.exit_code == theirs.exit_code == 0, ours.output
    assert json.loads(ours.output)["token_ids"] == json.loads(theirs.output)["token_ids"]
    refused = generate("openvino-gpu")
    assert refused.exit_code != 0
    assert "--engine: engine 'openvino-gpu': this artifact has no engine" in refused.output


def test_feed_packs_real_rows_and_maps_logits_rows():
    """A decode, a verification of 3 tokens and a prefill chunk in one call: padded rows
    dropped, each sequence's table cut at its last token, logits rows s*Q + q -> packed."""
    from ingot.runtime.batch import build_inputs
    from ingot.runtime.engines.openvino.feed import paged_feed
    from ingot.runtime.kv_pool import KVPool

    pool = KVPool(1, 16, 4, 1, 2)  # blocks of 4 tokens
    seqs = []
    for past, new in ((9, [7]), (5, [1, 2, 3]), (0, [4, 5, 6, 8, 9])):
        table = pool.new_block_table()
        table.reserve(past + len(new))
        seqs.append((table, new, past))
    batch = build_inputs(seqs, scratch_block=pool.scratch_block, all_logits=True)
    call = paged_feed(batch, block_size=4)
    feed = call.feed
    assert call.padded_rows == 3 * 5 and list(call.rows) == [0, 5, 6, 7, 10, 11, 12, 13, 14]
    assert list(feed["input_ids"]) == [7, 1, 2, 3, 4, 5, 6, 8, 9]
    assert list(feed["positions"]) == [9, 5, 6, 7, 0, 1, 2, 3, 4]
    assert list(feed["past_lens"]) == [9, 5, 0]
    assert list(feed["subsequence_begins"]) == [0, 1, 4, 9]
    assert list(feed["block_indices_begins"]) == [0, 3, 5, 7]  # 10, 8 and 5 tokens
    tables = [seq[0].block_ids for seq in seqs]
    assert list(feed["block_indices"]) == [*tables[0][:3], *tables[1][:2], *tables[2][:2]]
    assert list(feed["logits_indices"]) == list(range(9))  # every real row, in order
    assert int(feed["max_context_len"]) == 10
    last = build_inputs(seqs, scratch_block=pool.scratch_block)  # each sequence's last row
    assert list(paged_feed(last, block_size=4).feed["logits_indices"]) == [0, 3, 8]
