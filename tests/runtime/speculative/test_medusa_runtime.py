"""Medusa drafting at runtime (runtime/speculative/medusa.py): the heads graph against numpy,
the target hidden rows the generator records for the heads (`MedusaSequence.last_hidden`),
greedy output equal to plain decoding with drafts both accepted and rejected, and the config
errors of an artifact without (enough) heads.

The exact tiny artifact has no heads of its own (the pipeline trains them): the tests open its
target with `hidden=True`, as LoadedModel.load does for a medusa artifact, and hand the
drafter a heads graph written here, or a double with the same `run(rows)`.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ingot.artifacts import read_manifest
from ingot.runtime import LoadedModel, SamplingParams
from ingot.runtime.batch import build_inputs
from ingot.runtime.engines.onnxruntime.session import EngineSession
from ingot.runtime.kv_pool import KVPool
from ingot.runtime.scheduler import SequenceState
from ingot.runtime.speculative import SpeculativeConfig
from ingot.runtime.speculative.load import make_drafter, resolve_config
from ingot.runtime.speculative.medusa import MedusaDrafter, MedusaHeads, MedusaSequence

from fixtures import SCHEDULER_ARGS, SCHEDULER_CASES

K = 3  # heads, and tokens drafted per step
GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
PROMPTS = [
    "a b c d e f g a b c d e f g a b c d e f g a b c",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",
    "import os\nprint(os.path",
    "def add(a, b):",
]


def write_heads(path: Path, weight: np.ndarray) -> Path:
    """A heads graph: hidden [N, H] @ weight [H, K*V] -> [N, K, V] -> argmax: draft_tokens
    [N, K] int64, its weight in an external data file beside it (as the artifact stores it)."""
    onnx = pytest.importorskip("onnx")  # build-time dependency, used here to write the graph
    from onnx import TensorProto, helper, numpy_helper  # build-time: skipped without onnx

    h, kv = weight.shape
    nodes = [
        helper.make_node("MatMul", ["hidden", "weight"], ["scores"]),  # [N, K*V]
        helper.make_node("Reshape", ["scores", "per_head"], ["heads"]),  # [N, K, V]
        helper.make_node("ArgMax", ["heads"], ["draft_tokens"], axis=-1, keepdims=0),  # [N, K]
    ]
    init = [
        numpy_helper.from_array(weight, "weight"),
        numpy_helper.from_array(np.array([0, K, kv // K], np.int64), "per_head"),
    ]
    graph = helper.make_graph(
        nodes,
        "medusa_heads",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["N", h])],
        [helper.make_tensor_value_info("draft_tokens", TensorProto.INT64, ["N", K])],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        location=path.name + ".data",
        size_threshold=1024,  # small tensors (the Reshape shape) stay inline
    )
    return path


def test_heads_graph_against_numpy(tmp_path):
    h, v, n = 64, 320, 5
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(h, K * v)).astype(np.float32)
    heads = MedusaHeads.open(write_heads(tmp_path / "heads" / "model.onnx", weight))
    rows = rng.normal(size=(n, h)).astype(np.float32)  # [N, H]
    tokens = heads.run(rows)
    assert tokens.shape == (n, K) and tokens.dtype == np.int64
    scores = (rows @ weight).reshape(n, K, v)  # [N, K, V]
    np.testing.assert_array_equal(tokens, scores.argmax(-1))


def test_drafter_asks_the_heads_once_for_the_sequences_that_draft():
    calls = []

    class Heads:
        def run(self, rows):  # [N, 2] -> [N, K]: row[0], row[0] + 1, ...
            calls.append(rows.copy())
            return rows[:, :1].astype(np.int64) + np.arange(K)

    def seq(hidden):
        state = None if hidden is None else MedusaSequence(np.array([hidden, 0], np.float32))
        return SequenceState(0, [5, 6], 1, table=None, drafter_state=state)

    drafter = MedusaDrafter(Heads())
    seqs = [seq(1), seq(None), seq(4), seq(7)]
    assert drafter.propose(seqs, [2, 3, 0, 3]) == [[1, 2], [], [], [7, 8, 9]]
    assert len(calls) == 1  # one call, the rows of the sequences that draft only
    np.testing.assert_array_equal(calls[0], [[1, 0], [7, 0]])
    assert drafter.propose(seqs, [0, 3, 0, 0]) == [[], [], [], []]
    assert len(calls) == 1  # nothing to draft: no call


@pytest.fixture(scope="module")
def plain(exact_artifact) -> dict[tuple[int, ...], list[int]]:
    """Each prompt's token ids -> its tokens after plain greedy decoding (prompt included)."""
    generator = LoadedModel.load(exact_artifact, speculative_config=False).generator()
    completions = generator.generate(PROMPTS, GREEDY)
    return {tuple(c.prompt_token_ids): c.prompt_token_ids + c.token_ids for c in completions}


