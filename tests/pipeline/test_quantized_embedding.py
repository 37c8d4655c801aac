"""The embedding and lm_head quantized (int8 rows): the IR against dequantize-then-run, the
exported graph against the IR with a tied model's table stored once, what ONNX Runtime's
engine runs (MatMulNBits for lm_head, a Gather of int8 codes for the embedding), the recipe
surface and its refusals, and the default for sources of 1e9 parameters or more."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch

from ingot.pipeline.engines.onnxruntime.build import build_onnxruntime_engine
from ingot.pipeline.engines.onnxruntime.check import check_export
from ingot.pipeline.export import ExportError, export_onnx
from ingot.pipeline.model.architecture import parameter_count
from ingot.pipeline.model.load import load_model
from ingot.pipeline.model.qembedding import QuantizedEmbedding
from ingot.pipeline.model.selection import embedding_entry
from ingot.pipeline.preflight import check_recipe_against_model, with_model_defaults
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.quantize.checkpoint import load_ir, save_ir
from ingot.pipeline.quantize.ir_layers import IRLayers
from ingot.pipeline.recipe import Recipe, RecipeError
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import make_checkpoint, model_config

LAYERS = {"method": "rtn", "bits": 4, "group_size": 32, "targets": ["re:layers\\..*"]}
HEADS = {"method": "rtn", "bits": 8, "targets": ["embed_tokens", "lm_head"], "ignore": []}
# (tied, group_size, symmetric): per row (the default's), blocks of 32 with zero points
CASES = {
    "tied-per-row": (True, -1, True),
    "tied-g32-asymmetric": (True, 32, False),
    "untied-per-row": (False, -1, True),
}


def _quantized(tmp: Path, tied: bool, group_size: int, symmetric: bool):
    model = load_model(make_checkpoint(tmp / "ckpt", "llama", tie_word_embeddings=tied))
    heads = {**HEADS, "group_size": group_size, "symmetric": symmetric}
    summaries = quantize_model(model, [quantize_entry(LAYERS), quantize_entry(heads)])
    return model, summaries


@pytest.mark.parametrize("case", sorted(CASES))
def test_ir_equals_dequantize_then_run(tmp_path, case):
    tied, group_size, symmetric = CASES[case]
    model, summaries = _quantized(tmp_path, tied, group_size, symmetric)
    table = model.embed_tokens
    assert isinstance(table, QuantizedEmbedding) and summaries[1]["modules"] == 2
    assert model.lm_head_tied is tied  # tied: lm_head computes with the table's own codes
    ids = torch.tensor([[3, 5, 7, 319, 3]])
    # The lookup dequantizes only its rows: bit for bit the rows of the dequantized table.
    assert torch.equal(table(ids), table.dequantize()[ids])
    reference = load_model(tmp_path / "ckpt")  # the float model, given the dequantized tables
    reference.load_state_dict(
        {k: v for k, v in _dequantized_state(model).items()}, strict=False, assign=True
    )
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[0], reference(ids)[0], rtol=0, atol=1e-5)
    out = tmp_path / "ir"
    out.mkdir()
    save_ir(model, out)
    loaded, parts = load_ir(out), IRLayers(out)
    assert loaded.lm_head_tied is tied and parts.lm_head_tied is tied
    assert torch.equal(loaded(ids)[0], model(ids)[0])
    assert torch.equal(parts.embedding(), table.dequantize())
    assert torch.equal(parts.lm_head().dequantize(), model.lm_head.dequantize())


def _dequantized_state(model) -> dict[str, torch.Tensor]:
    """Every quantized weight of `model` dequantized, under a float model's names."""
    state = {"embed_tokens.weight": model.embed_tokens.dequantize()}
    for name, m in model.named_modules():
        if hasattr(m, "dequantize") and name != "embed_tokens":
            state[f"{name}.weight"] = m.dequantize()
    return state


@pytest.mark.parametrize("case", sorted(CASES))
def test_graph_matches_the_ir_and_engine_runs_int8(tmp_path, case):
    tied, group_size, symmetric = CASES[case]
    model, _ = _quantized(tmp_path, tied, group_size, symmetric)
    export_onnx(model, tmp_path / "onnx", max_seq_len=64)
    report = check_export(model, tmp_path / "onnx" / "model.onnx")
    assert report["greedy_match"] and report["max_rel_logit_diff"] <= report["rtol"]

    graph = onnx.load(str(tmp_path / "onnx" / "model.onnx"), load_external_data=False).graph
    spans = {i.name: _span(i) for i in graph.initializer}
    table = [n for n in spans if n.startswith("embed_tokens.")]
    assert "embed_tokens.weight" not in spans and "lm_head.weight_t" not in spans
    # One copy of the table's bytes, whatever names read it: [hidden, vocab] int8 codes.
    (codes,) = {spans[n] for n in table if ".codes_t" in n}
    assert codes[1] == 64 * 320
    assert any(n.startswith("lm_head.") for n in spans) is not tied

    engine = tmp_path / "engine"
    build_onnxruntime_engine(
        tmp_path / "onnx" / "model.onnx", engine, optimization_level="extended"
    )
    optimized = onnx.load(str(engine / "model.onnx"), load_external_data=False)
    ops = {n.name: n.op_type for n in optimized.graph.node}
    assert ops["lm_head/MatMul"] == "MatMulNBits"  # never the whole table dequantized
    gathers = [  # tied: of lm_head's MatMulNBits codes (engines/onnxruntime/shared_embedding.py)
        n for n in optimized.graph.node if n.op_type == "Gather" and n.name.startswith("embed_")
    ]
    inits = {i.name: i.data_type for i in optimized.graph.initializer}
    kinds = {inits.get(n.input[0]) for n in gathers}
    assert onnx.TensorProto.INT8 in kinds or onnx.TensorProto.UINT8 in kinds
    assert onnx.TensorProto.FLOAT not in {inits.get(n.input[0]) for n in gathers[:1]}


