"""The openvino engine's extra outputs and its 8-bit cache against the onnxruntime engine on
the same artifacts: the `hidden` rows Medusa heads read and the `aux_hidden` rows an EAGLE-3
draft reads equal ONNX Runtime's; Medusa and EAGLE-3 output equals plain output on the
openvino engine; an int8 artifact runs on OpenVINO's own u8 cache (per-block scales, not the
artifact's calibrated per-head ones: logits close to ONNX Runtime's, not equal)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ingot.runtime import LoadedModel, SamplingParams
from ingot.runtime.batch import build_inputs
from ingot.runtime.engines.base import SessionSettings
from ingot.runtime.engines.onnxruntime.session import EngineSession
from ingot.runtime.engines.openvino import PLUGIN
from ingot.runtime.speculative import SpeculativeConfig
from ingot.runtime.speculative.medusa import MedusaDrafter

from fixtures import make_checkpoint, with_openvino, write_recipe

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
PROMPTS = [
    "a b c d e f g a b c d e f g a b c",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",
    "import os\nprint(os.path",
]
K = 3


def _built(
    tmp_path_factory, name: str, layers: int = 2, kv_dtype: str = "fp32", **overrides
) -> Path:
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    tmp = tmp_path_factory.mktemp(name)
    text = tmp / "calibration.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. def add(a, b): return a\n" * 99)
    recipe = write_recipe(
        tmp / "r.yaml",
        make_checkpoint(tmp / "ckpt", num_hidden_layers=layers),
        kv_cache={"dtype": kv_dtype, "block_size": 32},
        targets=[{"engine": "onnxruntime", "device": "cpu", "matmul_accuracy_level": 0}],
        calibration={"dataset": str(text), "samples": 4, "seq_len": 64},
        **overrides,
    )
    built = build(recipe, tmp / "art", cache=StageCache(tmp / "cache")).artifact
    return with_openvino(built, tmp / "both")


@pytest.fixture(scope="module")
def eagle_artifact(tmp_path_factory) -> Path:
    train = {"steps": 3, "batch_size": 2, "span": 32}
    speculative = {"method": "eagle", "num_speculative_tokens": K, "heads": {"train": train}}
    return _built(tmp_path_factory, "ov-eagle", layers=3, speculative=speculative)


def _prefill(session, pool, prompts: list[list[int]]) -> object:
    """One call prefilling `prompts` side by side (padded rows), every row's logits."""
    seqs = []
    for ids in prompts:
        table = pool.new_block_table()
        table.reserve(len(ids))
        seqs.append((table, ids, 0))
    batch = build_inputs(seqs, scratch_block=session.scratch_block, all_logits=True)
    session.run(batch)
    return batch


def test_hidden_and_aux_rows_equal_onnxruntime(eagle_artifact):
    model = LoadedModel.load(eagle_artifact, engine="openvino", speculative_config=False)
    engine, graph = model.engine, model.manifest.graph
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    settings = SessionSettings(hidden=True, aux=True)
    ours = PLUGIN.open(eagle_artifact / engine.path, engine, model.pool, settings)
    batch = _prefill(ours, model.pool, prompts)
    ort = LoadedModel.load(eagle_artifact, engine="onnxruntime", speculative_config=False)
    path = eagle_artifact / ort.engine.path
    theirs = EngineSession(path, ort.pool, ort.engine.session_options, hidden=True, aux=True)
    _prefill(theirs, ort.pool, prompts)
    rows = batch.real_rows  # aux_hidden: every row s*Q + q; padded rows are no one's
    assert batch.real_rows is not None and len(rows) < batch.input_ids.size
    for got, want in (
        (ours.hidden, theirs.hidden),
        (ours.aux_hidden[rows], theirs.aux_hidden[rows]),
    ):
        np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max())
    assert ours.aux_hidden.shape == theirs.aux_hidden.shape
    assert graph.kv_block_size == 32


def _plain(artifact: Path) -> list[list[int]]:
    generator = LoadedModel.load(artifact, engine="openvino", speculative_config=False).generator()
    return [c.token_ids for c in generator.generate(PROMPTS, GREEDY)]


