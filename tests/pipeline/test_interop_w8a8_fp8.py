"""compressed-tensors exports of W8A8 (SmoothQuant, `int-quantized`) and FP8 (`float-quantized`,
weight-only `naive-quantized`), alone and mixed with pack-quantized integer weights: the config
is llm-compressor's (compressed-tensors' presets), the tensors are the IR's codes and scales, and
transformers (with compressed-tensors) loads them back and computes what the IR computes.

What transformers computes from these files: a plain `from_pretrained` keeps compressed-tensors'
fake quantization. Each linear decompresses its weight on the first forward (codes x scale: the
IR's dequantized weight exactly) and quantizes its input on the fly: FP8 by ingot's formula
(amax / 448 per token, or the static scale, rounded to E4M3), int8 static by ingot's formula
(clamp(round(x / s), -128, 127)), and int8 dynamic on compressed-tensors' own grid,
s = amax / 127.5 with codes in [-128, 127] (`calculate_qparams`' symmetric range), where ingot,
its ONNX graph and vLLM use amax / 127 in [-127, 127]. `dequantize=True` loads the dequantized
weights into plain Linears and quantizes no activations.
"""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_interop import _greedy, _ir_fp16_floats

from ingot.calibration.dataset import CalibrationSet
from ingot.pipeline.interop import InteropError, write_interop
from ingot.pipeline.model import qlinear
from ingot.pipeline.model.families.llama import TENSOR_NAMES
from ingot.pipeline.model.input_quant import InputQuant, quantize_input
from ingot.pipeline.model.load import load_model
from ingot.pipeline.model.qlinear import QuantizedLinear
from ingot.pipeline.quantize.apply import quantize_model
from ingot.pipeline.quantize.checkpoint import load_ir, save_ir
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import make_checkpoint

SCHEMES = {
    "w8a8-dynamic": [{"method": "smoothquant"}],  # GPTQ int8 weights, int8 per-token inputs
    "w8a8-static": [{"method": "smoothquant", "weights": "rtn", "activations": "static"}],
    "fp8-dynamic": [{"method": "fp8"}],  # channel weights, per-token inputs: FP8_DYNAMIC
    "fp8-static": [{"method": "fp8", "weights": "tensor", "activations": "static"}],  # FP8
    "fp8-weight-only": [{"method": "fp8", "activations": "none", "ignore": []}],  # + lm_head
    # recipes/demo-mixed.yaml's shape: W4 on the MLP, W8A8 on attention, int8 lm_head.
    "mixed": [
        {
            "method": "rtn",
            "bits": 4,
            "group_size": 32,
            "symmetric": True,
            "targets": ["re:.*mlp.*"],
        },
        {"method": "smoothquant", "targets": ["re:.*attn.*"]},
        {"method": "rtn", "bits": 8, "group_size": -1, "targets": ["lm_head"], "ignore": []},
    ],
}
# The group each single-scheme export writes: (format, preset whose weights and inputs it
# holds, the weights' strategy, the inputs' strategy or None).
EXPECTED = {
    "w8a8-dynamic": ("int-quantized", "W8A8", "channel", "token"),
    "w8a8-static": ("int-quantized", "W8A8", "channel", "tensor"),
    "fp8-dynamic": ("float-quantized", "FP8_DYNAMIC", "channel", "token"),
    "fp8-static": ("float-quantized", "FP8", "tensor", "tensor"),
    "fp8-weight-only": ("naive-quantized", "FP8_DYNAMIC", "channel", None),
}
IDS = torch.randint(2, 320, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("w8a8-ct") / "llama", "llama")


@pytest.fixture(scope="module")
def export(tmp_path_factory, checkpoint):
    """name -> (IR directory, compressed-tensors directory), built once per scheme."""
    tokens = np.random.default_rng(0).integers(2, 320, size=(8, 32)).astype(np.int64)
    calibration = CalibrationSet(tokens, list(range(8)), "sha256:test")
    built: dict[str, tuple[Path, Path]] = {}

    def get(name: str) -> tuple[Path, Path]:
        if name not in built:
            tmp = tmp_path_factory.mktemp(name)
            model = load_model(checkpoint)
            quantize_model(model, [quantize_entry(e) for e in SCHEMES[name]], calibration)
            (tmp / "ir").mkdir()
            save_ir(model, tmp / "ir")
            write_interop("compressed-tensors", tmp / "ir", checkpoint, tmp / "ct")
            built[name] = tmp / "ir", tmp / "ct"
        return built[name]

    return get


def _quantized(ir: Path) -> dict[str, QuantizedLinear]:
    return {n: m for n, m in load_ir(ir).named_modules() if isinstance(m, QuantizedLinear)}


def _quantization_config(ct: Path):
    from compressed_tensors.quantization import QuantizationConfig

    qc = json.loads((ct / "config.json").read_text())["quantization_config"]
    return qc, QuantizationConfig.model_validate(qc)


def _load(ct: Path, **kwargs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ct, dtype=torch.float32, **kwargs).eval()


