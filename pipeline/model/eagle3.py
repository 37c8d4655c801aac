"""EAGLE-3 draft (Li et al. 2025) in the speculators layout: what `speculative.method: eagle`
trains, attaches, exports and ships.

One Llama decoder layer drafts from three of the target's hidden states: `fc` maps their
concatenation f_p ([3 Ht], the residual streams entering target layers `aux_layers`) to the
layer's hidden size; the layer's attention takes [input_layernorm(embed(tok[p+1])),
hidden_norm(hidden)] ([2H]: q/k/v_proj have 2H inputs), keeps a KV cache of its own, and its
output before the final norm (`prenorm`) is the next draft step's hidden input (no fc then).
Logits are over a draft vocabulary of Vd <= V tokens; `d2t[i]` is the offset of draft id i in
the target's vocabulary.

The speculators checkpoint (vLLM's `llama_eagle3.py` reads it): config.json with
speculators_model_type "eagle3", transformer_layer_config (a Llama config.json of the one
layer: its vocab_size is the target's), draft_vocab_size, norm_before_residual (absent: true,
as vLLM), target_hidden_size (absent: the layer's hidden_size) and
eagle_aux_hidden_state_layer_ids (absent: vLLM's default layers); safetensors tensors
`embed_tokens.weight` [V, H] (optional: absent, the draft shares the target's embedding),
`fc.weight` [H, 3 Ht], `layers.0.self_attn.{q,k,v,o}_proj.weight`, `layers.0.mlp.{gate,up,
down}_proj.weight`, `layers.0.{input_layernorm,hidden_norm,post_attention_layernorm}.weight`,
`norm.weight`, `lm_head.weight` [Vd, H], `d2t` int64 [Vd] and `t2d` bool [V] (both absent when
Vd = V: vLLM then has no parameter to load them into). `midlayer.` stands for `layers.0.` in
some checkpoints. norm_before_fc, fc_norm and norm_output variants are not supported.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ingot.common.errors import IngotError

from .config import ConfigError, ModelConfig, RopeConfig
from .families.llama import PLUGIN as LLAMA
from .head_checkpoint import check_tensors, read_config, read_tensors
from .layers import MLP, Attention, RMSNorm, make_norm

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "Eagle3Config",
    "Eagle3Draft",
    "Eagle3Error",
    "check_aux_layers",
    "default_aux_layers",
    "load_eagle3",
    "load_eagle3_config",
    "save_eagle3",
]

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
_EMBEDDING = "embed_tokens.weight"
_UNSUPPORTED = ("norm_before_fc", "fc_norm", "norm_output")  # vLLM variants with extra norms


class Eagle3Error(IngotError, ValueError):
    """An EAGLE-3 checkpoint that cannot serve this target; the message names the file."""


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """vLLM's (2, L // 2, L - 3) where those are three distinct layers (L >= 7); for shallower
    targets three spread-out ones ((0, 1, 2) at 3 layers). vLLM collects the aux states once
    per layer in layer order, so they must be distinct and ascending: its own default for a
    4-layer target, (2, 2, 1), gives two states where fc reads three."""
    if num_layers < 3:
        raise Eagle3Error(
            f"an EAGLE-3 draft reads 3 distinct layers of the target, which has {num_layers}"
        )
    vllm = (2, num_layers // 2, num_layers - 3)
    if vllm[0] < vllm[1] < vllm[2]:
        return vllm
    return (0, 1, 2) if num_layers == 3 else (1, num_layers // 2, num_layers - 1)


def check_aux_layers(layers: Sequence[int], num_layers: int, where: str) -> None:
    """Three distinct ascending layers of the target (`default_aux_layers` says why), else
    Eagle3Error naming `where`."""
    layers = list(layers)
    if len(layers) != 3 or not all(0 <= i < num_layers for i in layers):
        raise Eagle3Error(
            f"{where} {layers}: must be 3 layers in [0, {num_layers - 1}] (the target's layers)"
        )
    if not layers[0] < layers[1] < layers[2]:
        raise Eagle3Error(
            f"{where} {layers}: must be distinct and ascending (vLLM concatenates the aux "
            "states in layer order, once per layer)"
        )


@dataclass(frozen=True, slots=True)
class Eagle3Config:
    layer: ModelConfig  # the draft layer (num_layers 1; vocab_size is the target's)
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    norm_before_residual: bool
    aux_layers: tuple[int, int, int]
    has_embedding: bool  # the checkpoint carries its own embed_tokens

    @property
    def hidden_size(self) -> int:
        return self.layer.hidden_size

    def to_speculators(
        self, num_speculative_tokens: int, verifier: str, verifier_class: str
    ) -> dict[str, Any]:
        """config.json in the speculators format (module docstring); the verifier (the target)
        is `verifier` (its name or path) of class `verifier_class` (its family's)."""
        return {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.3.0",
            "transformer_layer_config": _llama_config(self.layer),
            "draft_vocab_size": self.draft_vocab_size,
            "norm_before_residual": self.norm_before_residual,
            "target_hidden_size": self.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [
                    {"proposal_type": "greedy", "speculative_tokens": num_speculative_tokens}
                ],
                "verifier": {"name_or_path": verifier, "architectures": [verifier_class]},
            },
        }