class _OracleHeads:
    """A heads double: proposes each sequence's plain greedy continuation, with one token of
    each proposal but every (K + 1)-th made wrong, so drafts are accepted and rejected. A row
    is the `last_hidden` of a running sequence's MedusaSequence: that is how it knows whose row
    it is."""

    def __init__(self, plain: dict[tuple[int, ...], list[int]], vocab_size: int) -> None:
        self.plain, self.vocab_size = plain, vocab_size
        self.scheduler = None  # the generator's, set once it exists
        self.proposals = 0

    def run(self, rows: np.ndarray) -> np.ndarray:
        tokens = np.zeros((len(rows), K), np.int64)  # [N, K]
        for n, row in enumerate(rows):
            seq = next(
                s
                for s in self.scheduler.running
                if s.drafter_state is not None and np.array_equal(s.drafter_state.last_hidden, row)
            )
            full = self.plain[tuple(seq.token_ids[: seq.num_prompt_tokens])]
            right = full[len(seq.token_ids) : len(seq.token_ids) + K]  # what follows its last
            tokens[n, : len(right)] = right
            wrong = self.proposals % (K + 1)  # K: all right
            if wrong < K:
                tokens[n, wrong] = (tokens[n, wrong] + 1) % self.vocab_size
            self.proposals += 1
        return tokens


def _medusa_generator(artifact: Path, heads, **load):
    """A model and generator drafting with `heads`, the target's session binding `hidden`;
    every step drafts (no back-off, no timing)."""
    model = LoadedModel.load(artifact, speculative_config=False, **load)
    model.session = EngineSession(
        artifact / model.engine.path, model.pool, model.engine.session_options, hidden=True
    )
    model.speculative = SpeculativeConfig(
        "medusa", num_speculative_tokens=K, min_acceptance_rate=0.0, adaptive=False
    )
    model.heads = heads
    generator = model.generator()
    assert isinstance(generator.speculation.drafter, MedusaDrafter)
    if isinstance(heads, _OracleHeads):
        heads.scheduler = generator.scheduler
    return model, generator


def _oracle_generator(artifact: Path, plain, **load):
    vocab_size = read_manifest(artifact).model.vocab_size
    return _medusa_generator(artifact, _OracleHeads(plain, vocab_size), **load)