def test_eagle_speculation_equals_plain(eagle_artifact):
    config = {"method": "eagle", "num_speculative_tokens": K, "adaptive": False}
    model = LoadedModel.load(eagle_artifact, engine="openvino", speculative_config=config)
    generator = model.generator()
    assert [c.token_ids for c in generator.generate(PROMPTS, GREEDY)] == _plain(eagle_artifact)
    assert generator.speculation.stats.num_draft_tokens > 0


class _OracleHeads:
    """Medusa heads that propose each sequence's plain continuation, every (K + 1)-th proposal
    with one token made wrong (tests/runtime/speculative/test_medusa_runtime.py's double)."""

    num_heads = K

    def __init__(self, plain: dict[tuple[int, ...], list[int]]) -> None:
        self.plain, self.scheduler, self.proposals = plain, None, 0

    def run(self, rows: np.ndarray) -> np.ndarray:
        tokens = np.zeros((len(rows), K), np.int64)
        for n, row in enumerate(rows):
            seq = next(
                s
                for s in self.scheduler.running
                if s.drafter_state is not None and np.array_equal(s.drafter_state.last_hidden, row)
            )
            full = self.plain[tuple(seq.token_ids[: seq.num_prompt_tokens])]
            right = full[len(seq.token_ids) : len(seq.token_ids) + K]
            tokens[n, : len(right)] = right
            if self.proposals % (K + 1) < K:
                tokens[n, self.proposals % (K + 1)] += 1
            self.proposals += 1
        return tokens


def test_medusa_speculation_equals_plain(eagle_artifact):
    model = LoadedModel.load(eagle_artifact, engine="openvino", speculative_config=False)
    completions = model.generator().generate(PROMPTS, GREEDY)
    plain = {tuple(c.prompt_token_ids): c.prompt_token_ids + c.token_ids for c in completions}
    path = eagle_artifact / model.engine.path
    model.session = PLUGIN.open(path, model.engine, model.pool, SessionSettings(hidden=True))
    model.speculative = SpeculativeConfig(
        "medusa", num_speculative_tokens=K, min_acceptance_rate=0.0, adaptive=False
    )
    model.heads = heads = _OracleHeads(plain)
    generator = model.generator()
    assert isinstance(generator.speculation.drafter, MedusaDrafter)
    heads.scheduler = generator.scheduler
    got = [c.prompt_token_ids + c.token_ids for c in generator.generate(PROMPTS, GREEDY)]
    assert got == [plain[tuple(model.tokenizer.encode(p))] for p in PROMPTS]
    stats = generator.speculation.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_int8_kv_runs_on_openvinos_u8_cache(tmp_path_factory):
    artifact = _built(tmp_path_factory, "ov-int8", kv_dtype="int8")
    logits = {}
    for engine in ("onnxruntime", "openvino"):
        model = LoadedModel.load(artifact, engine=engine)
        ids = model.tokenizer.encode(PROMPTS[1])
        session, pool = model.session, model.pool
        table = pool.new_block_table()
        table.reserve(len(ids) - 1)
        scratch = session.scratch_block
        prefill = build_inputs([(table, ids[:-1], 0)], scratch_block=scratch, all_logits=True)
        first = session.run(prefill)[0].copy()  # [T, V], writing the cache
        table.reserve(1)  # the last token, attending to the cached 8-bit K/V
        step = build_inputs([(table, ids[-1:], len(ids) - 1)], scratch_block=scratch)
        logits[engine] = (first, session.run(step)[0].copy())
        if engine == "openvino":  # OpenVINO's own u8 blocks: scales and zero points inside
            hkv, d = model.manifest.graph.num_kv_heads, model.manifest.graph.head_dim
            assert pool.k[0].shape[1:] == (hkv, 40, d) and pool.v[0].shape[1:] == (hkv, 32, d + 8)
    # Two different 8-bit forms of the same K/V: close relative to the logits' scale (greedy
    # tokens can part on this random tiny model, where the argmax is near a tie).
    for ours, theirs in zip(logits["openvino"], logits["onnxruntime"], strict=True):
        assert np.abs(ours - theirs).max() <= 0.05 * np.abs(theirs).max()