def _span(initializer: onnx.TensorProto) -> tuple[int, int]:
    data = {e.key: e.value for e in initializer.external_data}
    return int(data["offset"]), int(data["length"])


def test_export_refuses_4_bit_embedding(tmp_path):
    model = load_model(make_checkpoint(tmp_path / "ckpt", "llama"))
    heads = {**HEADS, "bits": 4, "group_size": 32, "symmetric": True}
    quantize_model(model, [quantize_entry(heads)])
    with pytest.raises(ExportError, match="embed_tokens: 4-bit codes"):
        export_onnx(model, tmp_path / "onnx", max_seq_len=64)


# -- the recipe --------------------------------------------------------------------------------


def _recipe(*entries: dict, **fields) -> Recipe:
    base = {"source": {"path": "m"}, "artifact": {"name": "t"}, "export": {"max_seq_len": 256}}
    return Recipe.model_validate({**base, "quantize": list(entries), **fields})


def _problems(recipe: Recipe, **config) -> list[str]:
    with pytest.raises(RecipeError) as err:
        check_recipe_against_model(recipe, model_config(**config))
    return err.value.problems


def test_recipe_refuses_what_cannot_work_naming_the_field():
    [bits] = _problems(_recipe(LAYERS, {**HEADS, "bits": 4, "group_size": 32}))
    assert bits.startswith("quantize.1.bits: 4: embed_tokens is gathered as 8-bit codes")
    only_embedding = {**HEADS, "group_size": -1, "targets": ["embed_tokens"]}
    [tie] = _problems(_recipe(LAYERS, only_embedding), tie_word_embeddings=True)
    assert tie.startswith("quantize.1.targets: the model ties lm_head to embed_tokens")
    fp8 = {"method": "fp8", "targets": ["embed_tokens"]}
    [scheme] = _problems(_recipe(fp8))
    assert scheme.startswith("quantize.0.method: fp8") and "embed_tokens" in scheme
    twice = [{**HEADS, "group_size": -1}, {**HEADS, "group_size": -1}]
    assert any("already selected" in p for p in _problems(_recipe(*twice)))
    # Untied, the embedding alone is fine; and a regex never selects it.
    check_recipe_against_model(_recipe(only_embedding), model_config())
    everything = _recipe({**LAYERS, "targets": ["re:.*"], "ignore": []})
    assert embedding_entry(everything.quantize) is None


# Llama-3.2-1B's shape (tied): 1.24e9 parameters.
ONE_B = dict(
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    tie_word_embeddings=True,
)


def test_default_at_one_billion_parameters():
    big = model_config(**ONE_B)
    assert parameter_count(big) == 1_235_814_400  # Llama-3.2-1B's published count
    resolved = with_model_defaults(_recipe(LAYERS), big)
    added = resolved.quantize[-1]
    assert len(resolved.quantize) == 2
    assert (added.method, added.bits, added.group_size, added.symmetric) == ("rtn", 8, -1, True)
    assert added.targets == ["embed_tokens", "lm_head"] and added.ignore == []
    check_recipe_against_model(resolved, big)  # the default passes its own checks
    assert with_model_defaults(resolved, big) == resolved  # resolved once
    # Nothing changes below 1e9 (tables 12% of the parameters here), when the recipe says
    # float, names either module, or quantizes nothing.
    small = model_config(**{**ONE_B, "num_hidden_layers": 8, "vocab_size": 32000})
    assert with_model_defaults(_recipe(LAYERS), small) == _recipe(LAYERS)
    floated = _recipe(LAYERS, embedding_and_lm_head="float")
    assert with_model_defaults(floated, big) == floated
    head = {**LAYERS, "targets": ["lm_head"], "ignore": []}
    assert with_model_defaults(_recipe(LAYERS, head), big).quantize[-1].targets == ["lm_head"]
    assert with_model_defaults(_recipe(), big).quantize == []


def test_default_for_a_large_vocabulary_on_a_small_model():
    # Gemma-3-1B's shape: 999.9M parameters, 30% of them the tied 262k x 1152 table.
    gemma = dict(ONE_B, vocab_size=262144, hidden_size=1152, intermediate_size=6912)
    gemma.update(num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1)
    small_big_table = model_config(**gemma, head_dim=256)
    assert parameter_count(small_big_table) < 1_000_000_000
    assert with_model_defaults(_recipe(LAYERS), small_big_table).quantize[-1].targets == [
        "embed_tokens",
        "lm_head",
    ]
    # A model of under 1e8 parameters keeps its tables whatever their share (test models).
    tiny = model_config(vocab_size=4096, tie_word_embeddings=True)
    assert with_model_defaults(_recipe(LAYERS), tiny) == _recipe(LAYERS)


def test_default_stays_out_of_an_interop_format_that_cannot_hold_it():
    # AWQ checkpoints keep lm_head float: the default would make the recipe fail its checks.
    awq = {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": False}
    recipe = _recipe({**awq, "targets": ["re:layers\\..*"]}, interop=["awq"])
    assert with_model_defaults(recipe, model_config(**ONE_B)) == recipe
