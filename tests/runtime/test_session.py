"""EngineSession and LoadedModel over a tiny hand-built graph with ingot's graph interface.

The graph's logits are a one-hot of (input_id + 1) % V plus the sum of k_pool_0, so a test
can see that the bound pool is read live; new_k/new_v are the positions, broadcast. With
`logits_indices` (today's interface) it returns the asked rows [N, V]; without it (engines
exported before that input existed) every position [S, Q, V], and the session picks the rows.
"""

import logging

import numpy as np
import pytest

from ingot.artifacts import ArtifactError, sha256_file, write_manifest
from ingot.runtime import LoadedModel, SamplingParams
from ingot.runtime.batch import Batch, build_inputs
from ingot.runtime.engines.base import SessionError
from ingot.runtime.engines.onnxruntime.session import EngineSession, open_draft_graph
from ingot.runtime.kv_pool import KVPool
from ingot.runtime.model import DEFAULT_KV_CACHE_BYTES

from fixtures import CHAT_TEMPLATE, write_tokenizer

onnx = pytest.importorskip("onnx")  # build-time dependency, used here only to write the graph
from onnx import TensorProto, helper  # noqa: E402

V, LAYERS, HKV, D, B = 320, 2, 2, 16, 4


def write_graph(path, vocab=V, layers=LAYERS, logits_indices=True, writes_pool=False):
    t = TensorProto
    inputs = [
        helper.make_tensor_value_info("input_ids", t.INT64, ["S", "Q"]),
        helper.make_tensor_value_info("positions", t.INT64, ["S", "Q"]),
    ]
    for layer in range(layers):
        for kv in ("k", "v"):
            inputs.append(
                helper.make_tensor_value_info(f"{kv}_pool_{layer}", t.FLOAT, ["NB", B, HKV, D])
            )
    inputs += [
        helper.make_tensor_value_info("block_tables", t.INT64, ["S", "MB"]),
        helper.make_tensor_value_info("context_lens", t.INT64, ["S"]),
        helper.make_tensor_value_info("attention_mask", t.BOOL, ["S", 1, "Q", "K"]),
    ]
    nodes = [
        helper.make_node("Add", ["input_ids", "one"], ["next"]),
        helper.make_node("Mod", ["next", "vocab"], ["next_mod"]),
        helper.make_node("OneHot", ["next_mod", "vocab", "onehot_values"], ["onehot"], axis=-1),
        helper.make_node("ReduceSum", ["k_pool_0"], ["pool_sum"], keepdims=0),
        helper.make_node("Add", ["onehot", "pool_sum"], ["all_logits"]),
        helper.make_node("Cast", ["positions"], ["pos_f"], to=t.FLOAT),
        helper.make_node("Unsqueeze", ["pos_f", "axes23"], ["pos_4d"]),
        helper.make_node("Expand", ["pos_4d", "kv_shape"], ["kv"]),
    ]
    if logits_indices:
        inputs.append(helper.make_tensor_value_info("logits_indices", t.INT64, ["N"]))
        nodes += [
            helper.make_node("Reshape", ["all_logits", "rows_shape"], ["rows"]),
            helper.make_node("Gather", ["rows", "logits_indices"], ["logits"], axis=0),
        ]
        outputs = [helper.make_tensor_value_info("logits", t.FLOAT, ["N", vocab])]
    else:
        nodes.append(helper.make_node("Identity", ["all_logits"], ["logits"]))
        outputs = [helper.make_tensor_value_info("logits", t.FLOAT, ["S", "Q", vocab])]
    if writes_pool:  # today's interface: the graph scatters its K/V into the pool itself
        inputs.append(helper.make_tensor_value_info("kv_slots", t.INT64, ["S", "Q", 2]))
    for layer in range(layers):
        for kv in ("k", "v"):
            if writes_pool:
                out = f"{kv}_pool_out_{layer}"
                node = helper.make_node(
                    "ScatterND", [f"{kv}_pool_{layer}", "kv_slots", "kv"], [out]
                )
                nodes.append(node)
                outputs.append(helper.make_tensor_value_info(out, t.FLOAT, ["NB", B, HKV, D]))
                continue
            nodes.append(helper.make_node("Identity", ["kv"], [f"new_{kv}_{layer}"]))
            outputs.append(
                helper.make_tensor_value_info(f"new_{kv}_{layer}", t.FLOAT, ["S", "Q", HKV, D])
            )
    init = [
        helper.make_tensor("one", t.INT64, [], [1]),
        helper.make_tensor("vocab", t.INT64, [], [vocab]),
        helper.make_tensor("onehot_values", t.FLOAT, [2], [0.0, 10.0]),
        helper.make_tensor("axes23", t.INT64, [2], [2, 3]),
        helper.make_tensor("kv_shape", t.INT64, [4], [1, 1, HKV, D]),
        helper.make_tensor("rows_shape", t.INT64, [2], [-1, vocab]),
    ]
    graph = helper.make_graph(nodes, "fake", inputs, outputs, init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _pool(layers=LAYERS, dtype=np.float32):
    return KVPool(layers, num_blocks=8, block_size=B, num_kv_heads=HKV, head_dim=D, dtype=dtype)


def _batch(pool, ids) -> Batch:
    """Sequence s holds no past and computes ids[s] (every row real)."""
    tables = []
    for row in ids:
        table = pool.new_block_table()
        table.slots_for(len(row))
        tables.append(table)
    return build_inputs([(table, row, 0) for table, row in zip(tables, ids, strict=True)])


@pytest.mark.parametrize("logits_indices", [True, False], ids=["logits_indices", "every_row"])
def test_run_reads_the_bound_pool_live(tmp_path, logits_indices):
    pool = _pool()
    graph = write_graph(tmp_path / "g.onnx", logits_indices=logits_indices)
    session = EngineSession(graph, pool, {"intra_op_num_threads": 1})
    batch = _batch(pool, [[5, 6], [7, 9]])
    logits, new_kv = session.run(batch)
    logits = logits.copy()  # the session's buffer: the next call writes it again
    assert logits.shape == (2, V) and logits.dtype == np.float32  # each sequence's last token
    np.testing.assert_array_equal(logits.argmax(-1), [7, 10])
    assert len(new_kv) == LAYERS and new_kv[1][0].shape == (2, 2, HKV, D)
    np.testing.assert_array_equal(new_kv[0][1][:, :, 0, 0], [[0, 1], [0, 1]])

    # Writing the pool in place is seen by the next call: the session aliases the arrays.
    pool.write(np.array([3, 9]), 0, np.full((2, HKV, D), 0.5, np.float32), np.zeros((2, HKV, D)))
    logits2, _ = session.run(batch)
    np.testing.assert_allclose(logits2 - logits, 2 * HKV * D * 0.5)


def test_a_graph_that_writes_the_pool_writes_it_in_place(tmp_path):
    """kv_slots in the graph: its ScatterND outputs are bound to the pool arrays, so each real
    row's K/V (here: its position) lands in its slot and padded rows in the scratch block; the
    session returns no K/V, and a batch built for the other layout is refused."""
    pool = _pool()
    session = EngineSession(
        write_graph(tmp_path / "g.onnx", writes_pool=True), pool, {"intra_op_num_threads": 1}
    )
    assert session.writes_pool and session.scratch_block == pool.scratch_block == 8
    tables = [pool.new_block_table() for _ in range(2)]
    tables[0].slots_for(6)  # 2 blocks of 4: positions 4, 5 are new
    tables[1].slots_for(1)
    seqs = [(tables[0], [5, 6], 4), (tables[1], [7], 0)]  # sequence 1 padded to 2 rows
    batch = build_inputs(seqs, scratch_block=session.scratch_block)
    for array in pool.k + pool.v:
        array[pool.scratch_block] = 99.0  # the padded row (position 0 in the batch) writes 0
    for _ in range(2):  # the second call rebinds nothing and writes in place again
        logits, new_kv = session.run(batch)
        assert new_kv == [] and logits.shape == (2, V)
    for layer in range(LAYERS):
        for kind in "kv":
            flat = getattr(pool, kind)[layer].reshape(-1, HKV, D)  # [(NB + 1) * B, Hkv, D]
            np.testing.assert_array_equal(flat[batch.slots, 0, 0], [4, 5, 0])
            assert flat[pool.scratch_block * B, 0, 0] == 0  # the padded row, in the scratch block
    with pytest.raises(SessionError, match="built without the pool"):
        session.run(build_inputs(seqs))


def test_output_buffers_are_reused_while_the_call_shape_repeats(tmp_path):
    pool = _pool()
    session = EngineSession(write_graph(tmp_path / "g.onnx"), pool, {"intra_op_num_threads": 1})
    first, kv = session.run(_batch(pool, [[5], [7]]))
    first_k = kv[0][0]
    again, kv = session.run(_batch(pool, [[9], [3]]))  # same (S, Q, N): same arrays, new values
    assert again is first and kv[0][0] is first_k
    np.testing.assert_array_equal(again.argmax(-1), [10, 4])
    other, _ = session.run(_batch(pool, [[9, 3]]))  # another shape: new arrays
    assert other is not first and other.shape == (1, V)
    np.testing.assert_array_equal(other.argmax(-1), [4])


def test_a_draft_graph_without_its_input_or_output_is_refused(tmp_path):
    graph = write_graph(tmp_path / "g.onnx")  # input_ids -> logits
    assert open_draft_graph(graph, "test graph", "input_ids", "logits") is not None
    with pytest.raises(SessionError, match="EAGLE fc graph: expected input 'features'"):
        open_draft_graph(graph, "EAGLE fc graph", "features", "logits")
    with pytest.raises(SessionError, match="expected input 'input_ids' and output 'hidden'"):
        open_draft_graph(graph, "Medusa heads graph", "input_ids", "hidden")


def test_interface_mismatches_are_named(tmp_path):
    graph = write_graph(tmp_path / "g.onnx")
    with pytest.raises(SessionError, match="missing input 'k_pool_2'"):
        EngineSession(graph, _pool(layers=3))
    with pytest.raises(SessionError, match="tensor\\(float\\), the pool is tensor\\(float16\\)"):
        EngineSession(graph, _pool(dtype=np.float16))


def test_hidden_is_bound_only_where_the_graph_has_it(tmp_path):
    graph = write_graph(tmp_path / "g.onnx")  # no `hidden` output
    with pytest.raises(SessionError, match="missing output 'hidden'"):
        EngineSession(graph, _pool(), hidden=True)
    session = EngineSession(graph, _pool())
    with pytest.raises(SessionError, match="opened without hidden=True"):
        _ = session.hidden


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"graph_optimization_level": "max"}, "graph_optimization_level 'max'"),
        ({"intra_op_num_threads": -1}, "intra_op_num_threads"),
        ({"turbo": True}, "unknown keys \\['turbo'\\]"),
    ],
)
def test_bad_session_options(tmp_path, options, match):
    with pytest.raises(SessionError, match=match):
        EngineSession(write_graph(tmp_path / "g.onnx"), _pool(), options)


