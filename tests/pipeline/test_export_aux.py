"""The target graph's aux_hidden output (an EAGLE-3 draft's input): the residual streams
entering the chosen layers, for every row of the call, as the IR computes them."""

import numpy as np
import pytest
import torch

from ingot.pipeline.export import ExportError, export_onnx
from ingot.pipeline.model.llama import causal_mask
from ingot.pipeline.model.load import load_model
from ingot.pipeline.model.rope import cos_sin
from ingot.runtime.batch import build_inputs
from ingot.runtime.engines.onnxruntime.session import EngineSession
from ingot.runtime.kv_pool import KVPool

from fixtures import make_checkpoint

LAYERS = (0, 2, 3)  # the embedding output, and the streams entering layers 2 and 3


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp("ckpt") / "m", num_hidden_layers=4)
    return load_model(path)


def _entering(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """The IR's residual stream entering each layer, [T, hidden] each, for one sequence."""
    positions = torch.arange(ids.shape[0])[None]
    cos, sin = cos_sin(model.cfg, positions)
    mask = causal_mask(positions, positions)
    x, streams = model.embed_tokens(ids[None]), []
    for layer in model.layers:
        streams.append(x[0])
        x, _ = layer(x, cos, sin, mask)
    return streams


def test_aux_hidden_is_the_irs_residual_streams(model, tmp_path):
    info = export_onnx(model, tmp_path, max_seq_len=64, kv_block_size=8, aux_layers=LAYERS)
    assert {"name": "aux_hidden", "dtype": "float32", "shape": ["S", "Q", 3 * 64]} in [
        {k: o[k] for k in ("name", "dtype", "shape")} for o in info["outputs"]
    ]
    ids = torch.randint(2, model.cfg.vocab_size, (20,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        streams = _entering(model, ids)
    want = torch.cat([streams[i] for i in LAYERS], dim=-1).numpy()  # [T, 3*hidden]

    # Two chunks, the second reading the first's K/V from the pool, as the runtime runs them.
    cfg = model.cfg
    pool = KVPool(cfg.num_layers, 8, 8, cfg.num_kv_heads, cfg.head_dim, np.float32)
    session = EngineSession(tmp_path / "model.onnx", pool, aux=True)
    table = pool.new_block_table()
    table.slots_for(20)
    got = []
    for start, end in ((0, 12), (12, 20)):
        batch = build_inputs(
            [(table, ids[start:end].tolist(), start)], scratch_block=session.scratch_block
        )
        _, new_kv = session.run(batch)
        batch.write_kv(pool, new_kv)  # nothing to write when the graph wrote the pool
        got.append(session.aux_hidden.copy())  # [Q, 3*hidden]
    got = np.concatenate(got)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_aux_layers_outside_the_model_are_refused(model, tmp_path):
    with pytest.raises(ExportError, match=r"aux layers \[0, 2, 4\]: \[4\] not in \[0, 3\]"):
        export_onnx(model, tmp_path, max_seq_len=64, aux_layers=(0, 2, 4))


def test_no_aux_output_without_aux_layers(model, tmp_path):
    info = export_onnx(model, tmp_path, max_seq_len=64)
    assert "aux_hidden" not in [o["name"] for o in info["outputs"]]
