"""EAGLE-3 drafting at runtime (runtime/speculative/eagle.py) over fakes: which features the
generator records for the draft (`record_features`), how the draft is fed them (`propose`:
tok[p+1] at position p with fc(f_p), then its own draft_hidden), what happens to them after
preemption or a prefix-cache hit, greedy output equal to plain decoding, and the sessions on
tiny graphs.

The fake target's features of a row are (token, position, 0), its logits a one-hot of the next
token: token + 1, or + 2 after a position p with p % 5 == 4. The fake draft proposes token + 1
from its input: accepted except where the target's rule jumps, so both outcomes occur.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ingot.artifacts import sha256_file, write_manifest
from ingot.runtime import LoadedModel
from ingot.runtime.batch import build_inputs
from ingot.runtime.engines.base import SessionError
from ingot.runtime.engines.onnxruntime.session import EagleLayerSession, EngineSession
from ingot.runtime.kv_pool import KVPool
from ingot.runtime.model import drafter_files
from ingot.runtime.sampling import SamplingParams
from ingot.runtime.scheduler import SequenceState
from ingot.runtime.speculative import Speculation, SpeculativeConfig
from ingot.runtime.speculative.eagle import EagleDraft, EagleDrafter, EagleFc
from ingot.runtime.speculative.load import make_drafter, resolve_config

from fixtures import write_tokenizer
from generator_support import V, fake_generator, new_kv, picked_rows

FC_MARK, DRAFT_MARK = 100.0, -1.0  # hidden[:, 2] of fc'd features / of the draft's own rows
GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


def features(tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The fake target's features [n, 3] of rows (token, position)."""
    rows = np.zeros((len(tokens), 3), np.float32)
    rows[:, 0], rows[:, 1] = tokens, positions
    return rows


