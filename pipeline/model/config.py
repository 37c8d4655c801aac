"""The model configuration the IR needs, parsed from a Hugging Face ``config.json`` by the
rules of its model family (`family.py`, found by config.json's ``model_type``)."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ingot.common.errors import IngotError

from .family import MODEL_FAMILIES, LayerSpec, ModelFamily, MoeRule, WindowRule

__all__ = ["ModelConfig", "RopeConfig", "ConfigError"]


class ConfigError(IngotError, ValueError):
    """The checkpoint's config.json describes something the IR cannot represent."""


# Sizes no default can stand in for.
_REQUIRED_SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


@dataclass(frozen=True, slots=True)
class RopeConfig:
    theta: float = 10000.0
    type: str = "default"  # default | linear | dynamic | llama3 | longrope
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    # LongRoPE (Phi-3): what each rotated frequency's wavelength is multiplied by, for
    # sequences up to original_max_position_embeddings (short) and beyond (long), one per
    # rotated pair; and the factor cos / sin are multiplied by (1.0 for every other type).
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    attention_factor: float = 1.0


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str  # config.json model_type: the name of its `family`
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeConfig = field(default_factory=RopeConfig)
    qkv_bias: bool = False
    o_bias: bool = False
    tie_word_embeddings: bool = False
    # The window of the layers that slide (None: none does); `layer_windows` says which, one
    # entry per layer (None: that layer attends to the whole context), for a model mixing
    # local and global layers; None when every layer has `sliding_window`.
    sliding_window: int | None = None
    layer_windows: tuple[int | None, ...] | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # A mixture of experts (`ModelFamily.moe`): the layers whose MLP is sparse (`SparseMoE`),
    # each with `num_experts` experts of width `expert_intermediate_size`, `top_k` chosen per
    # token, their weights renormalised over the chosen when `norm_topk_prob`. () : dense.
    moe_layers: tuple[int, ...] = ()
    num_experts: int = 0
    top_k: int = 0
    norm_topk_prob: bool = False
    expert_intermediate_size: int = 0
    # The leading channels of each head RoPE rotates (even; None: all head_dim of them);
    # the rest pass through (config.json's partial_rotary_factor: Phi-4-mini 0.75).
    rotary_dim: int | None = None
    # The sliding layers' own RoPE (Gemma 3's local base); None: every layer rotates by `rope`.
    rope_local: RopeConfig | None = None
    # s making the attention scale s ** -0.5 (Gemma's query_pre_attn_scalar); None: head_dim.
    attention_scalar: float | None = None

    @property
    def rotated_dim(self) -> int:
        """The channels of each head RoPE rotates (head_dim unless partial)."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    @property
    def family(self) -> ModelFamily:
        """The model family this config belongs to (what its layer holds and how it runs)."""
        return MODEL_FAMILIES.get(self.architecture)

    def window_of(self, layer: int) -> int | None:
        """The attention window of decoder layer `layer` (None: the whole context)."""
        if self.layer_windows is None:
            return self.sliding_window
        return self.layer_windows[layer]

    def layer_spec(self, layer: int) -> LayerSpec:
        """What decoder layer `layer` holds: the family's sparse layer for a layer of
        `moe_layers` (its per-expert linears written out for `num_experts`), else its
        layer."""
        family = self.family
        if layer in self.moe_layers:
            return _expanded(family.sparse_layer, self.num_experts)
        return family.layer

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Every layer's window, in layer order."""
        return tuple(self.window_of(i) for i in range(self.num_layers))

    def rope_of(self, layer: int) -> RopeConfig:
        """The RoPE decoder layer `layer` rotates by: `rope_local` on a sliding layer."""
        if self.rope_local is not None and self.window_of(layer) is not None:
            return self.rope_local
        return self.rope

    @property
    def attention_scale(self) -> float:
        """What q . k is multiplied by before the softmax: 1 / sqrt(head_dim), as SDPA's
        default, unless the family's scalar says otherwise."""
        return 1.0 / math.sqrt(self.attention_scalar or self.head_dim)

    @property
    def embedding_scale(self) -> float | None:
        """What the embedding's rows are multiplied by (None: nothing), as transformers does:
        sqrt(hidden_size) rounded to float32 for a family that scales them."""
        if not self.family.scale_embedding:
            return None
        return float(np.float32(self.hidden_size**0.5))

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        arch = hf.get("model_type")
        if arch not in MODEL_FAMILIES:
            raise ConfigError(
                f"config.json: model_type {arch!r} is not supported "
                f"(supported: {', '.join(MODEL_FAMILIES.names())})"
            )
        family = MODEL_FAMILIES.get(arch)
        missing = [k for k in _REQUIRED_SIZES if not isinstance(hf.get(k), int)]
        if missing:
            raise ConfigError(f"config.json lacks integer {', '.join(missing)}")
        _refuse_unsupported(family, hf)
        activation = hf.get(family.activation_key, family.activation)
        if activation != family.activation:
            raise ConfigError(
                f"config.json: {family.activation_key} {activation!r} "
                f"(expected {family.activation!r})"
            )
        heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        window, layer_windows = _window(family, hf)
        rotary_dim = _rotary_dim(hf, head_dim)
        rope = _rope_from_hf(hf, family.rope_scalings)
        _check_factors(rope, rotary_dim or head_dim)
        return cls(
            architecture=arch,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope=rope,
            rope_local=_local_rope(family, hf),
            qkv_bias=_switch(family.biases.qkv, hf),
            o_bias=_switch(family.biases.o, hf),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", family.tie_default)),
            sliding_window=window,
            layer_windows=layer_windows,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            **_experts(family.moe, hf),
            rotary_dim=rotary_dim,
            attention_scalar=_attention_scalar(family, hf),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        file = Path(path) / "config.json"
        try:
            return cls.from_hf(json.loads(file.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"{file}: cannot read the model config ({e})") from e
        except KeyError as e:
            raise ConfigError(f"{file}: missing required key {e}") from e

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        rope = dict(d["rope"])
        for key in ("short_factor", "long_factor"):
            if rope.get(key) is not None:
                rope[key] = tuple(rope[key])
        d = dict(d, rope=RopeConfig(**rope), eos_token_ids=tuple(d["eos_token_ids"]))
        if d.get("rope_local") is not None:
            d["rope_local"] = RopeConfig(**d["rope_local"])
        if d.get("layer_windows") is not None:
            d["layer_windows"] = tuple(d["layer_windows"])
        d["moe_layers"] = tuple(d.get("moe_layers", ()))
        return cls(**d)


@functools.lru_cache(maxsize=8)
def _expanded(spec: LayerSpec, num_experts: int) -> LayerSpec:
    """`spec.expand(num_experts)`, written out once per model, not once per question."""
    return spec.expand(num_experts)


def _switch(rule: bool | str, hf: dict[str, Any]) -> bool:
    """A family's feature that is always on or off (bool), or set by a config.json key."""
    return rule if isinstance(rule, bool) else bool(hf.get(rule, False))


def _window(
    family: ModelFamily, hf: dict[str, Any]
) -> tuple[int | None, tuple[int | None, ...] | None]:
    """(the window of the layers that slide, or None when none does; the per-layer windows
    when local and global layers mix, as transformers decides which slide (`WindowRule`),
    else None)."""
    rule = family.window
    if rule.key is None or (
        rule.switch is not None and not hf.get(rule.switch, rule.switch_default)
    ):
        return None, None
    window = hf.get(rule.key)
    if window is None:
        return None, None
    sliding = _sliding_layers(rule, hf)
    if all(sliding):
        return window, None
    if not any(sliding):
        return None, None
    return window, tuple(window if s else None for s in sliding)


def _sliding_layers(rule: WindowRule, hf: dict[str, Any]) -> list[bool]:
    """Which layers the window applies to, as transformers decides (`WindowRule`)."""
    num_layers = hf["num_hidden_layers"]
    types = hf.get(rule.layer_types) if rule.layer_types else None
    if isinstance(types, list):
        if len(types) != num_layers:
            raise ConfigError(
                f"config.json: {rule.layer_types} has {len(types)} entries for {num_layers} layers"
            )
        return [t == "sliding_attention" for t in types]
    period = hf.get(rule.period, rule.period_default) if rule.period else None
    if period:
        return [(i + 1) % period != 0 for i in range(num_layers)]
    if rule.first_sliding is not None:
        first = hf.get(rule.first_sliding, rule.first_sliding_default)
        return [i >= first for i in range(num_layers)]
    return [True] * num_layers


def _refuse_unsupported(family: ModelFamily, hf: dict[str, Any]) -> None:
    for key in family.unsupported_keys:
        if hf.get(key) not in (None, False):
            raise ConfigError(
                f"config.json: {key} {hf[key]!r} is not supported (ingot takes "
                f"{family.name} checkpoints without it: null or false)"
            )


def _attention_scalar(family: ModelFamily, hf: dict[str, Any]) -> float | None:
    key = family.attention_scalar_key
    return None if key is None or hf.get(key) is None else float(hf[key])


# transformers 5 writes the RoPE of models whose layer types rotate differently (Gemma 3) as
# rope_parameters {layer type: parameters}.
_GLOBAL, _LOCAL = "full_attention", "sliding_attention"


def _local_rope(family: ModelFamily, hf: dict[str, Any]) -> RopeConfig | None:
    """The sliding layers' RoPE of a family that gives them their own (default scaling; the
    base from rope_parameters' sliding_attention, else the family's config.json key)."""
    if family.local_rope_theta_key is None:
        return None
    nested = (hf.get("rope_parameters") or {}).get(_LOCAL)
    if nested is not None:
        return _rope_from_hf({"rope_parameters": nested}, ("default",))
    theta = hf.get(family.local_rope_theta_key, family.local_rope_theta_default)
    return RopeConfig(theta=float(theta))


def _experts(rule: MoeRule | None, hf: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields of a mixture of experts (`MoeRule`), as transformers builds its
    layers: sparse unless in `dense_layers` or off every `sparse_step`-th layer."""
    if rule is None:
        return {}
    aliased = {key: hf[alias] for alias, key in rule.aliases if alias in hf and key not in hf}
    hf = {**dict(rule.defaults), **hf, **aliased}
    sizes = {k: hf.get(k) for k in (rule.experts, rule.top_k, rule.expert_intermediate)}
    missing = [k for k, v in sizes.items() if not isinstance(v, int)]
    if missing:
        raise ConfigError(f"config.json lacks integer {', '.join(missing)}")
    experts, top_k = sizes[rule.experts], sizes[rule.top_k]
    if experts > 0 and not 0 < top_k <= experts:
        raise ConfigError(
            f"config.json: {rule.top_k} {top_k} is not between 1 and {rule.experts} {experts}"
        )
    step = hf.get(rule.sparse_step, 1) if rule.sparse_step else 1
    dense = set(hf.get(rule.dense_layers) or ()) if rule.dense_layers else set()
    layers = range(hf["num_hidden_layers"]) if experts > 0 else range(0)
    sparse = tuple(i for i in layers if i not in dense and (i + 1) % step == 0)
    return dict(
        moe_layers=sparse,
        num_experts=experts,
        top_k=top_k,
        norm_topk_prob=_switch(rule.norm_topk, hf),
        expert_intermediate_size=sizes[rule.expert_intermediate],
    )


def _rope_params(hf: dict[str, Any]) -> dict[str, Any]:
    # transformers >= 5 writes rope_parameters; older configs split rope_theta / rope_scaling.
    params = dict(hf.get("rope_parameters") or {})
    if _GLOBAL in params:  # per layer type: the global layers' (the local ones: _local_rope)
        params = dict(params[_GLOBAL] or {})
    return {**(hf.get("rope_scaling") or {}), **params}


def _rotary_dim(hf: dict[str, Any], head_dim: int) -> int | None:
    """The channels of each head RoPE rotates, as transformers computes them (None: all)."""
    fraction = _rope_params(hf).get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    if fraction is None or int(head_dim * fraction) == head_dim:
        return None
    dim = int(head_dim * fraction)
    if dim <= 0 or dim % 2:
        raise ConfigError(
            f"config.json: partial_rotary_factor {fraction} rotates {dim} of head_dim "
            f"{head_dim} channels (expected a positive even number)"
        )
    return dim


def _rope_from_hf(hf: dict[str, Any], supported: tuple[str, ...]) -> RopeConfig:
    params = _rope_params(hf)
    kind = params.get("rope_type") or params.get("type") or "default"
    kind = "longrope" if kind == "su" else kind  # LongRoPE's first name (Phi-3's early configs)
    if kind not in supported:
        raise ConfigError(
            f"config.json: rope type {kind!r} is not supported (supported: {', '.join(supported)})"
        )
    original = params.get(
        "original_max_position_embeddings", hf.get("original_max_position_embeddings")
    )
    rope = RopeConfig(
        theta=float(params.get("rope_theta", hf.get("rope_theta", 10000.0))),
        type=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=original,
    )
    return _longrope(rope, params, hf) if kind == "longrope" else rope


def _check_factors(rope: RopeConfig, rotated: int) -> None:
    """LongRoPE states one factor per rotated pair of channels."""
    for key in ("short_factor", "long_factor"):
        factors = getattr(rope, key)
        if factors is not None and len(factors) != rotated // 2:
            raise ConfigError(
                f"config.json: rope {key} has {len(factors)} entries "
                f"(expected {rotated // 2}: one per rotated pair of a head's channels)"
            )


def _longrope(rope: RopeConfig, params: dict[str, Any], hf: dict[str, Any]) -> RopeConfig:
    """LongRoPE's factors, and its attention factor as transformers derives it when config.json
    does not state one: sqrt(1 + ln(s) / ln(original)), s = `factor` or else
    max_position_embeddings / original_max_position_embeddings (1.0 when s <= 1)."""
    original = rope.original_max_position_embeddings
    missing = [k for k in ("short_factor", "long_factor") if not params.get(k)]
    if original is None:
        missing.append("original_max_position_embeddings")
    if missing:
        raise ConfigError(f"config.json: longrope RoPE needs {', '.join(missing)}")
    scale = params.get("factor") or hf.get("max_position_embeddings", 2048) / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(original))
    return replace(
        rope,
        factor=float(scale),
        short_factor=tuple(float(f) for f in params["short_factor"]),
        long_factor=tuple(float(f) for f in params["long_factor"]),
        attention_factor=float(attention),
    )
