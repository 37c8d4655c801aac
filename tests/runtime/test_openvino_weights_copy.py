"""The openvino engine over the onnxruntime engine's graph (the artifact's one copy of the
weights): each quantized linear is rebuilt from the frontend's own constants (ORT's MatMulNBits
inputs, already in OpenVINO's [N, K/g, g] orientation), no code copied or transposed in Python,
and the model it builds computes what the portable graph's weights compute."""

from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset16 as ops
import pytest

from ingot.runtime.engines.openvino.weights import GraphWeights

from fixtures import make_checkpoint, write_recipe

ORT_FILE = "engines/onnxruntime-cpu/model.onnx"


@pytest.fixture(scope="module")
def both_copies(tmp_path_factory) -> Path:
    """A tiny artifact shipping both the portable graph and the onnxruntime engine's."""
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    tmp = tmp_path_factory.mktemp("ovcopy")
    asymmetric = {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": False}
    per_channel = {"method": "rtn", "bits": 8, "group_size": -1, "symmetric": True}
    quantize = [
        {**asymmetric, "targets": ["re:layers\\..*"], "ignore": []},
        {**per_channel, "targets": ["lm_head"], "ignore": []},
    ]
    recipe = write_recipe(
        tmp / "r.yaml",
        make_checkpoint(tmp / "ckpt", "llama", tie_word_embeddings=False),
        quantize=quantize,
        targets=[{"engine": "onnxruntime", "matmul_accuracy_level": 0}],
        artifact={"name": "tiny", "portable": True},
    )
    return build(recipe, tmp / "art", cache=StageCache(tmp / "cache")).artifact


def _codes_source(output: ov.Output) -> ov.Node:
    """The Constant the dequantized weight's codes come from (Reshape <- Multiply <- Subtract
    <- Convert <- Constant)."""
    node = output.get_node()
    while node.get_type_name() != "Constant":
        node = node.input_value(0).get_node()
    return node


@pytest.mark.parametrize("name", ["layers.0.attn.qkv_proj", "layers.1.mlp.down_proj", "lm_head"])
def test_linears_come_from_the_engines_constants(both_copies, name):
    fused = GraphWeights(both_copies / ORT_FILE)
    portable = GraphWeights(both_copies / "model.onnx")
    columns = fused.linear_columns(name)
    assert columns == portable.linear_columns(name)
    rows = portable.shape(f"{name}.codes_t")[0]  # K
    x = ops.parameter([3, rows], ov.Type.f32)
    from_fused, from_portable = fused.linear(x, name), portable.linear(x, name)
    source = _codes_source(from_fused.get_node().input_value(1))
    # The file's own constant (a copy made in Python would be a new, unnamed Constant).
    assert source.get_friendly_name() == f"{name}.codes_t_T"
    assert source is fused.constant(f"{name}.codes_t_T")
    model = ov.Model([from_fused, from_portable], [x])
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    feed = np.random.default_rng(0).standard_normal((3, rows)).astype(np.float32)
    got, expected = compiled(feed).values()
    assert got.shape == (3, columns)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