def target_next(tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    return np.where(positions % 5 == 4, tokens + 2, tokens + 1) % V


class AuxTarget:
    """The target: logits and K/V as generator_support's fakes (K = position + 1, V = token),
    aux_hidden = features of every row (padding included), written into one buffer reused
    while the call's shape repeats, as the session's: a drafter that kept a view would see it
    overwritten."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self._aux = np.empty((0, 3), np.float32)

    def run(self, batch):
        ids, pos = batch.input_ids, batch.positions
        logits = np.zeros((*ids.shape, V), np.float32)
        np.put_along_axis(logits, target_next(ids, pos)[..., None], 10.0, axis=-1)
        rows = features(ids.reshape(-1), pos.reshape(-1))  # [S*Q, 3]
        if self._aux.shape != rows.shape:
            self._aux = np.empty_like(rows)
        self._aux[:] = rows
        return picked_rows(batch, logits), new_kv(pos, ids)

    @property
    def aux_hidden(self) -> np.ndarray:
        return self._aux


class FakeFc:
    """fc(f) = f + (0, 0, FC_MARK): the row keeps its token and position, marked as fc'd."""

    def __init__(self) -> None:
        self.calls: list[np.ndarray] = []

    def run(self, rows: np.ndarray) -> np.ndarray:
        self.calls.append(rows.copy())
        return rows + np.array([0, 0, FC_MARK], np.float32)


class FakeLayer:
    """The draft layer: proposes input token + 1 at each row, draft_hidden = (that token, the
    row's position, DRAFT_MARK); K = position + 1, V = the input token.

    Every call checks the alignment of its real rows against the target's pool (which holds
    K = position + 1, V = token at each computed slot): an fc'd row at position p carries the
    features of the token the target computed at p, a draft row the token and position of the
    row before it (the draft it feeds back)."""

    def __init__(self, target_pool: KVPool) -> None:
        self.target = target_pool
        self.calls: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # ids, positions, hidden

    def run(self, batch, hidden):
        s, q = batch.input_ids.shape
        real = np.arange(s * q) if batch.real_rows is None else batch.real_rows
        ids = batch.input_ids.reshape(-1)[real]
        pos = batch.positions.reshape(-1)[real]
        rows = hidden.reshape(s * q, -1)[real]
        self.calls.append((ids, pos, rows.copy()))
        fed = rows[:, 2] == FC_MARK
        assert fed.all() or not fed.any(), "a call is the catch-up or a draft step, not both"
        if fed.any():
            k = self.target.k[0].reshape(-1, 2)[batch.slots, 0]  # [T]: position + 1
            v = self.target.v[0].reshape(-1, 2)[batch.slots, 0]  # [T]: the token there
            np.testing.assert_array_equal(k, pos + 1)  # the target computed position p
            np.testing.assert_array_equal(rows[:, 1], pos)  # f_p at position p
            np.testing.assert_array_equal(rows[:, 0], v)  # f_p of the token at p
        else:
            assert q == 1 and (rows[:, 2] == DRAFT_MARK).all()
            np.testing.assert_array_equal(rows[:, 1], pos - 1)  # h of the previous position
            np.testing.assert_array_equal(rows[:, 0], ids)  # ... that proposed this token
        last = batch.logits_indices
        tokens = (batch.input_ids.reshape(-1)[last] + 1) % V  # [N]
        out = np.stack(
            [tokens, batch.positions.reshape(-1)[last], np.full(len(last), DRAFT_MARK)], -1
        ).astype(np.float32)
        k = np.broadcast_to((batch.positions + 1).astype(np.float32)[..., None], (s, q, 2))
        v = np.broadcast_to(batch.input_ids.astype(np.float32)[..., None], (s, q, 2))
        return tokens, out, [(k, v)]


def _draft(target_pool: KVPool) -> EagleDraft:
    pool = KVPool(1, target_pool.num_blocks, target_pool.block_size, 1, 2)
    return EagleDraft(FakeLayer(target_pool), FakeFc(), pool)


def _sequence(pool: KVPool, tokens: list[int], reserve: int = 0) -> SequenceState:
    """A sequence whose target computed every token but the last (K/V written as the fake
    target's), with slots for the last token and `reserve` drafts."""
    seq = SequenceState(0, list(tokens), 2, pool.new_block_table())
    n = len(tokens) - 1
    slots = seq.table.slots_for(n)
    pool.write(slots, 0, np.repeat(np.arange(1, n + 1.0)[:, None], 2, 1), _col(tokens[:n]))
    seq.table.slots_for(1 + reserve)
    return seq


def _col(values) -> np.ndarray:
    return np.repeat(np.asarray(values, np.float32)[:, None], 2, 1)


def _held(seq: SequenceState) -> np.ndarray:
    """The features pending in `seq`'s EagleSequence [m, 3] (none without one)."""
    state = seq.drafter_state
    return np.concatenate(state.rows) if state is not None and state.rows else np.zeros((0, 3))


def _start(seq: SequenceState) -> int | None:
    """Where `seq`'s pending features start: the draft took the positions before as computed."""
    return None if seq.drafter_state is None else seq.drafter_state.start


def test_propose_feeds_each_position_the_next_token_and_its_features():
    pool = KVPool(2, 16, 4, 1, 2)
    drafter = EagleDrafter(_draft(pool))
    tokens = [10, 11, 12, 13, 14]  # n = 4: f_0 .. f_3 known
    seq = _sequence(pool, tokens, reserve=3)
    drafter.record_features(seq, 0, features(np.array(tokens[:4]), np.arange(4)))
    assert drafter.propose([seq], [3]) == [[15, 16, 17]]

    layer, fc = drafter.draft.layer, drafter.draft.fc
    assert len(fc.calls) == 1 and len(fc.calls[0]) == 4
    (ids1, pos1, h1), (ids2, pos2, h2), (ids3, pos3, h3) = layer.calls
    assert ids1.tolist() == [11, 12, 13, 14] and pos1.tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(h1[:, :2], [[10, 0], [11, 1], [12, 2], [13, 3]])
    # d1 = 15 and its h1 at position 3 -> position 4; d2 = 16 -> position 5.
    assert (ids2.tolist(), pos2.tolist(), h2[0].tolist()) == ([15], [4], [15, 3, DRAFT_MARK])
    assert (ids3.tolist(), pos3.tolist(), h3[0].tolist()) == ([16], [5], [16, 4, DRAFT_MARK])
    # Consumed: the draft holds positions < n; the drafted positions' K/V are in its pool.
    assert _start(seq) == 4 and not seq.drafter_state.rows
    slots = build_inputs([(seq.table, [0] * 6, 0)]).slots  # positions 0..5
    np.testing.assert_array_equal(drafter.draft.pool.k[0].reshape(-1, 2)[slots, 0], range(1, 7))
    np.testing.assert_array_equal(
        drafter.draft.pool.v[0].reshape(-1, 2)[slots, 0], [11, 12, 13, 14, 15, 16]
    )


def test_one_fc_call_for_every_sequence_and_none_for_those_not_ready():
    pool = KVPool(2, 32, 4, 1, 2)
    drafter = EagleDrafter(_draft(pool))
    a = _sequence(pool, [20, 21, 22], reserve=2)
    b = _sequence(pool, [30, 31, 32, 33, 34, 35], reserve=1)
    late = _sequence(pool, [40, 41, 42, 43], reserve=2)  # its last row was never recorded
    idle = _sequence(pool, [50, 51], reserve=0)
    drafter.record_features(a, 0, features(np.array([20, 21]), np.arange(2)))
    drafter.record_features(b, 0, features(np.array([30, 31, 32, 33, 34]), np.arange(5)))
    drafter.record_features(late, 0, features(np.array([40, 41]), np.arange(2)))
    drafter.record_features(idle, 0, features(np.array([50]), np.arange(1)))
    assert drafter.propose([a, b, late, idle], [2, 1, 2, 0]) == [[23, 24], [36], [], []]
    assert [len(c) for c in drafter.draft.fc.calls] == [7]  # a's 2 rows, then b's 5
    assert [len(ids) for ids, _, _ in drafter.draft.layer.calls] == [7, 1]  # b stops at k = 1
    assert _start(late) == 0 and len(_held(late)) == 2  # kept for later
    assert _start(idle) == 0 and len(_held(idle)) == 1  # k = 0: not consumed


def test_kept_rows_continue_after_propose_and_the_buffer_restarts_where_rows_do_not():
    pool = KVPool(2, 16, 4, 1, 2)
    drafter = EagleDrafter(_draft(pool))
    tokens = [10, 11, 12, 13, 14]
    seq = _sequence(pool, tokens, reserve=2)
    drafter.record_features(seq, 0, features(np.array(tokens[:4]), np.arange(4)))
    drafter.propose([seq], [2])
    # Verification kept token 14 and the accepted draft 15; 16 is the bonus token.
    seq.token_ids += [15, 16]
    drafter.record_features(seq, 4, features(np.array([14, 15]), np.array([4, 5])))
    assert _start(seq) == 4
    np.testing.assert_array_equal(_held(seq)[:, 1], [4, 5])
    # A row that skips position 6 (features never computed): the buffer restarts there.
    drafter.record_features(seq, 7, features(np.array([17]), np.array([7])))
    assert _start(seq) == 7 and len(_held(seq)) == 1
    # Preempted (the draft pool holds none of it: its rows go) and recomputed from 0: restart.
    drafter.preempted(seq)
    assert seq.drafter_state is None
    drafter.record_features(seq, 0, features(np.arange(10, 16), np.arange(6)))
    assert _start(seq) == 0
    np.testing.assert_array_equal(_held(seq)[:, 1], range(6))


def test_recomputed_rows_replace_the_tail_of_what_is_pending():
    """Preempted before it ever drafted (its buffer still from position 0) and readmitted
    from a cached prefix: the rows before the cached boundary stay, the new ones follow."""
    seq = SequenceState(0, list(range(10, 22)), 12, table=None)
    drafter = EagleDrafter(draft=None)
    drafter.record_features(seq, 0, features(np.arange(10, 14), np.arange(4)))
    drafter.record_features(seq, 4, features(np.arange(14, 20), np.arange(4, 10)))
    drafter.preempted(seq)
    np.testing.assert_array_equal(_held(seq)[:, 1], range(10))  # pending from 0: kept
    drafter.record_features(seq, 8, features(np.arange(18, 21), np.arange(8, 11)))
    assert _start(seq) == 0
    np.testing.assert_array_equal(_held(seq)[:, 1], range(11))


def test_a_prefix_cache_hit_starts_the_buffer_at_the_first_computed_position():
    seq = SequenceState(0, list(range(10, 22)), 12, table=None)
    EagleDrafter(draft=None).record_features(seq, 8, features(np.arange(18, 22), np.arange(8, 12)))
    assert _start(seq) == 8


def test_record_copies_the_rows():
    seq = SequenceState(0, [1, 2, 3], 3, table=None)
    rows = features(np.array([1, 2]), np.arange(2))
    EagleDrafter(draft=None).record_features(seq, 0, rows)
    rows[:] = -5  # the session writes its buffer again
    np.testing.assert_array_equal(_held(seq)[:, 1], [0, 1])


def _eagle_generator(tokenizer, num_blocks=64, **config):
    spec = config.pop("spec", {})
    generator = fake_generator(AuxTarget, tokenizer, num_blocks=num_blocks, **config)
    settings = {"num_speculative_tokens": 3, "min_acceptance_rate": 0.0, "adaptive": False}
    speculative = SpeculativeConfig("eagle", **{**settings, **spec})
    drafter = make_drafter(speculative, None, None, eagle=_draft(generator.pool))
    generator.speculation = Speculation(speculative, drafter)
    return generator


PROMPTS = [
    [10, 11, 12, 13, 14, 15, 16, 17, 18],
    [10, 11, 12, 13, 14, 15, 16, 17, 50, 51],  # shares two blocks with the first
    [200],
    [70, 71, 72, 73, 74, 75],
]


def _run_checking_features(generator, prompts, params, always_drafts=True):
    """Generate step by step; after each step every running sequence whose prompt is done
    holds the features of positions from its EagleSequence's start to its computed tokens, and
    nothing else (unless a step did not draft: then what it holds is only checked to be
    right)."""
    ids = [generator.add(p, q) for p, q in zip(prompts, params, strict=True)]
    while generator.has_unfinished():
        generator.step()
        for seq in generator.scheduler.running:
            if seq.num_remaining != 1:
                continue  # mid-prefill
            if not always_drafts and seq.drafter_state is None:
                continue  # nothing recorded since its last restart
            begin, held = _start(seq), _held(seq)
            end = begin + len(held)
            if always_drafts:
                assert end == seq.num_computed == len(seq.token_ids) - 1
            tokens = np.array(seq.token_ids[begin:end])
            np.testing.assert_array_equal(held, features(tokens, np.arange(begin, end)))
    return [generator.pop_completion(i).token_ids for i in ids]


@pytest.mark.parametrize(
    ("caching", "num_blocks", "budget"),
    [(True, 64, 2048), (False, 64, 2048), (True, 16, 2048), (True, 64, 8)],
    ids=["cached", "uncached", "preempting", "chunked"],
)
def test_greedy_output_equals_plain_decoding(tokenizer, caching, num_blocks, budget):
    options = dict(enable_prefix_caching=caching, max_num_batched_tokens=budget)
    params = [GREEDY] * len(PROMPTS)
    plain = fake_generator(AuxTarget, tokenizer, num_blocks=num_blocks, **options)
    expected = [c.token_ids for c in plain.generate(PROMPTS, GREEDY)]
    generator = _eagle_generator(tokenizer, num_blocks, **options)
    for _ in range(2):  # the second round finds the first one's prompts in the cache
        assert _run_checking_features(generator, PROMPTS, params) == expected
    stats = generator.speculation.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # accepted and rejected
    if num_blocks == 16:
        assert generator.stats().num_preemptions > 0
    if caching:
        assert generator.stats().prefix_cache_hits > 0
    assert generator.pool.allocator.num_free == generator.pool.num_blocks


def test_features_are_not_kept_while_no_step_drafts_and_drafting_resumes_after(tokenizer):
    """Above disable_by_batch_size running requests no step drafts and no features are kept;
    once a request finishes, the others restart their buffers and draft again."""
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in (4, 20, 20)]
    prompts = PROMPTS[1:]
    plain = fake_generator(AuxTarget, tokenizer)
    expected = [c.token_ids for c in plain.generate(prompts, params)]
    generator = _eagle_generator(tokenizer, spec={"disable_by_batch_size": 2})
    drafter, running = generator.speculation.drafter, []
    record = drafter.record_features

    def counting_record(seq, start, rows):
        running.append(len(generator.scheduler.running))
        record(seq, start, rows)

    drafter.record_features = counting_record
    assert _run_checking_features(generator, prompts, params, always_drafts=False) == expected
    assert running and max(running) <= 2  # none kept while 3 ran
    assert generator.speculation.stats.num_accepted_tokens > 0