class _Reference:
    """The target's hidden row at a sequence's last position, computed apart: its own session
    and pool, the tokens up to that position in one prefill call."""

    def __init__(self, model: LoadedModel, artifact: Path) -> None:
        graph = model.manifest.graph
        blocks = -(-model.manifest.model.max_seq_len // graph.kv_block_size)
        shape = (graph.kv_block_size, graph.num_kv_heads, graph.head_dim)
        self.pool = KVPool(graph.num_layers, blocks, *shape, model.pool.dtype)
        path = artifact / model.engine.path
        self.session = EngineSession(path, self.pool, model.engine.session_options, hidden=True)
        self.window = model.sliding_window

    def hidden(self, token_ids: list[int]) -> np.ndarray:
        """[H]: the hidden row of the last of `token_ids`."""
        table = self.pool.new_block_table()
        table.slots_for(len(token_ids))
        try:
            scratch = self.session.scratch_block
            self.session.run(
                build_inputs([(table, token_ids, 0)], self.window, scratch_block=scratch)
            )
            return self.session.hidden[0].copy()
        finally:
            table.release()


def test_last_hidden_is_the_row_that_produced_the_last_token(exact_artifact, plain):
    """After every step (a small budget: chunked prefill, several chunks per call, drafts cut),
    each running sequence's last_hidden (its MedusaSequence) is the target's hidden row at its
    last position but one: the position whose logits produced its last token."""
    model, generator = _oracle_generator(exact_artifact, plain, max_num_batched_tokens=16)
    reference = _Reference(model, exact_artifact)
    for prompt in PROMPTS:
        generator.add(model.tokenizer.encode(prompt), GREEDY)
    checked = 0
    while generator.has_unfinished():
        generator.step()
        for seq in generator.scheduler.running:
            if len(seq.token_ids) == seq.num_prompt_tokens:
                continue  # its prefill has not completed: no token produced yet
            expected = reference.hidden(seq.token_ids[:-1])  # [H]
            got = seq.drafter_state.last_hidden
            error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
            assert error <= 1e-5, (seq.id, len(seq.token_ids), error)
            checked += 1
    assert checked > 0
    stats = generator.speculation.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # verified both ways


@pytest.mark.parametrize(SCHEDULER_ARGS, SCHEDULER_CASES)
def test_medusa_greedy_equals_plain(exact_artifact, plain, caching, kv_cache_blocks, budget):
    model, generator = _oracle_generator(
        exact_artifact,
        plain,
        kv_cache_blocks=kv_cache_blocks,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
    )
    for _ in range(2):  # the second round finds the first one's prompts in the cache
        completions = generator.generate(PROMPTS, GREEDY)
        got = [c.prompt_token_ids + c.token_ids for c in completions]
        assert got == [plain[tuple(c.prompt_token_ids)] for c in completions]
    stats = generator.speculation.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # accepted and rejected
    if kv_cache_blocks is not None:
        assert generator.stats().num_preemptions > 0
    assert model.pool.allocator.num_free == model.pool.num_blocks  # rejected slots went back


def test_a_heads_graph_drafts_through_the_generator(exact_artifact, plain, tmp_path):
    """Random heads (a graph, not a double): drafts are mostly rejected, output unchanged."""
    info = read_manifest(exact_artifact).model
    rng = np.random.default_rng(1)
    weight = rng.normal(size=(info.hidden_size, K * info.vocab_size)).astype(np.float32)
    heads = MedusaHeads.open(write_heads(tmp_path / "heads" / "model.onnx", weight))
    _, generator = _medusa_generator(exact_artifact, heads)
    completions = generator.generate(PROMPTS, GREEDY)
    got = [c.prompt_token_ids + c.token_ids for c in completions]
    assert got == [plain[tuple(c.prompt_token_ids)] for c in completions]
    assert generator.speculation.stats.num_draft_tokens > 0


def test_medusa_needs_an_artifact_with_heads(exact_artifact):
    with pytest.raises(ValueError, match="needs an artifact built with Medusa heads"):
        LoadedModel.load(exact_artifact, speculative_config={"method": "medusa"})
    with pytest.raises(ValueError, match="needs the artifact's Medusa heads"):
        make_drafter(SpeculativeConfig("medusa"), None, None)


def test_num_speculative_tokens_is_at_most_the_heads():
    # What resolve_config reads of a manifest whose recipe built 3 heads and drafts 2.
    recorded = SimpleNamespace(
        method="medusa",
        num_speculative_tokens=2,
        prompt_lookup_min=1,
        prompt_lookup_max=4,
        draft=None,
        heads=SimpleNamespace(num_heads=3),
    )
    manifest = SimpleNamespace(speculative=recorded)
    assert resolve_config(manifest, None).num_speculative_tokens == 2
    assert resolve_config(manifest, {"num_speculative_tokens": 3}).method == "medusa"
    with pytest.raises(ValueError, match="num_speculative_tokens 4 exceeds the artifact's 3"):
        resolve_config(manifest, {"num_speculative_tokens": 4})
