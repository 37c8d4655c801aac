"""compressed-tensors checkpoints (what llm-compressor writes and vLLM / transformers load),
written through the compressed-tensors library itself: one config group per scheme, each
with the format compressed-tensors infers for it (`infer_module_format`, what llm-compressor
saves), and `format: mixed-precision` over the whole config when the groups differ.

- Weight-only integer: `pack-quantized`. weight_packed int32 [N, ceil(K*b/32)] (codes offset
  by 2^(b-1), packed along K), weight_scale [N, G] (per-channel: G = 1), weight_shape [2], and
  for asymmetric schemes weight_zero_point int32 [ceil(N*b/32), G] (packed along N).
  compressed-tensors keeps codes and zero points in the signed range, so ingot's unsigned
  asymmetric codes c and zero points z are stored as c - 2^(b-1) and z - 2^(b-1): the
  difference, and so the weight, is unchanged. Scales stay float32 (declared by
  `scale_dtype`), so the copy dequantizes to the IR's weights exactly. Act-order g_idx is
  refused: compressed-tensors >= 0.20 has no g_idx.
- W8A8 int8 (SmoothQuant): `int-quantized`, the W8A8 preset: weight int8 [N, K] (the IR's
  codes as they are), weight_scale float32 [N, 1]; inputs int8 symmetric, per token and
  dynamic, or per tensor and static with input_scale float32 [1] (the IR's calibrated scale).
- FP8 E4M3: `float-quantized`, the FP8_DYNAMIC preset (channel weights, dynamic per-token
  inputs) or FP8 (tensor weights, static per-tensor inputs), each with the IR's own weight
  strategy: weight float8_e4m3fn [N, K], weight_scale float32 [N, 1] (channel) or [1] (tensor,
  the IR's one value repeated per row), input_scale [1] when static. FP8 weights with float
  inputs are `naive-quantized`: compressed-tensors' float-quantized needs input activations.
An fp8 KV cache adds `kv_cache_scheme` and per-layer k_scale / v_scale (kv_scheme.py).
SmoothQuant's smoothing is already in the IR's norms and weights: the norms are written as the
other float tensors are (fp16).

The packed zero points are the format (llm-compressor's own files hold the same, vLLM declares
[N / (32/b), G]), but transformers >= 5.23 with compressed-tensors >= 0.18 cannot load any
asymmetric pack-quantized checkpoint plainly: building the compressed model on the meta device,
`PackedQuantizationCompressor.compress` returns before packing the zero point, so its
placeholder stays [N, G], and 5.23's loader now size-checks a quantizer's parameters ("size
mismatch ... weight_zero_point"). Load with `CompressedTensorsConfig(dequantize=True)`
(deprecated spelling: `run_compressed=False`); tests/pipeline/test_interop.py pins both.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

from ..model.kv_quant import KVScales
from ..model.llama import LlamaModel
from ..model.qlinear import QuantizedLinear
from .common import (
    InteropError,
    dense_tensors,
    float_linears,
    has_act_order,
    split_model,
    write_checkpoint,
)
from .kv_scheme import kv_cache_scheme, kv_scale_tensors

__all__ = ["write_compressed_tensors"]


class _Key(NamedTuple):
    """What one config group holds (sortable: groups are numbered in this order)."""

    type: str  # weights: "int" | "float" (FP8 E4M3)
    bits: int
    symmetric: bool
    strategy: str  # "channel" | "group" | "tensor"
    group: int  # group size when grouped, else 0
    inputs: str  # "" (weight-only) | "dynamic" (per token) | "static" (per tensor)


def write_compressed_tensors(
    model: LlamaModel, source: Path, out: Path, kv_scales: KVScales | None = None
) -> None:
    """Write `model` (the IR) to `out`; with `kv_scales` (fp8), the KV cache scheme too
    (kv_scheme.py)."""
    # compressed-tensors (a 2 s import) loads only when a recipe asks for its format
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.config import CompressionFormat
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus

    modules, dense = split_model(model, activations=True)
    by_scheme: dict[_Key, list[str]] = {}
    # A module one group wide is per-channel in the IR; it joins its peers' group scheme.
    grouped = {(q.bits, q.symmetric): q.group_size for q in modules.values() if _groups(q) > 1}
    for name, q in modules.items():
        if has_act_order(q):
            raise InteropError(
                f"interop compressed-tensors: {name} uses act-order g_idx, which "
                "compressed-tensors no longer stores; quantize with static groups"
            )
        by_scheme.setdefault(_key(name, q, grouped), []).append(name)

    tensor_names = model.cfg.family.tensor_names  # IR -> the checkpoint's (HF) names
    tensors = dense_tensors(dense, tensor_names)
    groups = {}
    for index, (key, names) in enumerate(sorted(by_scheme.items())):
        # One scheme covers every Linear; several name their modules explicitly.
        targets = ["Linear"] if len(by_scheme) == 1 else [tensor_names.to_hf(n) for n in names]
        scheme = _scheme(key, targets)
        groups[f"group_{index}"] = scheme
        for name in names:
            tensors.update(_compress(tensor_names.to_hf(name), modules[name], scheme))
    formats = {scheme.format for scheme in groups.values()}
    floats = float_linears(dense, tensor_names)
    if "lm_head" not in modules and "lm_head" not in floats:
        floats.append("lm_head")  # tied to the embedding: still a Linear the targets match
    config = QuantizationConfig(
        config_groups=groups,
        format=formats.pop() if len(formats) == 1 else CompressionFormat.mixed_precision.value,
        quantization_status=QuantizationStatus.COMPRESSED,
        ignore=floats,
        kv_cache_scheme=None if kv_scales is None else kv_cache_scheme(kv_scales),
    )
    if kv_scales is not None:
        tensors.update(kv_scale_tensors(kv_scales))
    write_checkpoint(out, source, tensors, None, untie="lm_head" in modules)
    ModelCompressor(quantization_config=config).update_config(str(out))


def _groups(q: QuantizedLinear) -> int:
    return q.scales.shape[1]


def _key(name: str, q: QuantizedLinear, grouped: dict[tuple[int, bool], int]) -> _Key:
    inputs = ""
    if q.input_quant is not None:
        if not q.input_quant.calibrated:
            raise InteropError(
                f"interop compressed-tensors: {name} has static {q.input_quant.dtype} inputs "
                "without a calibrated scale"
            )
        inputs = "static" if q.input_quant.static else "dynamic"
    if q.fp8:
        # Per tensor in the IR is one scale repeated on every row.
        per_tensor = bool(torch.all(q.scales == q.scales[0, 0]))
        return _Key("float", 8, True, "tensor" if per_tensor else "channel", 0, inputs)
    if inputs:  # int8 inputs: int8 symmetric per-channel weights (QuantizedLinear checks it)
        return _Key("int", 8, True, "channel", 0, inputs)
    peers = grouped.get((q.bits, q.symmetric))
    group = q.group_size if _groups(q) > 1 or peers == q.in_features else 0
    return _Key("int", q.bits, q.symmetric, "group" if group else "channel", group, "")


def _scheme(key: _Key, targets: list[str]):
    # compressed-tensors (a 2 s import) loads only when a recipe asks for its format
    from compressed_tensors.compressors.format import infer_module_format
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    if key.type == "int" and not key.inputs:
        weights = QuantizationArgs(
            num_bits=key.bits,
            type="int",
            symmetric=key.symmetric,
            strategy=key.strategy,
            group_size=key.group or None,
            scale_dtype=torch.float32,
        )
        return QuantizationScheme(targets=targets, weights=weights, format="pack-quantized")
    # compressed-tensors' presets, llm-compressor's schemes: W8A8 (int8 channel weights, int8
    # per-token dynamic inputs), FP8_DYNAMIC (FP8 channel weights, per-token dynamic inputs) and
    # FP8 (FP8 tensor weights, static per-tensor inputs); the weights keep the IR's strategy.
    preset = "W8A8" if key.type == "int" else "FP8" if key.inputs == "static" else "FP8_DYNAMIC"
    weights = PRESET_SCHEMES[preset]["weights"].model_copy(update={"strategy": key.strategy})
    inputs = None
    if key.inputs == "dynamic":
        inputs = PRESET_SCHEMES[preset]["input_activations"]
    elif key.inputs == "static":  # static int8 inputs: FP8's static per-tensor ones, as int
        inputs = PRESET_SCHEMES["FP8"]["input_activations"].model_copy(update={"type": key.type})
    scheme = QuantizationScheme(targets=targets, weights=weights, input_activations=inputs)
    # What llm-compressor saves: int-quantized (W8A8), float-quantized (FP8 with FP8 inputs),
    # naive-quantized (FP8 weights only).
    scheme.format = infer_module_format(torch.nn.Linear, scheme).value
    return scheme


def _compress(name: str, q: QuantizedLinear, scheme) -> dict[str, torch.Tensor]:
    if scheme.format == "pack-quantized":
        tensors = _pack(name, q, scheme)
    else:
        tensors = _naive(name, q, scheme)
    if q.bias is not None:
        tensors[f"{name}.bias"] = q.bias.data.to(torch.float16)
    return tensors


def _pack(name: str, q: QuantizedLinear, scheme) -> dict[str, torch.Tensor]:
    # compressed-tensors (a 2 s import) loads only when a recipe asks for its format
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    offset = 2 ** (q.bits - 1)
    state = {"weight": q.dequantize(), "weight_scale": q.scales.clone()}
    if q.zero_points is not None:
        state["weight_zero_point"] = (q.zero_points.to(torch.int16) - offset).to(torch.int8)
    packed = PackedQuantizationCompressor.compress(state, scheme)
    # The library re-derives the codes from the dequantized weight; make sure it found ours.
    codes = q.codes.to(torch.int16) - (0 if q.zero_points is None else offset)
    unpacked = unpack_from_int32(packed["weight_packed"], q.bits, q.codes.shape)
    if not torch.equal(unpacked.to(torch.int16), codes):
        raise InteropError(f"interop compressed-tensors: {name}: packing changed the codes")
    return {f"{name}.{key}": value for key, value in packed.items()}


def _naive(name: str, q: QuantizedLinear, scheme) -> dict[str, torch.Tensor]:
    """int8 / FP8 weights stored as they are (int-, float- and naive-quantized)."""
    from compressed_tensors.compressors import BaseCompressor  # only for this format, as above

    scale = q.scales.clone()  # [N, 1]
    if scheme.weights.strategy == "tensor":
        scale = scale[0]  # [1]
    state = {"weight": q.dequantize(), "weight_scale": scale}
    if q.input_quant is not None and q.input_quant.static:
        state["input_scale"] = torch.tensor([q.input_quant.scale], dtype=torch.float32)
    compressor = BaseCompressor.get_value_from_registry(scheme.format)
    stored = compressor.compress(state, scheme)
    # The library re-derives the codes from the dequantized weight; make sure it found ours.
    weight = stored["weight"]
    if weight.dtype != q.codes.dtype or not torch.equal(
        weight.view(torch.int8), q.codes.view(torch.int8)
    ):
        raise InteropError(f"interop compressed-tensors: {name}: compressing changed the codes")
    return {f"{name}.{key}": value for key, value in stored.items()}