def test_eagle3_is_an_alias_and_the_artifact_must_have_the_draft():
    assert SpeculativeConfig.from_dict({"method": "eagle3"}).method == "eagle"
    assert SpeculativeConfig("eagle3", num_speculative_tokens=2).method == "eagle"
    with pytest.raises(ValueError, match="supported: ngram, draft_model, medusa, eagle"):
        SpeculativeConfig("eagle2")
    recorded = SimpleNamespace(
        method="medusa",
        num_speculative_tokens=2,
        prompt_lookup_min=1,
        prompt_lookup_max=4,
        draft=None,
        heads=SimpleNamespace(num_heads=3),
        eagle=None,
    )
    with pytest.raises(ValueError, match="needs an artifact built with an EAGLE-3 draft"):
        resolve_config(SimpleNamespace(speculative=recorded), {"method": "eagle3"})
    with pytest.raises(ValueError, match="needs the artifact's EAGLE-3 draft"):
        make_drafter(SpeculativeConfig("eagle"), None, None)


def test_the_kv_budget_pays_for_the_draft_pool():
    eagle = SimpleNamespace(kv_block_size=16, num_kv_heads=2, head_dim=8)
    manifest = SimpleNamespace(speculative=SimpleNamespace(eagle=eagle))
    config = SpeculativeConfig("eagle")
    drafter = drafter_files(Path("art"), manifest, "onnxruntime-cpu", config)
    assert drafter.bytes_per_block() == 2 * 1 * 16 * 2 * 8 * 4  # K and V, fp32


