"""Interop checkpoints, read back by code that does not share the writers' packing: numpy
unpackers written from the GPTQ v1 / AWQ GEMM layouts, and compressed-tensors' own
decompression (and transformers' loader). Each must give the IR's dequantized weights:
exactly for compressed-tensors (fp32 scales), and exactly once the IR's scales are rounded
to fp16 for GPTQ / AWQ (the formats store fp16 scales)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from ingot.calibration.dataset import CalibrationSet
from ingot.pipeline.interop import InteropError, write_interop
from ingot.pipeline.model.families.llama import TENSOR_NAMES
from ingot.pipeline.model.load import load_model
from ingot.pipeline.model.qlinear import QuantizedLinear
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.quantize.checkpoint import load_ir, save_ir
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import make_checkpoint

AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]  # AutoAWQ's unpacking order, from its docs


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("interop") / "llama", "llama")


def _ir(tmp: Path, checkpoint: Path, name: str, **spec) -> Path:
    model = load_model(checkpoint)
    base = {"method": "rtn", "targets": ["re:.*"], "ignore": ["lm_head"], "symmetric": True}
    quantize_model(model, [quantize_entry({**base, **spec})])
    out = tmp / f"ir-{name}"
    out.mkdir()
    save_ir(model, out)
    return out


def _quantized(ir_dir: Path) -> dict[str, QuantizedLinear]:
    return {n: m for n, m in load_ir(ir_dir).named_modules() if isinstance(m, QuantizedLinear)}


def _fp16_scales(q: QuantizedLinear) -> np.ndarray:
    """The IR's dequantized weight [N, K] with its scales rounded to fp16 as the file holds."""
    rounded = QuantizedLinear(
        q.codes, q.scales.half().float(), q.zero_points, q.bits, q.group_size, g_idx=q.g_idx
    )
    return rounded.dequantize().numpy()


def _ir_fp16_floats(ir: Path):
    """The IR with its float tensors rounded to fp16, as the checkpoint holds them."""
    model = load_ir(ir)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    return model