def _artifact(root, max_seq_len=64):
    write_graph(root / "model.onnx")
    write_graph(root / "engines" / "onnxruntime-cpu" / "model.onnx")
    write_tokenizer(root, V)
    (root / "tokenizer_config.json").unlink()
    (root / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (root / "ingot.lock").write_text("{}\n")
    engine = {"device": "cpu", "path": "engines/onnxruntime-cpu/model.onnx"}
    fields = {
        "name": "fake",
        "version": "0",
        "recipe": {},
        "lock": {"path": "ingot.lock", "sha256": sha256_file(root / "ingot.lock")},
        "model": {
            "architecture": "LlamaForCausalLM",
            "vocab_size": V,
            "hidden_size": 64,
            "num_layers": LAYERS,
            "num_heads": 4,
            "num_kv_heads": HKV,
            "head_dim": D,
            "max_seq_len": max_seq_len,
            "bos_token_id": 0,
            "eos_token_ids": [1],
            "tie_word_embeddings": False,
        },
        "tokenizer": {"path": "tokenizer.json", "chat_template": "chat_template.jinja"},
        "graph": {
            "path": "model.onnx",
            "opset": 23,
            "inputs": [],
            "outputs": [],
            "num_layers": LAYERS,
            "kv_block_size": B,
            "kv_dtype": "fp32",
            "num_kv_heads": HKV,
            "head_dim": D,
        },
        "engines": [
            {"name": "tensorrt-sm90", "engine": "tensorrt", **engine, "device": "cuda"},
            {
                "name": "onnxruntime-cpu",
                "engine": "onnxruntime",
                **engine,
                "requires": {"onnxruntime": ">=1.20,<2", "cpu_isa": []},
                "session_options": {
                    "graph_optimization_level": "disable_all",
                    "intra_op_num_threads": 1,
                },
            },
        ],
    }
    write_manifest(root, fields)
    return root


def test_load_and_generate(tmp_path, caplog):
    root = _artifact(tmp_path / "art")
    with caplog.at_level(logging.INFO, logger="ingot.runtime"):
        model = LoadedModel.load(root, max_num_seqs=2)
    assert model.engine.name == "onnxruntime-cpu"
    assert "engine onnxruntime-cpu" in caplog.text and "tensorrt-sm90: " in caplog.text
    budget_blocks = DEFAULT_KV_CACHE_BYTES // KVPool.bytes_per_block(LAYERS, B, HKV, D, np.float32)
    assert model.pool.num_blocks == budget_blocks  # spare blocks hold cached prefixes
    uncached = LoadedModel.load(root, max_num_seqs=2, enable_prefix_caching=False)
    assert uncached.pool.num_blocks == 2 * 64 // B  # capped at max_num_seqs full sequences
    out = model.generator().generate([[65], [40, 41]], SamplingParams(max_tokens=3, temperature=0))
    assert [c.token_ids for c in out] == [[66, 67, 68], [42, 43, 44]]
    assert out[0].text == "abc"
    assert model.tokenizer.apply_chat_template([{"role": "user", "content": "x"}]).startswith(
        "<|user|>"
    )


def test_pool_sizing_options(tmp_path):
    root = _artifact(tmp_path / "art")
    assert LoadedModel.load(root, kv_cache_blocks=20).pool.num_blocks == 20
    per_block = KVPool.bytes_per_block(LAYERS, B, HKV, D)
    assert LoadedModel.load(root, kv_cache_bytes=17 * per_block).pool.num_blocks == 17
    with pytest.raises(ValueError, match="cannot hold one sequence of max_seq_len 64"):
        LoadedModel.load(root, kv_cache_blocks=15)


def test_spinning_off_reaches_the_engine_session(tmp_path):
    root = _artifact(tmp_path / "art")
    key = "session.intra_op.allow_spinning"
    sleeping = LoadedModel.load(root, spinning=False).session._session.get_session_options()
    assert sleeping.get_session_config_entry(key) == "0"
    spinning = LoadedModel.load(root).session._session.get_session_options()
    with pytest.raises(RuntimeError, match="does not have configuration"):
        spinning.get_session_config_entry(key)  # ORT's default: spin


def test_nothing_loads_from_a_tampered_artifact(tmp_path):
    root = _artifact(tmp_path / "art")
    (root / "chat_template.jinja").write_text("{{ 'tampered' }}")
    with pytest.raises(ArtifactError, match="chat_template.jinja: size mismatch"):
        LoadedModel.load(root)
