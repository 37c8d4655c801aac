"""A model family described once: what the IR, the ONNX decoder, interop and the EAGLE draft
read instead of comparing `model_type` strings.

A family is a module under `pipeline/model/families/` (or another distribution's, declared
under the entry-point group ``ingot.model_families``) that defines ``PLUGIN``, a frozen
`ModelFamily`, found in `MODEL_FAMILIES` by config.json's ``model_type``. The descriptor says:

- how config.json's fields become a `ModelConfig` (`Biases`, `WindowRule`, the activation's
  key and value, the RoPE scalings it accepts, the tying default): config.py applies them;
- the decoder layer as data (`LayerSpec`: its linears with their widths and bias flags, the
  groups in compute order, its norms, where a per-channel scale folds, what RoPE rotates):
  architecture.py answers questions about it, layers.py takes the linears' shapes and biases
  from it, the quantizers walk its groups;
- the building blocks the layer is made of (`norm`, `activation`): the IR (layers.py) and the
  ONNX decoder (export/decoder.py) each keep one table of the blocks they implement;
- the checkpoint's tensor names (`TensorNames`, HF <-> IR) and its llama.cpp architecture
  (`Gguf`).

Torch-free: the recipe checks and `ingot plan` read it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Literal

from ingot.common import Registry

__all__ = [
    "LM_HEAD",
    "MODEL_FAMILIES",
    "Biases",
    "Dim",
    "EXPERT",
    "FusedLinear",
    "Gguf",
    "LayerLinear",
    "LayerSpec",
    "ModelFamily",
    "MoeRule",
    "ScaleFold",
    "TensorNames",
    "WindowRule",
]

# The widths a linear reads or writes, by what config.json derives them from ("experts": a
# router's output, one logit per expert; "expert_intermediate": an expert MLP's width).
Dim = Literal["hidden", "intermediate", "q", "kv", "vocab", "experts", "expert_intermediate"]

# In a layer's linear names, {e} stands for an expert's number: "mlp.experts.{e}.up_proj" is
# one linear per expert of the model (`LayerSpec.expand`).
EXPERT = "{e}"


@dataclass(frozen=True, slots=True)
class LayerLinear:
    """One linear of a decoder layer. `bias` names the ModelConfig flag that gives it one."""

    name: str  # inside the layer: "attn.q_proj"; the IR's full name is layers.{i}.<name>
    in_dim: Dim
    out_dim: Dim
    bias: Literal["qkv_bias", "o_bias"] | None = None


# The output projection every decoder family ends with (its weight is the embedding's when
# tied).
LM_HEAD = LayerLinear("lm_head", "hidden", "vocab")


@dataclass(frozen=True, slots=True)
class ScaleFold:
    """Where a per-input-channel scale of `group` (AWQ, SmoothQuant) folds without changing
    the float model: into `source`, the module whose output is the group's input."""

    source: str  # a norm of the layer ("attn_norm") or a linear ("attn.v_proj")
    group: tuple[str, ...]
    # Folds only when every query head has a key/value head of its own (no GQA): a shared
    # head would need one scale for several query heads.
    whole_heads: bool = False


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """A decoder layer as data: what it holds and in which order its inputs are computed."""

    linears: tuple[LayerLinear, ...]
    # The linears in the order their inputs are computed; the linears of a group share one
    # input, and each group's input depends only on the groups before it (true-sequential).
    groups: tuple[tuple[str, ...], ...]
    norms: tuple[str, ...]  # the layer's norms (IR names inside the layer), in model order
    folds: tuple[ScaleFold, ...]  # in compute order
    rotated: tuple[str, ...]  # the linears whose outputs RoPE rotates, per head
    # Norms over head_dim applied per head to q and k before RoPE (Qwen3, Gemma 3: IR names
    # "attn.q_norm", "attn.k_norm"), not fold sources: they sit after the projections.
    head_norms: tuple[str, ...] = ()
    # The norms of a sublayer's output before its residual add (Gemma's post-attention and
    # post-feed-forward norms), in `norms` too: (after attention, after the MLP), or () for
    # none. Never a fold source: their outputs feed no linear, only the residual stream.
    post_norms: tuple[str, ...] = ()

    @property
    def norm_groups(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(norm, group): the groups whose shared input is a norm's output."""
        return tuple((f.source, f.group) for f in self.folds if f.source in self.norms)

    def linear(self, local: str) -> LayerLinear:
        """The entry of a linear by its name inside the layer (`attn.q_proj`; an expert's
        `mlp.experts.3.up_proj` finds the `mlp.experts.{e}.up_proj` entry)."""
        template = _EXPERT_NUMBER.sub(".experts.{e}.", local)
        for linear in self.linears:
            if linear.name in (local, template):
                return linear
        raise KeyError(local)

    def expand(self, num_experts: int) -> LayerSpec:
        """The layer with its per-expert entries ({e}) written out once per expert, in model
        order: a run of consecutive per-expert entries (an expert's linears, its groups) is
        repeated expert by expert, as the IR builds its experts and computes each."""

        def fill(item, e: str):
            if isinstance(item, LayerLinear):
                return LayerLinear(
                    item.name.replace(EXPERT, e), item.in_dim, item.out_dim, item.bias
                )
            if isinstance(item, ScaleFold):
                return ScaleFold(fill(item.source, e), fill(item.group, e), item.whole_heads)
            if isinstance(item, tuple):
                return tuple(n.replace(EXPERT, e) for n in item)
            return item.replace(EXPERT, e)

        def expanded(items: tuple) -> tuple:
            out, run = [], []
            for item in (*items, None):
                if item is not None and EXPERT in repr(item):
                    run.append(item)
                    continue
                out.extend(fill(r, str(e)) for e in range(num_experts) for r in run)
                run = []
                if item is not None:
                    out.append(item)
            return tuple(out)

        linears, groups, folds = map(expanded, (self.linears, self.groups, self.folds))
        return dataclasses.replace(self, linears=linears, groups=groups, folds=folds)


_EXPERT_NUMBER = re.compile(r"\.experts\.\d+\.")


@dataclass(frozen=True, slots=True)
class FusedLinear:
    """One checkpoint tensor stacking several of the layer's linears along the output rows
    (Phi-3's qkv_proj = [q; k; v]). The IR keeps the parts as linears of their own; the
    reader splits the tensor, the interop writers stack the parts again, and a recipe pattern
    naming the fused tensor selects its parts."""

    name: str  # inside the layer, as the IR would name it: "attn.qkv_proj"
    parts: tuple[str, ...]  # the layer's linears it stacks, in row order


@dataclass(frozen=True, slots=True)
class TensorNames:
    """Checkpoint (HF) <-> IR tensor names, as (HF prefix, IR prefix) pairs, the first that
    matches applies; {i} stands for a layer number, {e} for an expert's. Names no prefix
    matches (lm_head) are the same in both."""

    prefixes: tuple[tuple[str, str], ...]

    def to_ir(self, hf_name: str) -> str:
        """`model.layers.0.self_attn.q_proj` -> `layers.0.attn.q_proj` (Llama's names)."""
        return _rename(hf_name, _rules(self.prefixes))

    def to_hf(self, ir_name: str) -> str:
        """`layers.0.attn.q_proj` -> `model.layers.0.self_attn.q_proj` (Llama's names)."""
        return _rename(ir_name, _rules(tuple((ir, hf) for hf, ir in self.prefixes)))


@functools.cache
def _rules(pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[re.Pattern[str], str], ...]:
    """(pattern, replacement) per (from, to) prefix pair; {i} and {e} match and keep their
    numbers."""
    numbers = {"{i}": "i", "{e}": "e"}

    # A prefix ending in "." also matches the module it names ("…experts.0.w1" as well as
    # "…experts.0.w1.weight"): a family renaming a module itself (Mixtral's w1 -> gate_proj)
    # renames a module's name as its tensors'.
    def pattern(old: str) -> re.Pattern[str]:
        text = re.escape(old.removesuffix("."))
        for mark, group in numbers.items():
            text = text.replace(re.escape(mark), rf"(?P<{group}>\d+)")
        return re.compile("^" + text + (r"(?P<end>\.|$)" if old.endswith(".") else ""))

    def replacement(old: str, new: str) -> str:
        for mark, group in numbers.items():
            new = new.replace(mark, rf"\g<{group}>")
        return new.removesuffix(".") + r"\g<end>" if old.endswith(".") else new

    return tuple((pattern(old), replacement(old, new)) for old, new in pairs)


def _rename(name: str, rules: tuple[tuple[re.Pattern[str], str], ...]) -> str:
    for pattern, replacement in rules:
        renamed, n = pattern.subn(replacement, name)
        if n:
            return renamed
    return name


@dataclass(frozen=True, slots=True)
class Biases:
    """Which attention linears have biases: always (True), never (False), or as the config.json
    key of that name says (absent: none)."""

    qkv: bool | str = False
    o: bool | str = False


@dataclass(frozen=True, slots=True)
class WindowRule:
    """Where config.json states a sliding window: `key` (None: the family has none), turned
    off by a false `switch` key when the family has one, and which layers it applies to, as
    transformers reads them: every layer, unless the family names `layer_types` (a list of
    "sliding_attention" | "full_attention", when config.json has it) or else `first_sliding`
    (the first layer that slides, `first_sliding_default` when absent: Qwen2's
    max_window_layers, below which layers attend to the whole context)."""

    key: str | None = "sliding_window"
    switch: str | None = "use_sliding_window"
    layer_types: str | None = None
    first_sliding: str | None = None
    first_sliding_default: int = 0
    # Without `layer_types`: the config.json key of a period p, every p-th layer global, the
    # others sliding (Gemma 3's sliding_window_pattern; `period_default` when absent). None:
    # `first_sliding` decides.
    period: str | None = None
    period_default: int = 0
    # The `switch` when config.json lacks it: on (Mistral's configs have no such key), or off
    # as transformers' Qwen configs default use_sliding_window to false.
    switch_default: bool = True


@dataclass(frozen=True, slots=True)
class Gguf:
    """The family in llama.cpp: its architecture name, and whether the rows RoPE rotates are
    reordered from HF's halves to llama.cpp's interleaved pairs (convert_hf_to_gguf's
    permute, for the architectures llama.cpp runs with normal rather than NEOX RoPE)."""

    arch: str  # general.architecture: "llama", "qwen2"
    permute_rotated: bool
    # The rope_type values llama.cpp runs for this architecture (the writer stores their
    # tables: llama3's rope_freqs, longrope's rope_factors_long / _short).
    rope_scalings: tuple[str, ...] = ("default", "linear", "llama3")
    # llama.cpp runs this architecture's sliding-window layers, mixed with global ones as
    # attention.sliding_window_pattern says, rotating by rope.freq_base_swa (Gemma 3); False:
    # it runs no window (a binding one is refused).
    windows: bool = False
    # llama.cpp ignores a GGUF's attention scale for some architectures and computes its own:
    # head_dim ** -0.5, or (hidden / heads) ** -0.5 in a model of this many layers (Gemma 3
    # 27B: 62). None: it takes head_dim ** -0.5 always.
    wide_scale_layers: int | None = None


@dataclass(frozen=True, slots=True)
class MoeRule:
    """Where config.json describes a sparse mixture-of-experts MLP: each of `experts` experts
    (a gated MLP of width `expert_intermediate`) and a router choosing `top_k` of them per
    token, their softmax weights renormalised over the chosen when `norm_topk` (always, or as
    that key says; absent: not). Every layer is sparse unless the family names `sparse_step`
    (every n-th layer, counting from 1) or `dense_layers` (a list of layers kept dense)."""

    experts: str  # "num_local_experts" (Mixtral), "num_experts" (Qwen3-MoE)
    top_k: str = "num_experts_per_tok"
    norm_topk: bool | str = True
    expert_intermediate: str = "intermediate_size"
    sparse_step: str | None = None  # "decoder_sparse_step"
    dense_layers: str | None = None  # "mlp_only_layers"
    # transformers' values for the keys above a config.json may omit: (key, value) pairs.
    defaults: tuple[tuple[str, int], ...] = ()
    # Other names config.json may give those keys (transformers' attribute_map): (alias, key).
    aliases: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ModelFamily:
    """One model family (see the module docstring for who reads what)."""

    name: str  # config.json model_type: the registry's key
    hf_class: str  # config.json architectures[0]: "LlamaForCausalLM"
    layer: LayerSpec
    tensor_names: TensorNames
    biases: Biases = Biases()
    window: WindowRule = WindowRule()
    norm: str = "rms"  # the IR's norm block: "rms" = RMSNorm, weight * x / rms(x)
    activation: str = "silu"  # the gated MLP's activation, by config.json's name for it
    activation_key: str = "hidden_act"  # the config.json key that names it
    # The rope_type values config.json may name (rope.py's SCALINGS computes them).
    rope_scalings: tuple[str, ...] = ("default", "linear", "dynamic", "llama3")
    tie_default: bool = False  # tie_word_embeddings when config.json does not say
    gguf: Gguf | None = None  # None: llama.cpp has no architecture for it
    # Checkpoint tensors that stack several of the layer's linears (none: one tensor each).
    fused: tuple[FusedLinear, ...] = ()
    # The embedding's rows are multiplied by sqrt(hidden_size) (Gemma), before the first layer
    # only: a tied lm_head computes with the table as stored.
    scale_embedding: bool = False
    # The config.json key of a scalar s making the attention scale s ** -0.5 (Gemma's
    # query_pre_attn_scalar); None, or the key absent: head_dim ** -0.5.
    attention_scalar_key: str | None = None
    # The config.json key of the sliding layers' own RoPE base (Gemma 3's rope_local_base_freq)
    # when rope_parameters does not give them one (transformers 5 writes
    # {"full_attention": {...}, "sliding_attention": {...}}); None: every layer shares one.
    local_rope_theta_key: str | None = None
    local_rope_theta_default: float = 10000.0
    # config.json keys the IR does not implement: a checkpoint setting any (not null / false)
    # is refused when its config is read (Gemma's logit soft-capping).
    unsupported_keys: tuple[str, ...] = ()
    # A mixture-of-experts family: the layer whose MLP is sparse (router + experts; `layer`
    # stays the dense one, which the layers `moe` keeps dense use), and how config.json
    # describes the experts. None: every layer is `layer`.
    sparse_layer: LayerSpec | None = None
    moe: MoeRule | None = None

    def fused_of(self, local: str) -> FusedLinear | None:
        """The fused tensor a linear of the layer (`attn.q_proj`) is stored in, if any."""
        return next((f for f in self.fused if local in f.parts), None)

    @property
    def qk_norm(self) -> bool:
        """Whether q and k are normed per head before RoPE (`LayerSpec.head_norms`)."""
        return bool(self.layer.head_norms)


MODEL_FAMILIES: Registry[ModelFamily] = Registry(
    "model family",
    {
        "llama": "ingot.pipeline.model.families.llama",
        "mistral": "ingot.pipeline.model.families.mistral",
        "qwen2": "ingot.pipeline.model.families.qwen2",
        "phi3": "ingot.pipeline.model.families.phi3",
        "qwen3": "ingot.pipeline.model.families.qwen3",
        "gemma3_text": "ingot.pipeline.model.families.gemma3",
        "mixtral": "ingot.pipeline.model.families.mixtral",
        "qwen3_moe": "ingot.pipeline.model.families.qwen3_moe",
    },
    group="ingot.model_families",
)
