"""Tensor names: Hugging Face's (what checkpoints hold) and the IR's, one table both ways."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["hf_name", "ir_name"]

# (HF prefix, IR prefix); {i} stands for a layer number. Layer-local renames keep the IR's
# names short and readable; the interop writers map them back to HF's.
_PREFIXES = (
    ("model.embed_tokens.", "embed_tokens."),
    ("model.norm.", "norm."),
    ("model.layers.{i}.input_layernorm.", "layers.{i}.attn_norm."),
    ("model.layers.{i}.post_attention_layernorm.", "layers.{i}.mlp_norm."),
    ("model.layers.{i}.self_attn.", "layers.{i}.attn."),
    ("model.layers.{i}.mlp.", "layers.{i}.mlp."),
)


def _rules(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[re.Pattern[str], str], ...]:
    """(pattern, replacement) per (from, to) prefix pair; {i} matches and keeps the number."""
    return tuple(
        (
            re.compile("^" + re.escape(old).replace(re.escape("{i}"), r"(\d+)")),
            new.replace("{i}", r"\1"),
        )
        for old, new in pairs
    )


_TO_IR = _rules(_PREFIXES)
_TO_HF = _rules((ir, hf) for hf, ir in _PREFIXES)


def _rename(name: str, rules: tuple[tuple[re.Pattern[str], str], ...]) -> str:
    for pattern, replacement in rules:
        renamed, n = pattern.subn(replacement, name)
        if n:
            return renamed
    return name


def ir_name(hf_name: str) -> str:
    """`model.layers.0.self_attn.q_proj` -> `layers.0.attn.q_proj` (lm_head is unchanged)."""
    return _rename(hf_name, _TO_IR)


def hf_name(ir_name: str) -> str:
    """`layers.0.attn.q_proj` -> `model.layers.0.self_attn.q_proj` (lm_head is unchanged)."""
    return _rename(ir_name, _TO_HF)