def _greedy(forward, ids: torch.Tensor, steps: int = 12) -> list[int]:
    out = ids
    with torch.no_grad():
        for _ in range(steps):
            out = torch.cat([out, forward(out)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out[0, ids.shape[1] :].tolist()


# -- independent unpackers ----------------------------------------------------------------------


def _nibbles(words: np.ndarray, bits: int) -> np.ndarray:
    """[..., W] int32 -> [..., W, 32/bits] values, lowest bits first."""
    per = 32 // bits
    shifts = np.arange(per, dtype=np.uint32) * bits
    return (words.view(np.uint32)[..., None] >> shifts) & np.uint32((1 << bits) - 1)


def unpack_gptq_v1(t: dict[str, np.ndarray], prefix: str, bits: int) -> np.ndarray:
    qweight, qzeros = t[f"{prefix}.qweight"], t[f"{prefix}.qzeros"]  # [K*b/32, N], [G, N*b/32]
    scales, g_idx = t[f"{prefix}.scales"], t[f"{prefix}.g_idx"]  # [G, N] fp16, [K]
    n = qweight.shape[1]
    # qweight packs K: word r, slot s is input channel r * 32/b + s.
    codes = _nibbles(qweight.T, bits).reshape(n, -1).astype(np.int64)  # [N, K]
    zeros = _nibbles(qzeros, bits).reshape(qzeros.shape[0], n).astype(np.int64) + 1  # [G, N]
    return ((codes - zeros[g_idx].T) * scales[g_idx].T.astype(np.float32)).astype(np.float32)


def unpack_awq_gemm(t: dict[str, np.ndarray], prefix: str, group: int) -> np.ndarray:
    qweight, qzeros = t[f"{prefix}.qweight"], t[f"{prefix}.qzeros"]  # [K, N/8], [G, N/8]
    scales = t[f"{prefix}.scales"].astype(np.float32)  # [G, N]
    k = qweight.shape[0]
    codes = _nibbles(qweight, 4)[..., AWQ_REVERSE_ORDER].reshape(k, -1).astype(np.int64)
    zeros = _nibbles(qzeros, 4)[..., AWQ_REVERSE_ORDER].reshape(qzeros.shape[0], -1)
    groups = np.arange(k) // group
    w = (codes - zeros.astype(np.int64)[groups]) * scales[groups]  # [K, N]
    return w.T.astype(np.float32)


# -- GPTQ ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bits", "group_size", "symmetric"),
    [(4, 32, True), (4, 32, False), (8, 64, True), (4, -1, False)],
)
def test_gptq_v1_unpacks_to_the_ir_weights(tmp_path, checkpoint, bits, group_size, symmetric):
    ir = _ir(tmp_path, checkpoint, "g", bits=bits, group_size=group_size, symmetric=symmetric)
    write_interop("gptq", ir, checkpoint, tmp_path / "gptq")
    config = json.loads((tmp_path / "gptq" / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["quant_method"] == "gptq" and qc["checkpoint_format"] == "gptq"
    assert (qc["bits"], qc["group_size"], qc["sym"], qc["desc_act"]) == (
        bits,
        group_size,
        symmetric,
        False,
    )
    assert config["torch_dtype" if "torch_dtype" in config else "dtype"] == "float16"
    tensors = load_file(str(tmp_path / "gptq" / "model.safetensors"))
    for name, q in _quantized(ir).items():
        prefix = TENSOR_NAMES.to_hf(name)
        k, n = q.in_features, q.out_features
        assert tensors[f"{prefix}.qweight"].shape == (k * bits // 32, n)
        assert tensors[f"{prefix}.qweight"].dtype == np.int32
        assert tensors[f"{prefix}.scales"].dtype == np.float16
        assert tensors[f"{prefix}.g_idx"].dtype == np.int32
        np.testing.assert_array_equal(unpack_gptq_v1(tensors, prefix, bits), _fp16_scales(q))
    assert "lm_head.weight" in tensors and "model.embed_tokens.weight" in tensors


def test_gptq_symmetric_stores_zero_eight_minus_one(tmp_path, checkpoint):
    ir = _ir(tmp_path, checkpoint, "s", bits=4, group_size=32)
    write_interop("gptq", ir, checkpoint, tmp_path / "gptq")
    qzeros = load_file(str(tmp_path / "gptq" / "model.safetensors"))[
        "model.layers.0.self_attn.q_proj.qzeros"
    ]
    assert np.all(qzeros.view(np.uint32) == 0x77777777)  # eight nibbles of 8 - 1


def test_gptq_word_layout_by_hand(tmp_path, checkpoint):
    """Input channels 0..7 of output 0 with codes 1..8 fill word 0 low nibble first."""
    ir = _ir(tmp_path, checkpoint, "h", bits=4, group_size=32, symmetric=False)
    model = load_ir(ir)
    q = model.layers[0].attn.q_proj
    q.codes[0, :8] = torch.arange(1, 9, dtype=torch.uint8)
    q.zero_points[0, 0] = 3
    save_ir(model, ir)
    write_interop("gptq", ir, checkpoint, tmp_path / "gptq")
    t = load_file(str(tmp_path / "gptq" / "model.safetensors"))
    assert t["model.layers.0.self_attn.q_proj.qweight"][0, 0].view(np.uint32) == 0x87654321
    assert t["model.layers.0.self_attn.q_proj.qzeros"][0, 0].view(np.uint32) & 0xF == 2


def test_gptq_act_order_keeps_g_idx(tmp_path, checkpoint):
    ir = _ir(tmp_path, checkpoint, "a", bits=4, group_size=32, symmetric=False)
    model = load_ir(ir)
    q = model.layers[1].mlp.down_proj
    g_idx = torch.randperm(q.in_features, generator=torch.Generator().manual_seed(0)) // 32
    model.layers[1].mlp.down_proj = QuantizedLinear(
        q.codes, q.scales, q.zero_points, 4, 32, g_idx=g_idx
    )
    save_ir(model, ir)
    write_interop("gptq", ir, checkpoint, tmp_path / "gptq")
    qc = json.loads((tmp_path / "gptq" / "config.json").read_text())["quantization_config"]
    assert qc["desc_act"] is True
    t = load_file(str(tmp_path / "gptq" / "model.safetensors"))
    prefix = "model.layers.1.mlp.down_proj"
    np.testing.assert_array_equal(t[f"{prefix}.g_idx"], g_idx.numpy())
    down = model.layers[1].mlp.down_proj
    np.testing.assert_array_equal(unpack_gptq_v1(t, prefix, 4), _fp16_scales(down))


def test_gptq_refuses_zero_point_zero(tmp_path, checkpoint):
    ir = _ir(tmp_path, checkpoint, "z", bits=4, group_size=32, symmetric=False)
    model = load_ir(ir)
    model.layers[0].mlp.up_proj.zero_points[3, 1] = 0
    save_ir(model, ir)
    with pytest.raises(InteropError, match="zero point 0"):
        write_interop("gptq", ir, checkpoint, tmp_path / "gptq")


# -- AWQ ----------------------------------------------------------------------------------------


def test_awq_gemm_unpacks_to_the_ir_weights(tmp_path, checkpoint):
    ir = _ir(tmp_path, checkpoint, "w", bits=4, group_size=32, symmetric=False)
    write_interop("awq", ir, checkpoint, tmp_path / "awq")
    qc = json.loads((tmp_path / "awq" / "config.json").read_text())["quantization_config"]
    assert qc == {
        "quant_method": "awq",
        "version": "gemm",
        "bits": 4,
        "group_size": 32,
        "zero_point": True,
        "modules_to_not_convert": None,
    }
    tensors = load_file(str(tmp_path / "awq" / "model.safetensors"))
    for name, q in _quantized(ir).items():
        prefix = TENSOR_NAMES.to_hf(name)
        assert tensors[f"{prefix}.qweight"].shape == (q.in_features, q.out_features // 8)
        assert tensors[f"{prefix}.qzeros"].shape == (q.in_features // 32, q.out_features // 8)
        np.testing.assert_array_equal(unpack_awq_gemm(tensors, prefix, 32), _fp16_scales(q))


def test_awq_word_layout_by_hand(tmp_path, checkpoint):
    """Output channels 0..7 with codes 0..7: nibble i holds channel [0,2,4,6,1,3,5,7][i]."""
    ir = _ir(tmp_path, checkpoint, "h", bits=4, group_size=32, symmetric=False)
    model = load_ir(ir)
    model.layers[0].attn.q_proj.codes[:8, 0] = torch.arange(8, dtype=torch.uint8)
    save_ir(model, ir)
    write_interop("awq", ir, checkpoint, tmp_path / "awq")
    t = load_file(str(tmp_path / "awq" / "model.safetensors"))
    assert t["model.layers.0.self_attn.q_proj.qweight"][0, 0].view(np.uint32) == 0x75316420


def test_awq_refuses_symmetric_models(tmp_path, checkpoint):
    ir = _ir(tmp_path, checkpoint, "s", bits=4, group_size=32)
    with pytest.raises(InteropError, match="4-bit with zero points"):
        write_interop("awq", ir, checkpoint, tmp_path / "awq")


# -- compressed-tensors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bits", "group_size", "symmetric"), [(4, 32, True), (4, 64, False), (8, -1, False)]
)
def test_compressed_tensors_decompresses_exactly(tmp_path, checkpoint, bits, group_size, symmetric):
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file as load_torch

    ir = _ir(tmp_path, checkpoint, "c", bits=bits, group_size=group_size, symmetric=symmetric)
    write_interop("compressed-tensors", ir, checkpoint, tmp_path / "ct")
    qc = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    assert qc["ignore"] == ["lm_head"]
    schemes = QuantizationConfig.model_validate(qc).config_groups.values()
    tensors = load_torch(str(tmp_path / "ct" / "model.safetensors"))
    for name, q in _quantized(ir).items():
        # Modules as wide as one group are per-channel: a second scheme names them.
        (scheme,) = [s for s in schemes if {"Linear", TENSOR_NAMES.to_hf(name)} & set(s.targets)]
        assert scheme.weights.num_bits == bits and scheme.weights.symmetric == symmetric
        prefix = TENSOR_NAMES.to_hf(name) + "."
        local = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
        assert ("weight_zero_point" in local) == (not symmetric)
        weight = PackedQuantizationCompressor.decompress(local, scheme)["weight"]
        assert torch.equal(weight, q.dequantize()), name


def test_transformers_loads_compressed_tensors(tmp_path, checkpoint):
    """transformers' own loader (compressed-tensors, decompressing on CPU) gives the IR's
    weights exactly; logits differ only by the fp16 float tensors."""
    from transformers import AutoModelForCausalLM

    ir = _ir(tmp_path, checkpoint, "t", bits=4, group_size=32)
    write_interop("compressed-tensors", ir, checkpoint, tmp_path / "ct")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ct", dtype=torch.float32).eval()
    ids = torch.tensor([[5, 9, 40, 7, 100, 3]])
    with torch.no_grad():
        logits = hf(ids).logits  # the first forward decompresses
    for name, q in _quantized(ir).items():
        assert torch.equal(hf.get_submodule(TENSOR_NAMES.to_hf(name)).weight, q.dequantize()), name
    with torch.no_grad():
        torch.testing.assert_close(logits, _ir_fp16_floats(ir)(ids)[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_transformers_loads_a_quantized_lm_head_and_the_embedding_dequantized(tmp_path, tied):
    """An IR whose embedding and lm_head are int8 per row: compressed-tensors holds the
    lm_head quantized (a `lm_head` target; untied) and the embedding as the float table the
    format has (dequantized, in fp16); transformers computes the IR's logits."""
    from transformers import AutoModelForCausalLM

    checkpoint = make_checkpoint(tmp_path / "ckpt", "llama", tie_word_embeddings=tied)
    model = load_model(checkpoint)
    heads = {"method": "rtn", "bits": 8, "group_size": -1, "ignore": []}
    entries = [
        {"method": "rtn", "bits": 4, "group_size": 32, "targets": ["re:layers\\..*"]},
        {**heads, "targets": ["embed_tokens", "lm_head"]},
    ]
    quantize_model(model, [quantize_entry(e) for e in entries])
    ir = tmp_path / "ir"
    ir.mkdir()
    save_ir(model, ir)
    write_interop("compressed-tensors", ir, checkpoint, tmp_path / "ct")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ct", dtype=torch.float32).eval()
    ids = torch.tensor([[5, 9, 40, 7, 100, 3]])
    with torch.no_grad():
        logits = hf(ids).logits
    assert torch.equal(hf.lm_head.weight, model.lm_head.dequantize())
    table = model.embed_tokens.dequantize()
    assert torch.equal(hf.model.embed_tokens.weight, table.half().float())
    reference = _ir_fp16_floats(ir)
    reference.embed_tokens = torch.nn.Embedding.from_pretrained(table.half().float())
    with torch.no_grad():
        torch.testing.assert_close(logits, reference(ids)[0], atol=1e-4, rtol=1e-4)


# -- compressed-tensors, asymmetric (AWQ) -------------------------------------------------------
# Zero points packed along the output channels, as the format has them; why transformers >= 5.23
# then needs dequantize=True (upstream's bug): interop/compressed_tensors.py, docs/design.md.


@pytest.fixture(scope="module")
def awq_export(tmp_path_factory, checkpoint) -> tuple[Path, Path]:
    """An AWQ W4 g32 (asymmetric) IR of the decoder linears and its compressed-tensors copy."""
    tmp = tmp_path_factory.mktemp("awq-ct")
    model = load_model(checkpoint)
    tokens = np.random.default_rng(0).integers(2, 320, size=(4, 32)).astype(np.int64)
    spec = {"method": "awq", "bits": 4, "group_size": 32, "targets": ["re:layers\\..*"]}
    quantize_model(
        model, [quantize_entry(spec)], CalibrationSet(tokens, list(range(4)), "sha256:test")
    )
    ir = tmp / "ir"
    ir.mkdir()
    save_ir(model, ir)
    write_interop("compressed-tensors", ir, checkpoint, tmp / "ct")
    return ir, tmp / "ct"


def test_compressed_tensors_zero_points_pack_along_output_channels(awq_export):
    ir, ct = awq_export
    tensors = load_file(str(ct / "model.safetensors"))
    quantized = _quantized(ir)
    assert quantized and all(not q.symmetric for q in quantized.values())
    for name, q in quantized.items():
        zp = tensors[TENSOR_NAMES.to_hf(name) + ".weight_zero_point"]
        n, groups = q.zero_points.shape
        assert zp.dtype == np.int32 and zp.shape == (n // 8, groups), name  # vLLM: N // (32/4)
        # Word w of column g holds output channels 8w..8w+7, lowest nibble first, offset by 8
        # from compressed-tensors' signed zero point: ingot's unsigned zero point itself.
        unpacked = _nibbles(zp.T, 4).reshape(groups, n).T
        np.testing.assert_array_equal(unpacked, q.zero_points.numpy(), err_msg=name)


def test_transformers_loads_asymmetric_compressed_tensors_dequantized(awq_export):
    """The documented workaround: transformers dequantizes the packed checkpoint while
    loading; the weights are the IR's exactly, the logits and greedy tokens ingot's."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    ir, ct = awq_export
    hf = AutoModelForCausalLM.from_pretrained(
        ct, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True)
    ).eval()
    for name, q in _quantized(ir).items():
        assert torch.equal(hf.get_submodule(TENSOR_NAMES.to_hf(name)).weight, q.dequantize()), name
    model = _ir_fp16_floats(ir)
    ids = torch.tensor([[5, 9, 40, 7, 100, 3]])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids)[0], atol=1e-4, rtol=1e-4)
    assert _greedy(lambda x: hf(x).logits, ids) == _greedy(lambda x: model(x)[0], ids)


def test_transformers_plain_load_of_asymmetric_compressed_tensors(awq_export):
    """A plain from_pretrained either loads the IR's model (transformers < 5.23, or a fixed
    compressed-tensors) or refuses only the zero points, whose placeholder compressed-tensors
    declared unpacked [N, G] against the packed [N/8, G] it writes itself: upstream's defect,
    not the file's."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from transformers import AutoModelForCausalLM

    ir, ct = awq_export
    hf, info = AutoModelForCausalLM.from_pretrained(
        ct, dtype=torch.float32, output_loading_info=True, ignore_mismatched_sizes=True
    )
    quantized = {TENSOR_NAMES.to_hf(n): q for n, q in _quantized(ir).items()}
    mismatched = {key: (tuple(a), tuple(b)) for key, a, b in info["mismatched_keys"]}
    if not mismatched:
        ids = torch.tensor([[5, 9, 40, 7, 100, 3]])
        with torch.no_grad():
            logits = hf.eval()(ids).logits  # the first forward decompresses
        torch.testing.assert_close(logits, _ir_fp16_floats(ir)(ids)[0], atol=1e-4, rtol=1e-4)
        return
    shapes = {name: (q.out_features, q.scales.shape[1]) for name, q in quantized.items()}
    assert mismatched == {
        f"{name}.weight_zero_point": ((n // 8, groups), (n, groups))
        for name, (n, groups) in shapes.items()
    }
    # The placeholder is compressed-tensors' own: compressing a meta module keeps [N, G].
    (scheme,) = QuantizationConfig.model_validate(
        json.loads((ct / "config.json").read_text())["quantization_config"]
    ).config_groups.values()
    q = next(iter(quantized.values()))
    meta = {
        "weight": torch.empty(q.out_features, q.in_features, device="meta"),
        "weight_scale": torch.empty(q.scales.shape, device="meta"),
        "weight_zero_point": torch.empty(q.zero_points.shape, dtype=torch.int8, device="meta"),
    }
    declared = PackedQuantizationCompressor.compress(meta, scheme)["weight_zero_point"]
    assert tuple(declared.shape) == tuple(q.zero_points.shape)


def test_hf_names_invert_the_loader_renames(checkpoint):
    for name in load_model(checkpoint).state_dict():
        assert TENSOR_NAMES.to_ir(TENSOR_NAMES.to_hf(name)) == name