def _ct_grid(x: torch.Tensor, scheme: InputQuant):
    """compressed-tensors' dynamic int8 rounding (what transformers simulates); every other
    scheme is ingot's own."""
    if scheme.dtype == "int8" and not scheme.static:
        s = x.abs().amax(-1, keepdim=True) / 127.5
        return torch.round(x / s).clamp(-128, 127), s
    return quantize_input(x, scheme)


# -- the files ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_groups_are_llm_compressors_schemes(export, name):
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    _, ct = export(name)
    fmt, preset, weight_strategy, input_strategy = EXPECTED[name]
    qc, config = _quantization_config(ct)
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == fmt
    assert qc["quantization_status"] == "compressed"
    assert qc["ignore"] == ([] if name == "fp8-weight-only" else ["lm_head"])
    (scheme,) = config.config_groups.values()
    assert scheme.targets == ["Linear"] and scheme.format == fmt
    expected = PRESET_SCHEMES[preset]
    assert scheme.weights == expected["weights"].model_copy(update={"strategy": weight_strategy})
    if input_strategy is None:
        assert scheme.input_activations is None
        return
    inputs = scheme.input_activations
    assert (inputs.type, inputs.num_bits, inputs.symmetric) == (expected["weights"].type, 8, True)
    assert (inputs.strategy, inputs.dynamic) == (input_strategy, input_strategy == "token")
    if preset != "W8A8" or input_strategy == "token":  # W8A8 static has no preset of its own
        assert inputs == expected["input_activations"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tensors_are_the_ir_codes_and_scales(export, name):
    ir, ct = export(name)
    tensors = load_file(str(ct / "model.safetensors"))
    quantized = _quantized(ir)
    assert quantized
    for module, q in quantized.items():
        prefix = TENSOR_NAMES.to_hf(module)
        local = {
            k.removeprefix(prefix + "."): v
            for k, v in tensors.items()
            if k.startswith(prefix + ".")
        }
        static = q.input_quant is not None and q.input_quant.static
        assert set(local) == {"weight", "weight_scale"} | ({"input_scale"} if static else set())
        weight, scale = local["weight"], local["weight_scale"]
        assert weight.dtype == q.codes.dtype  # int8 / float8_e4m3fn, stored as they are
        assert torch.equal(weight.view(torch.int8), q.codes.view(torch.int8)), module
        assert scale.dtype == torch.float32
        if name == "fp8-static":  # per tensor: one value, the IR's repeated row scale
            assert scale.shape == (1,) and torch.all(q.scales == scale)
        else:
            assert torch.equal(scale, q.scales), module  # [N, 1]
        if static:
            expected = torch.tensor([q.input_quant.scale], dtype=torch.float32)
            assert torch.equal(local["input_scale"], expected), module


@pytest.mark.parametrize("name", ["w8a8-dynamic", "w8a8-static"])
def test_smoothquant_norms_are_the_irs(export, checkpoint, name):
    """Smoothing lives in the IR's norms (and weights): the checkpoint's norms are those, not
    the source's."""
    ir, ct = export(name)
    tensors = load_file(str(ct / "model.safetensors"))
    source = load_file(str(checkpoint / "model.safetensors"))
    model = load_ir(ir)
    for i, layer in enumerate(model.layers):
        for norm, key in (
            (layer.attn_norm, "input_layernorm"),
            (layer.mlp_norm, "post_attention_layernorm"),
        ):
            stored = tensors[f"model.layers.{i}.{key}.weight"]
            assert torch.equal(stored, norm.weight.data.half())
            assert not torch.allclose(
                stored.float(), source[f"model.layers.{i}.{key}.weight"].float()
            )


def test_mixed_recipe_is_mixed_precision(export):
    ir, ct = export("mixed")
    qc, config = _quantization_config(ct)
    assert qc["format"] == "mixed-precision" and qc["ignore"] == []
    quantized = _quantized(ir)
    formats = {}
    for scheme in config.config_groups.values():
        for target in scheme.targets:
            formats[target] = (scheme.format, scheme.weights.num_bits, scheme.input_activations)
    assert set(formats) == {
        TENSOR_NAMES.to_hf(n) for n in quantized
    }  # each module named by one group
    for module in quantized:
        fmt, bits, inputs = formats[TENSOR_NAMES.to_hf(module)]
        if ".attn." in module:
            assert (fmt, bits, inputs.strategy, inputs.dynamic) == (
                "int-quantized",
                8,
                "token",
                True,
            )
        else:  # the MLP's W4 g32 and lm_head's int8 per channel stay weight-only
            assert (fmt, bits, inputs) == ("pack-quantized", 8 if module == "lm_head" else 4, None)


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
@pytest.mark.parametrize("name", ["w8a8-static", "fp8-weight-only"])
def test_weight_only_formats_refuse_w8a8_and_fp8(tmp_path, export, checkpoint, fmt, name):
    ir, _ = export(name)
    what = "int8 activations" if name.startswith("w8a8") else "FP8 weights"
    message = rf"interop: layers\.0\.\S+ has {what}; .*\(compressed-tensors holds W8A8 and FP8\)"
    with pytest.raises(InteropError, match=message):
        write_interop(fmt, ir, checkpoint, tmp_path / fmt)


# -- transformers -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fp8-dynamic", "fp8-static", "fp8-weight-only"])
def test_transformers_runs_fp8_as_the_ir(export, name):
    """FP8 is the IR's arithmetic step for step (weights codes x scale, inputs rounded to E4M3
    by the same formula): logits to float32 noise, the same greedy tokens."""
    ir, ct = export(name)
    hf = _load(ct)
    model = _ir_fp16_floats(ir)
    with torch.no_grad():
        torch.testing.assert_close(hf(IDS).logits, model(IDS)[0], atol=1e-4, rtol=1e-4)
    for module, q in _quantized(ir).items():  # decompressed by the first forward
        assert torch.equal(hf.get_submodule(TENSOR_NAMES.to_hf(module)).weight, q.dequantize()), (
            module
        )
    for ids in IDS[:, None]:
        assert _greedy(lambda x: hf(x).logits, ids) == _greedy(lambda x: model(x)[0], ids)


@pytest.mark.parametrize("name", ["w8a8-dynamic", "w8a8-static", "mixed"])
def test_transformers_runs_w8a8_linears_as_the_ir(export, checkpoint, name):
    """Each int8 linear, on the very input transformers gave it, returns the IR linear's output
    (int8 dynamic on compressed-tensors' amax / 127.5 grid, `_ct_grid`); the weights are the
    IR's exactly. Over the whole model the logits are not compared to float32 noise: a code
    that sits on a rounding tie flips under the two implementations' float32 differences (the
    extreme element of every token sits on one on the 127.5 grid), and dynamic int8 on
    another grid is a second, independent rounding. They stay within twice the IR's own
    quantization error against the float model (measured: about 1x for dynamic int8, 0.03x
    static)."""
    ir, ct = export(name)
    hf = _load(ct)
    model = _ir_fp16_floats(ir)
    quantized = {n: m for n, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = [
        hf.get_submodule(TENSOR_NAMES.to_hf(n)).register_forward_hook(
            lambda _, args, out, n=n: seen.__setitem__(n, (args[0], out))
        )
        for n in quantized
    ]
    with torch.no_grad():
        logits = hf(IDS).logits
        for hook in hooks:
            hook.remove()
        with mock.patch.object(qlinear, "quantize_input", _ct_grid):
            for module, q in quantized.items():
                x, y = seen[module]
                assert torch.equal(
                    hf.get_submodule(TENSOR_NAMES.to_hf(module)).weight, q.dequantize()
                )
                torch.testing.assert_close(y, q(x), atol=1e-5, rtol=1e-5, msg=module)
        reference = model(IDS)[0]
        float_error = (reference - load_model(checkpoint)(IDS)[0]).abs().mean()
    assert sum(q.input_quant is not None for q in quantized.values()) >= 8
    assert (logits - reference).abs().mean() <= 2 * float_error


def test_transformers_dequantize_load_is_the_weight_only_ir(export):
    """`dequantize=True` gives plain Linears holding the IR's weights exactly; no activation
    is quantized, so the logits are the IR's with its input quantization off."""
    ir, ct = export("w8a8-dynamic")
    from transformers import CompressedTensorsConfig

    hf = _load(ct, quantization_config=CompressedTensorsConfig(dequantize=True))
    model = _ir_fp16_floats(ir)
    for module, q in [(n, m) for n, m in model.named_modules() if isinstance(m, QuantizedLinear)]:
        assert type(hf.get_submodule(TENSOR_NAMES.to_hf(module))) is torch.nn.Linear
        assert torch.equal(hf.get_submodule(TENSOR_NAMES.to_hf(module)).weight, q.dequantize()), (
            module
        )
        q.set_input_quant(None)
    with torch.no_grad():
        torch.testing.assert_close(hf(IDS).logits, model(IDS)[0], atol=1e-4, rtol=1e-4)


def test_transformers_dequantize_load_of_mixed_precision(export):
    """transformers 5.23's `dequantize=True` decompresses every dense module with one config
    group (`get_dense_scheme`: the first whose targets do not name MoE experts), so a
    mixed-precision file fails on the modules of the other groups (pack-quantized's
    decompressor finds no `weight_packed` in an int-quantized module). The plain load above
    is the way to load it; this pins upstream's behaviour: it fails so, or loads the IR's."""
    from transformers import CompressedTensorsConfig

    ir, ct = export("mixed")
    _, config = _quantization_config(ct)
    assert list(config.config_groups.values())[0].format == "pack-quantized"
    try:
        hf = _load(ct, quantization_config=CompressedTensorsConfig(dequantize=True))
    except RuntimeError as error:
        assert "conversion" in str(error)
        return
    for module, q in _quantized(ir).items():
        assert torch.equal(hf.get_submodule(TENSOR_NAMES.to_hf(module)).weight, q.dequantize()), (
            module
        )