# The sessions on tiny graphs (onnx writes them).

H, HKV, D, B = 2, 1, 2, 4


def _graph(path: Path, nodes, inputs, outputs, init) -> Path:
    onnx = pytest.importorskip("onnx")
    from onnx import helper  # a build-time dependency: only these graph writers need it

    graph = helper.make_graph(nodes, path.stem, inputs, outputs, init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _paged_inputs(*extra):
    # onnx: a build-time dependency (skipped without it, `_graph`)
    from onnx import TensorProto as t
    from onnx import helper

    info = helper.make_tensor_value_info
    return [
        info("input_ids", t.INT64, ["S", "Q"]),
        info("positions", t.INT64, ["S", "Q"]),
        *extra,
        info("k_pool_0", t.FLOAT, ["NB", B, HKV, D]),
        info("v_pool_0", t.FLOAT, ["NB", B, HKV, D]),
        info("block_tables", t.INT64, ["S", "MB"]),
        info("context_lens", t.INT64, ["S"]),
        info("attention_mask", t.BOOL, ["S", 1, "Q", "K"]),
        info("logits_indices", t.INT64, ["N"]),
    ]


def _kv_nodes():
    """new_k_0 = new_v_0 = position + 1, [S, Q, HKV*D]."""
    # onnx: a build-time dependency (skipped without it, `_graph`)
    from onnx import TensorProto as t
    from onnx import helper

    nodes = [
        helper.make_node("Cast", ["positions"], ["pos_f"], to=t.FLOAT),
        helper.make_node("Add", ["pos_f", "one_f"], ["pos_1"]),
        helper.make_node("Unsqueeze", ["pos_1", "axis2"], ["pos_3d"]),
        helper.make_node("Expand", ["pos_3d", "kv_shape"], ["new_k_0"]),
        helper.make_node("Identity", ["new_k_0"], ["new_v_0"]),
    ]
    outputs = [
        helper.make_tensor_value_info(f"new_{kv}_0", t.FLOAT, ["S", "Q", HKV * D])
        for kv in ("k", "v")
    ]
    init = [
        helper.make_tensor("one_f", t.FLOAT, [], [1.0]),
        helper.make_tensor("axis2", t.INT64, [1], [2]),
        helper.make_tensor("kv_shape", t.INT64, [3], [1, 1, HKV * D]),
    ]
    return nodes, outputs, init


def _write_target(path: Path, aux: bool) -> Path:
    """logits [N, V]: a one-hot of token + 1; aux_hidden [S, Q, 3] = (token, position, 7)."""
    # onnx: a build-time dependency (skipped without it, `_graph`)
    from onnx import TensorProto as t
    from onnx import helper

    kv_nodes, kv_outputs, kv_init = _kv_nodes()
    nodes = [
        helper.make_node("Add", ["input_ids", "one"], ["next"]),
        helper.make_node("OneHot", ["next", "vocab", "onehot_values"], ["onehot"], axis=-1),
        helper.make_node("Reshape", ["onehot", "rows_shape"], ["rows"]),
        helper.make_node("Gather", ["rows", "logits_indices"], ["logits"], axis=0),
        *kv_nodes,
    ]
    outputs = [helper.make_tensor_value_info("logits", t.FLOAT, ["N", V]), *kv_outputs]
    if aux:
        nodes += [
            helper.make_node("Cast", ["input_ids"], ["ids_f"], to=t.FLOAT),
            helper.make_node("Mul", ["ids_f", "zero_f"], ["zeros"]),
            helper.make_node("Add", ["zeros", "seven"], ["sevens"]),
            helper.make_node("Unsqueeze", ["ids_f", "axis2"], ["a"]),
            helper.make_node("Unsqueeze", ["pos_f", "axis2"], ["b"]),
            helper.make_node("Unsqueeze", ["sevens", "axis2"], ["c"]),
            helper.make_node("Concat", ["a", "b", "c"], ["aux_hidden"], axis=-1),
        ]
        outputs.append(helper.make_tensor_value_info("aux_hidden", t.FLOAT, ["S", "Q", 3]))
    init = [
        *kv_init,
        helper.make_tensor("one", t.INT64, [], [1]),
        helper.make_tensor("vocab", t.INT64, [], [V]),
        helper.make_tensor("onehot_values", t.FLOAT, [2], [0.0, 10.0]),
        helper.make_tensor("rows_shape", t.INT64, [2], [-1, V]),
        helper.make_tensor("zero_f", t.FLOAT, [], [0.0]),
        helper.make_tensor("seven", t.FLOAT, [], [7.0]),
    ]
    return _graph(path, nodes, _paged_inputs(), outputs, init)


def _write_layer(path: Path) -> Path:
    """draft_tokens = input token + int(hidden[..., 0]), draft_hidden = hidden + 1 (of the
    logits_indices rows); K = V = position + 1."""
    # onnx: a build-time dependency (skipped without it, `_graph`)
    from onnx import TensorProto as t
    from onnx import helper

    kv_nodes, kv_outputs, kv_init = _kv_nodes()
    nodes = [
        helper.make_node("Gather", ["hidden", "zero"], ["h0"], axis=2),  # [S, Q]
        helper.make_node("Cast", ["h0"], ["h0_i"], to=t.INT64),
        helper.make_node("Add", ["input_ids", "h0_i"], ["tokens"]),
        helper.make_node("Reshape", ["tokens", "flat"], ["tokens_flat"]),
        helper.make_node("Gather", ["tokens_flat", "logits_indices"], ["draft_tokens"], axis=0),
        helper.make_node("Add", ["hidden", "one_f"], ["h1"]),
        helper.make_node("Reshape", ["h1", "rows_shape"], ["h_rows"]),
        helper.make_node("Gather", ["h_rows", "logits_indices"], ["draft_hidden"], axis=0),
        *kv_nodes,
    ]
    outputs = [
        helper.make_tensor_value_info("draft_tokens", t.INT64, ["N"]),
        helper.make_tensor_value_info("draft_hidden", t.FLOAT, ["N", H]),
        *kv_outputs,
    ]
    init = [
        *kv_init,
        helper.make_tensor("zero", t.INT64, [], [0]),
        helper.make_tensor("flat", t.INT64, [1], [-1]),
        helper.make_tensor("rows_shape", t.INT64, [2], [-1, H]),
    ]
    hidden = helper.make_tensor_value_info("hidden", t.FLOAT, ["S", "Q", H])
    return _graph(path, nodes, _paged_inputs(hidden), outputs, init)


def _write_fc(path: Path, weight=(1, 0, 0, 1, 0, 0)) -> Path:
    """hidden = features @ weight [3, H]; by default (token, position)."""
    # onnx: a build-time dependency (skipped without it, `_graph`)
    from onnx import TensorProto as t
    from onnx import helper

    weight = helper.make_tensor("weight", t.FLOAT, [3, H], list(weight))
    return _graph(
        path,
        [helper.make_node("MatMul", ["features", "weight"], ["hidden"])],
        [helper.make_tensor_value_info("features", t.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("hidden", t.FLOAT, ["N", H])],
        [weight],
    )


def test_the_target_session_returns_every_rows_aux_hidden(tmp_path):
    pool = KVPool(1, 8, B, HKV, D)
    session = EngineSession(_write_target(tmp_path / "t.onnx", aux=True), pool, aux=True)
    tables = [pool.new_block_table() for _ in range(2)]
    for table, n in zip(tables, (3, 1), strict=True):
        table.slots_for(n)
    batch = build_inputs([(tables[0], [5, 6, 7], 0), (tables[1], [9], 0)])
    logits, _ = session.run(batch)
    np.testing.assert_array_equal(logits.argmax(-1), [8, 10])
    aux = session.aux_hidden  # [S*Q, 3]: rows s*Q + q, padding included
    assert aux.shape == (6, 3)
    np.testing.assert_array_equal(aux[:4], [[5, 0, 7], [6, 1, 7], [7, 2, 7], [9, 0, 7]])

    plain = EngineSession(_write_target(tmp_path / "p.onnx", aux=False), pool)
    with pytest.raises(SessionError, match="opened without aux=True"):
        _ = plain.aux_hidden
    with pytest.raises(SessionError, match="missing output 'aux_hidden'"):
        EngineSession(tmp_path / "p.onnx", pool, aux=True)


def test_the_artifacts_draft_graphs_propose_through_the_drafter(tmp_path):
    _write_layer(tmp_path / "draft" / "eagle" / "model.onnx")
    _write_fc(tmp_path / "draft" / "eagle" / "fc.onnx")
    eagle = SimpleNamespace(
        path="draft/eagle/model.onnx",
        fc_path="draft/eagle/fc.onnx",
        kv_block_size=B,
        num_kv_heads=HKV,
        head_dim=D,
    )
    manifest = SimpleNamespace(speculative=SimpleNamespace(eagle=eagle))
    target_pool = KVPool(1, 8, B, HKV, D)
    draft = EagleDraft.open(tmp_path, manifest.speculative.eagle, target_pool.num_blocks)
    assert isinstance(draft.layer, EagleLayerSession) and isinstance(draft.fc, EagleFc)
    assert (draft.pool.num_layers, draft.pool.num_blocks) == (1, 8)
    drafter = EagleDrafter(draft)
    tokens = [10, 11, 12, 13, 14]
    seq = _sequence(target_pool, tokens, reserve=3)
    drafter.record_features(seq, 0, features(np.array(tokens[:4]), np.arange(4)))
    # d1 = tok[4] + tok[3] (the last row's fc'd features) = 27, h1 = (14, 4); d2 = 27 + 14,
    # h2 = (15, 5); d3 = 41 + 15.
    assert drafter.propose([seq], [3]) == [[27, 41, 56]]
    slots = build_inputs([(seq.table, [0] * 6, 0)]).slots  # positions 0..5
    np.testing.assert_array_equal(draft.pool.k[0].reshape(-1, D)[slots, 0], range(1, 7))


def _eagle_artifact(root: Path) -> Path:
    """An artifact of the tiny graphs: the target (next token = token + 1, features (token,
    position, 7): hidden size 1) and an EAGLE draft whose fc gives (1, position), so its first
    draft is token + 1 (right) and the next ones + 2 (wrong)."""
    engine = "engines/onnxruntime-cpu/model.onnx"
    _write_target(root / "model.onnx", aux=True)
    _write_target(root / engine, aux=True)
    _write_layer(root / "draft" / "eagle" / "model.onnx")
    _write_fc(root / "draft" / "eagle" / "fc.onnx", weight=(0, 0, 0, 1, 1 / 7, 0))
    write_tokenizer(root, V)
    (root / "ingot.lock").write_text("{}\n")
    eagle = {
        "origin": "attach",
        "path": "draft/eagle/model.onnx",
        "fc_path": "draft/eagle/fc.onnx",
        "hidden_size": H,
        "target_hidden_size": 1,
        "num_heads": 1,
        "num_kv_heads": HKV,
        "head_dim": D,
        "intermediate_size": 4,
        "vocab_size": V,
        "draft_vocab_size": V,
        "aux_layers": [0, 0, 0],
        "kv_block_size": B,
    }
    fields = {
        "name": "fake-eagle",
        "version": "0",
        "recipe": {},
        "lock": {"path": "ingot.lock", "sha256": sha256_file(root / "ingot.lock")},
        "model": {
            "architecture": "LlamaForCausalLM",
            "vocab_size": V,
            "hidden_size": 1,
            "num_layers": 1,
            "num_heads": 1,
            "num_kv_heads": HKV,
            "head_dim": D,
            "max_seq_len": 64,
            "bos_token_id": 0,
            "eos_token_ids": [1],
            "tie_word_embeddings": False,
        },
        "tokenizer": {"path": "tokenizer.json"},
        "graph": {
            "path": "model.onnx",
            "opset": 23,
            "inputs": [],
            "outputs": [{"name": "aux_hidden", "dtype": "float32", "shape": ["S", "Q", 3]}],
            "num_layers": 1,
            "kv_block_size": B,
            "kv_dtype": "fp32",
            "num_kv_heads": HKV,
            "head_dim": D,
        },
        "engines": [
            {
                "name": "onnxruntime-cpu",
                "engine": "onnxruntime",
                "device": "cpu",
                "path": engine,
                "requires": {"onnxruntime": ">=1.20,<2", "cpu_isa": []},
                "session_options": {"intra_op_num_threads": 1},
            }
        ],
        "speculative": {"method": "eagle", "num_speculative_tokens": 3, "eagle": eagle},
    }
    write_manifest(root, fields)
    return root


def test_an_eagle_artifact_loads_and_drafts_with_its_graphs(tmp_path):
    root = _eagle_artifact(tmp_path / "art")
    prompts = [[65], [40, 41, 42, 43, 44, 45]]
    params = SamplingParams(max_tokens=12, temperature=0.0)
    plain = LoadedModel.load(root, speculative_config=False).generator()
    expected = [c.token_ids for c in plain.generate(prompts, params)]
    assert expected[0] == list(range(66, 78))

    per_block = KVPool.bytes_per_block(1, B, HKV, D) * 2  # the target's and the draft's
    model = LoadedModel.load(
        root,
        kv_cache_bytes=17 * per_block,
        speculative_config={"method": "eagle3", "adaptive": False, "min_acceptance_rate": 0},
    )
    assert model.speculative.method == "eagle" and model.speculative.num_speculative_tokens == 3
    assert model.pool.num_blocks == model.eagle.pool.num_blocks == 17  # the budget paid both
    generator = model.generator()
    assert isinstance(generator.speculation.drafter, EagleDrafter)
    assert [c.token_ids for c in generator.generate(prompts, params)] == expected
    stats = generator.speculation.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # d1 right, d2 wrong
