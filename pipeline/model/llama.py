"""The causal LM of every registered family (Llama, Mistral, Qwen2): embedding, decoder
layers (`layers.py`, built from the family), final norm, lm_head.

One definition serves as the reference implementation, the calibration vehicle and the
export source."""

from __future__ import annotations

import torch
from torch import nn

from .config import ModelConfig, RopeConfig
from .layers import DecoderLayer, make_norm
from .qembedding import QuantizedEmbedding
from .rope import cos_sin

__all__ = [
    "LlamaModel",
    "KVCache",
    "causal_mask",
    "embedding_rows",
    "rope_tables",
    "scale_embedding",
    "window_masks",
]

# Per layer (k, v): [B, Hkv, P, D] each, P = tokens seen so far.
KVCache = list[tuple[torch.Tensor, torch.Tensor]]


def causal_mask(
    q_positions: torch.Tensor, k_positions: torch.Tensor, window: int | None = None
) -> torch.Tensor:
    """[B, 1, Tq, Tk] bool, True where query i may attend key j (j's position <= i's)."""
    diff = q_positions[:, :, None] - k_positions[:, None, :]  # [B, Tq, Tk]
    allowed = diff >= 0
    if window is not None:
        allowed &= diff < window
    return allowed[:, None]


def window_masks(
    q_positions: torch.Tensor, k_positions: torch.Tensor, cfg: ModelConfig
) -> dict[int | None, torch.Tensor]:
    """`causal_mask` once per distinct layer window of `cfg` (a layer reads
    ``masks[layer.window]``): one mask for a model whose layers share a window, two for one
    mixing local and global layers."""
    return {w: causal_mask(q_positions, k_positions, w) for w in set(cfg.windows)}


def rope_tables(
    cfg: ModelConfig, positions: torch.Tensor, seq_len: int | None = None
) -> dict[RopeConfig, tuple[torch.Tensor, torch.Tensor]]:
    """`cos_sin` once per distinct RoPE of `cfg`'s layers (a layer reads
    ``tables[layer.rope]``): one pair unless the sliding layers rotate by their own base."""
    ropes = {cfg.rope_of(i) for i in range(cfg.num_layers)}
    return {rope: cos_sin(cfg, positions, seq_len, rope) for rope in ropes}


def scale_embedding(cfg: ModelConfig, rows: torch.Tensor) -> torch.Tensor:
    """The embedding's rows [..., hidden] as the first layer reads them: times the family's
    scale (Gemma: sqrt(hidden_size)), else as they are."""
    return rows if cfg.embedding_scale is None else rows * cfg.embedding_scale


def embedding_rows(cfg: ModelConfig, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """ids [...] -> the first layer's input [..., hidden] from the float table [V, hidden]."""
    return scale_embedding(cfg, nn.functional.embedding(ids, table))


class LlamaModel(nn.Module):
    """Module names match the recipe's targets: ``layers.{i}.attn.q_proj``, ``lm_head``, …"""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_lm_head()

    def tie_lm_head(self) -> None:
        """Share the embedding's tensor with lm_head when the config ties them: a quantized
        embedding's codes (lm_head then computes with them), or a float embedding's weight
        while lm_head is float (a quantized lm_head of a float embedding holds codes of its
        own: it is then stored untied)."""
        if not self.cfg.tie_word_embeddings:
            return
        if isinstance(self.embed_tokens, QuantizedEmbedding):
            self.lm_head = self.embed_tokens.linear()
        elif isinstance(self.lm_head, nn.Linear):
            self.lm_head.weight = self.embed_tokens.weight

    @property
    def lm_head_tied(self) -> bool:
        """lm_head computes with the embedding's own tensor: stored once, exported once."""
        if isinstance(self.embed_tokens, QuantizedEmbedding):
            return getattr(self.lm_head, "codes", None) is self.embed_tokens.codes
        return getattr(self.lm_head, "weight", None) is self.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, KVCache]:
        """input_ids: [B, T] -> logits [B, T, V], hidden (after the final norm) [B, T, hidden],
        and the cache extended by these T tokens."""
        b, t = input_ids.shape
        past_len = 0 if not cache else cache[0][0].shape[2]
        if positions is None:
            positions = torch.arange(past_len, past_len + t, device=input_ids.device).expand(b, t)
        # Dynamic NTK scaling depends on the longest position of this call, as in transformers.
        ropes = rope_tables(self.cfg, positions, seq_len=int(positions.max()) + 1)  # [B, T, D/2]
        # Keys: the cached tokens sat at positions 0..past_len-1, the new ones at `positions`.
        past = torch.arange(past_len, device=positions.device).expand(b, past_len)
        k_positions = torch.cat((past, positions), dim=1)
        masks = window_masks(positions, k_positions, self.cfg)  # [B, 1, T, past + T] each

        x = scale_embedding(self.cfg, self.embed_tokens(input_ids))  # [B, T, hidden]
        new_cache: KVCache = []
        for i, layer in enumerate(self.layers):
            past_i = None if not cache else cache[i]
            x, kv = layer(x, *ropes[layer.rope], masks[layer.window], past_i)
            new_cache.append(kv)
        hidden = self.norm(x)
        return self.lm_head(hidden), hidden, new_cache

    @torch.inference_mode()
    def generate_greedy(
        self, prompt: list[int], max_new_tokens: int, stop_at_eos: bool = True
    ) -> list[int]:
        """Reference greedy decoding with a contiguous KV cache: the oracle for the runtime."""
        device = self.norm.weight.device
        logits, _, cache = self(torch.tensor([prompt], device=device))
        out: list[int] = []
        for _ in range(max_new_tokens):
            token = int(logits[0, -1].argmax())
            out.append(token)
            if stop_at_eos and token in self.cfg.eos_token_ids:
                break
            logits, _, cache = self(torch.tensor([[token]], device=device), cache=cache)
        return out
