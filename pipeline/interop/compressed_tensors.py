"""compressed-tensors `pack-quantized` checkpoints (what llm-compressor writes and vLLM /
transformers load), written through the compressed-tensors library itself.

Per quantized linear: weight_packed int32 [N, ceil(K*b/32)] (codes offset by 2^(b-1), packed
along K), weight_scale [N, G] (per-channel: G = 1), weight_shape [2], and for asymmetric
schemes weight_zero_point int32 [ceil(N*b/32), G] (packed along N). compressed-tensors keeps
codes and zero points in the signed range, so ingot's unsigned asymmetric codes c and zero
points z are stored as c - 2^(b-1) and z - 2^(b-1): the difference, and so the weight, is
unchanged. Scales stay float32 (declared by `scale_dtype`), so the copy dequantizes to the
IR's weights exactly. Act-order g_idx is refused: compressed-tensors >= 0.20 has no g_idx.

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

import torch

from ..model.llama import LlamaModel
from .common import (
    InteropError,
    dense_tensors,
    float_linears,
    has_act_order,
    hf_name,
    split_model,
    write_checkpoint,
)

__all__ = ["write_compressed_tensors"]


def write_compressed_tensors(model: LlamaModel, source: Path, out: Path) -> None:
    from compressed_tensors.compressors.model_compressors.model_compressor import (
        ModelCompressor,
    )
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus

    modules, dense = split_model(model)
    by_scheme: dict[tuple[int, bool, int], list[str]] = {}
    # A module one group wide is per-channel in the IR; it joins its peers' group scheme.
    grouped = {(q.bits, q.symmetric): q.group_size for q in modules.values() if _groups(q) > 1}
    for name, q in modules.items():
        if has_act_order(q):
            raise InteropError(
                f"interop compressed-tensors: {name} uses act-order g_idx, which "
                "compressed-tensors no longer stores; quantize with static groups"
            )
        peers = grouped.get((q.bits, q.symmetric))
        group = q.group_size if _groups(q) > 1 or peers == q.in_features else -1
        by_scheme.setdefault((q.bits, q.symmetric, group), []).append(name)

    tensors = dense_tensors(dense)
    groups = {}
    for index, (key, names) in enumerate(sorted(by_scheme.items())):
        # One scheme covers every Linear; several name their modules explicitly.
        targets = ["Linear"] if len(by_scheme) == 1 else [hf_name(n) for n in names]
        scheme = _scheme(*key, targets)
        groups[f"group_{index}"] = scheme
        for name in names:
            tensors.update(_compress(hf_name(name), modules[name], scheme))
    floats = float_linears(dense)
    if "lm_head" not in modules and "lm_head" not in floats:
        floats.append("lm_head")  # tied to the embedding: still a Linear the targets match
    config = QuantizationConfig(
        config_groups=groups,
        format="pack-quantized",
        quantization_status=QuantizationStatus.COMPRESSED,
        ignore=floats,
    )
    write_checkpoint(out, source, tensors, None, untie="lm_head" in modules)
    ModelCompressor(quantization_config=config).update_config(str(out))


def _groups(q) -> int:
    return q.scales.shape[1]


def _scheme(bits: int, symmetric: bool, group: int, targets: list[str]):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    weights = QuantizationArgs(
        num_bits=bits,
        type="int",
        symmetric=symmetric,
        strategy="group" if group > 0 else "channel",
        group_size=group if group > 0 else None,
        scale_dtype=torch.float32,
    )
    return QuantizationScheme(targets=targets, weights=weights, format="pack-quantized")


def _compress(name: str, q, scheme) -> dict[str, torch.Tensor]:
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
    tensors = {f"{name}.{key}": value for key, value in packed.items()}
    if q.bias is not None:
        tensors[f"{name}.bias"] = q.bias.data.to(torch.float16)
    return tensors