class _Eagle3Layer(nn.Module):
    """The draft's decoder layer: a Llama layer (`cfg`'s family is llama) whose attention reads
    [embedding, hidden]."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.input_layernorm = make_norm(cfg)
        self.hidden_norm = make_norm(cfg)
        self.self_attn = Attention(cfg)
        self.self_attn.q_proj = nn.Linear(2 * h, cfg.num_heads * d, bias=cfg.qkv_bias)
        self.self_attn.k_proj = nn.Linear(2 * h, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.self_attn.v_proj = nn.Linear(2 * h, cfg.num_kv_heads * d, bias=cfg.qkv_bias)
        self.post_attention_layernorm = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, embeds, hidden, cos, sin, mask, past, norm_before_residual: bool):
        e = self.input_layernorm(embeds)  # [B, T, H]
        hn = self.hidden_norm(hidden)  # [B, T, H]
        residual = hn if norm_before_residual else hidden
        a, kv = self.self_attn(torch.cat([e, hn], dim=-1), cos, sin, mask, past)
        residual = residual + a
        return residual + self.mlp(self.post_attention_layernorm(residual)), kv


class Eagle3Draft(nn.Module):
    """The draft; parameter names are the speculators' (embed_tokens, fc, layers.0.*, norm,
    lm_head, d2t). A shared (target's) embedding is a frozen, non-persistent buffer: it is
    neither trained nor saved."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.embed_tokens: nn.Embedding | None = (
            nn.Embedding(cfg.vocab_size, h) if cfg.has_embedding else None
        )
        self.fc = nn.Linear(3 * cfg.target_hidden_size, h, bias=False)
        self.layers = nn.ModuleList([_Eagle3Layer(cfg.layer)])
        self.norm = make_norm(cfg.layer)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))

    def set_embedding(self, table: torch.Tensor) -> None:
        """Share the target's embedding table [V, H] (frozen; not in state_dict)."""
        if self.cfg.has_embedding:
            raise Eagle3Error("this draft has an embedding of its own (has_embedding)")
        want = (self.cfg.vocab_size, self.cfg.hidden_size)
        if tuple(table.shape) != want:
            raise Eagle3Error(
                f"the target's embedding is {list(table.shape)}; the draft needs {list(want)} "
                "(vocab_size, hidden_size)"
            )
        with torch.device("meta"):
            embedding = nn.Embedding(*want)
        del embedding.weight
        embedding.register_buffer("weight", table.detach().float(), persistent=False)
        self.embed_tokens = embedding

    def combine(self, features: torch.Tensor) -> torch.Tensor:
        """The target's aux states [..., 3 Ht] -> the draft's hidden input [..., H]."""
        return self.fc(features)

    def forward(
        self,
        ids: torch.Tensor,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """ids [B, T] (the token after each position), hidden [B, T, H] (fc(features) or the
        previous step's prenorm), cos/sin [B, T, D/2], mask [B, 1, T, P+T] bool, past K/V
        [B, Hkv, P, D] -> logits [B, T, Vd], prenorm [B, T, H], K/V [B, Hkv, P+T, D]."""
        if self.embed_tokens is None:
            raise Eagle3Error("the draft has no embedding: set_embedding(the target's table)")
        layer = self.layers[0]
        prenorm, kv = layer(
            self.embed_tokens(ids), hidden, cos, sin, mask, past, self.cfg.norm_before_residual
        )
        return self.lm_head(self.norm(prenorm)), prenorm, kv

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft vocabulary ids -> the target's (draft_id + d2t[draft_id])."""
        return draft_ids + self.d2t[draft_ids]

    @classmethod
    def for_target(
        cls,
        target_cfg: ModelConfig,
        aux_layers: tuple[int, int, int],
        lm_head_weight: torch.Tensor,
        embedding: torch.Tensor,
        seed: int,
    ) -> Eagle3Draft:
        """A draft to train for the target: its layer has the target's shapes and RoPE, its
        vocabulary is the target's (d2t zeros), its embedding is the target's `embedding`
        [V, Ht] (shared, frozen) and its lm_head starts as a copy of `lm_head_weight` [V, Ht];
        the other linears are N(0, 0.02) from `seed`, the norms ones. A RoPE a Llama layer
        cannot hold (Phi-3's longrope, partial rotary) becomes plain RoPE of the target's base:
        the draft is trained with it, and vLLM's Llama draft rotates whole heads."""
        rope = target_cfg.rope
        if rope.type not in LLAMA.rope_scalings:
            rope = RopeConfig(theta=rope.theta)
        layer = replace(
            target_cfg,
            architecture=LLAMA.name,  # the speculators layer is a Llama layer, whatever the target
            rope=rope,
            rotary_dim=None,
            num_layers=1,
            qkv_bias=False,  # the speculators layout has no attention biases
            o_bias=False,
            tie_word_embeddings=False,
            sliding_window=None,  # the draft attends over its whole cache, as vLLM's does
            layer_windows=None,
            bos_token_id=None,
            eos_token_ids=(),
        )
        cfg = Eagle3Config(
            layer=layer,
            vocab_size=target_cfg.vocab_size,
            draft_vocab_size=target_cfg.vocab_size,
            target_hidden_size=target_cfg.hidden_size,
            # True (vLLM's default too): the residual stream starts from hidden_norm(hidden),
            # so its scale does not follow the raw aux states' (which grow with depth), and
            # step 0 (fc of the features) and later steps (a prenorm) enter it alike.
            norm_before_residual=True,
            aux_layers=tuple(aux_layers),
            has_embedding=False,
        )
        draft = cls(cfg)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for module in draft.modules():
                if isinstance(module, nn.Linear):
                    module.weight.normal_(0.0, 0.02, generator=generator)
                    if module.bias is not None:
                        module.bias.zero_()
                elif isinstance(module, RMSNorm):
                    module.weight.fill_(1.0)
            draft.lm_head.weight.copy_(lm_head_weight)
        draft.set_embedding(embedding)
        return draft


def save_eagle3(
    draft: Eagle3Draft,
    out: Path,
    num_speculative_tokens: int,
    verifier: str,
    verifier_class: str,
) -> None:
    """config.json + model.safetensors in the speculators layout (no embed_tokens when the
    draft shares the target's; no d2t / t2d over the full vocabulary). The verifier is the
    target: `verifier` its name or path, `verifier_class` its family's (`ModelFamily.hf_class`)."""
    cfg = draft.cfg
    out.mkdir(parents=True, exist_ok=True)
    config = cfg.to_speculators(num_speculative_tokens, verifier, verifier_class)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    tensors = {name: t.detach().contiguous() for name, t in draft.state_dict().items()}
    if cfg.draft_vocab_size == cfg.vocab_size:
        del tensors["d2t"]
    else:
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[draft.to_target_ids(torch.arange(cfg.draft_vocab_size))] = True
        tensors["t2d"] = t2d
    save_file(tensors, str(out / WEIGHTS_FILE))


def load_eagle3(
    path: Path,
    target_embedding: torch.Tensor | None = None,
    *,
    target_num_layers: int | None = None,
) -> Eagle3Draft:
    """The EAGLE-3 checkpoint in ``path`` as a float32 draft. Without embed_tokens of its own
    it shares ``target_embedding`` [V, H]; ``target_num_layers`` stands in for absent
    eagle_aux_hidden_state_layer_ids (and checks given ones). Raises `Eagle3Error` naming the
    file and what is wrong."""
    file = path / CONFIG_FILE
    raw = read_config(file, Eagle3Error)
    if target_num_layers is None and raw.get("eagle_aux_hidden_state_layer_ids") is None:
        raise Eagle3Error(
            f"{file}: no eagle_aux_hidden_state_layer_ids: the target's num_layers is needed "
            "for vLLM's default"
        )
    sizes = {}
    if target_embedding is not None:  # [V, Ht]
        sizes = {"vocab_size": target_embedding.shape[0], "hidden_size": target_embedding.shape[1]}
    cfg = _config(raw, file, target_num_layers, **sizes)
    tensors = read_tensors(path, lambda n: n.replace("midlayer.", "layers.0.", 1), Eagle3Error)
    if "d2t" not in tensors and cfg.draft_vocab_size == cfg.vocab_size:
        tensors["d2t"] = torch.zeros(cfg.vocab_size, dtype=torch.int64)
    draft = Eagle3Draft(cfg)
    expected = draft.state_dict()
    check_tensors(path, tensors, expected, "the speculators layout", Eagle3Error)
    d2t = tensors["d2t"].long()
    mapped = torch.arange(cfg.draft_vocab_size) + d2t
    if len(mapped) and (int(mapped.min()) < 0 or int(mapped.max()) >= cfg.vocab_size):
        raise Eagle3Error(
            f"{path}: d2t maps draft ids outside the target's vocabulary [0, {cfg.vocab_size})"
        )
    draft.load_state_dict({n: d2t if n == "d2t" else tensors[n].float() for n in expected})
    if not cfg.has_embedding:
        if target_embedding is None:
            raise Eagle3Error(
                f"{path}: no {_EMBEDDING}: the draft shares the target's embedding, which "
                "was not given"
            )
        try:
            draft.set_embedding(target_embedding)
        except Eagle3Error as e:
            raise Eagle3Error(f"{path}: {e}") from None
    return draft.eval()


def load_eagle3_config(
    path: Path,
    target_num_layers: int,
    *,
    vocab_size: int | None = None,
    hidden_size: int | None = None,
) -> Eagle3Config:
    """The EAGLE-3 checkpoint's config (config.json; of the weights only the safetensors
    headers, for has_embedding), checked against a target of ``target_num_layers`` layers and,
    when given, the target's ``vocab_size`` and ``hidden_size``."""
    file = path / CONFIG_FILE
    return _config(
        read_config(file, Eagle3Error),
        file,
        target_num_layers,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
    )


def _config(
    raw: dict,
    file: Path,
    target_num_layers: int | None,
    vocab_size: int | None = None,
    hidden_size: int | None = None,
) -> Eagle3Config:
    kind = raw.get("speculators_model_type")
    if kind != "eagle3":
        raise Eagle3Error(f"{file}: speculators_model_type {kind!r} (expected 'eagle3')")
    layer = _layer_config(raw.get("transformer_layer_config"), file)
    v = layer.vocab_size
    draft_vocab = _positive(raw, "draft_vocab_size", file, default=v)
    if draft_vocab > v:
        raise Eagle3Error(f"{file}: draft_vocab_size {draft_vocab} exceeds vocab_size {v}")
    target_hidden = _positive(raw, "target_hidden_size", file, default=layer.hidden_size)
    for key, mine, theirs in (
        ("transformer_layer_config.vocab_size", v, vocab_size),
        ("target_hidden_size", target_hidden, hidden_size),
    ):
        if theirs is not None and mine != theirs:
            raise Eagle3Error(f"{file}: {key} {mine} is not the target's {theirs}")
    before = raw.get("norm_before_residual", True)
    if not isinstance(before, bool):
        raise Eagle3Error(f"{file}: norm_before_residual must be true or false, got {before!r}")
    unsupported = [key for key in _UNSUPPORTED if raw.get(key)]
    if unsupported:
        raise Eagle3Error(f"{file}: {', '.join(unsupported)} not supported")
    return Eagle3Config(
        layer=layer,
        vocab_size=v,
        draft_vocab_size=draft_vocab,
        target_hidden_size=target_hidden,
        norm_before_residual=before,
        aux_layers=_aux_layers(raw, file, target_num_layers),
        has_embedding=_has_embedding(file.parent),
    )


def _layer_config(raw: Any, file: Path) -> ModelConfig:
    where = f"{file}: transformer_layer_config"
    if not isinstance(raw, dict):
        raise Eagle3Error(f"{where} missing (a Llama config.json of the draft layer)")
    raw = {"model_type": LLAMA.name, "num_hidden_layers": 1, **raw}  # vLLM's defaults
    if raw["model_type"] != LLAMA.name:
        raise Eagle3Error(f"{where}.model_type {raw['model_type']!r} (expected {LLAMA.name!r})")
    if raw["num_hidden_layers"] != 1:
        raise Eagle3Error(f"{where}.num_hidden_layers {raw['num_hidden_layers']!r} (expected 1)")
    if raw.get("mlp_bias", False):
        raise Eagle3Error(f"{where}.mlp_bias true is not supported")
    try:
        layer = ModelConfig.from_hf(raw)
    except ConfigError as e:
        raise Eagle3Error(f"{where}: {e}") from None
    if layer.num_heads % layer.num_kv_heads:
        raise Eagle3Error(
            f"{where}: num_attention_heads {layer.num_heads} is not a multiple of "
            f"num_key_value_heads {layer.num_kv_heads}"
        )
    return layer


def _positive(raw: dict, key: str, file: Path, default: int) -> int:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Eagle3Error(f"{file}: {key} must be a positive integer, got {value!r}")
    return value


def _aux_layers(config: dict, file: Path, num_layers: int | None) -> tuple[int, int, int]:
    key = "eagle_aux_hidden_state_layer_ids"
    raw = config.get(key)
    if raw is None:
        return default_aux_layers(num_layers)
    ints = isinstance(raw, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in raw
    )
    if not ints or len(raw) != 3:
        raise Eagle3Error(f"{file}: {key} must be 3 layer indices, got {raw!r}")
    if num_layers is not None:
        check_aux_layers(raw, num_layers, f"{file}: {key}")
    return tuple(raw)


def _has_embedding(path: Path) -> bool:
    """Whether the checkpoint's safetensors (their headers only) hold embed_tokens."""
    for weights in sorted(path.glob("*.safetensors")):
        with safe_open(str(weights), framework="pt") as f:
            if _EMBEDDING in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
                return True
    return False


def _llama_config(layer: ModelConfig) -> dict[str, Any]:
    """The draft layer as a Llama config.json (what ModelConfig.from_hf reads back)."""
    config: dict[str, Any] = {
        "architectures": [LLAMA.hf_class],
        "model_type": LLAMA.name,
        "hidden_size": layer.hidden_size,
        "intermediate_size": layer.intermediate_size,
        "num_attention_heads": layer.num_heads,
        "num_key_value_heads": layer.num_kv_heads,
        "head_dim": layer.head_dim,
        "rms_norm_eps": layer.rms_norm_eps,
        "rope_theta": layer.rope.theta,
        "max_position_embeddings": layer.max_position_embeddings,
        "vocab_size": layer.vocab_size,
        "num_hidden_layers": 1,
        "hidden_act": LLAMA.activation,
        "attention_bias": layer.qkv_bias,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }
    rope = layer.rope
    if rope.type != "default":
        scaling: dict[str, Any] = {"rope_type": rope.type, "factor": rope.factor}
        if rope.type == "llama3":
            scaling |= {
                "low_freq_factor": rope.low_freq_factor,
                "high_freq_factor": rope.high_freq_factor,
            }
        if rope.original_max_position_embeddings is not None:
            scaling["original_max_position_embeddings"] = rope.original_max_position_embeddings
        config["rope_scaling"] = scaling
    return config
