"""What a serving process holds resident beside its KV pool, per engine kind: a model fitted to
measurements, which each engine's runtime plug-in states (`EngineRuntime.resident_memory`) and
the serving plan (runtime/serving_plan.py) adds the pool to.

    resident = base + weights_factor x files + attention_buffers x T x C x H x 4 bytes

- base: the interpreter, numpy, the engine's library, the tokenizer and the HTTP server;
- files: the bytes of the files the engine reads (its graph and weights), of which it keeps
  `weights_factor` resident (1.0: one copy; more: a copy made at load besides the file's);
- T x C x H x 4: the fp32 attention scores of one scheduler step's tokens T
  (--max-num-batched-tokens, a prefill chunk) against the longest context C (the plan's
  --max-seq-len, by default the model's max_seq_len) over H heads. The engines materialize
  them, and what they derive from them, in buffers they keep for the next step: the one
  activation that outgrows the weights (at the 1B shape, 256 MiB each). A server that admits
  longer sequences than the plan's needs more: its context, not the plan's, sets C.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingot.artifacts import ModelInfo

__all__ = ["ResidentMemory", "ResidentModel", "ServingShape"]

_FP32 = 4


@dataclass(frozen=True, slots=True)
class ServingShape:
    """What a server's memory besides its KV pool depends on."""

    model: ModelInfo
    file_bytes: int  # the files the engine reads
    max_num_batched_tokens: int  # `ingot serve --max-num-batched-tokens`
    max_seq_len: int  # the longest sequence planned for

    @property
    def attention_scores_bytes(self) -> int:
        """One step's fp32 attention scores: T tokens x C context x H heads."""
        tokens, context = self.max_num_batched_tokens, self.max_seq_len
        return tokens * context * self.model.num_heads * _FP32


@dataclass(frozen=True, slots=True)
class ResidentMemory:
    """An engine's resident memory while serving, the KV pool apart."""

    weights: int  # what it keeps resident of its files
    overhead: int  # the rest: libraries, interpreter, server, activations
    model: str  # the formula with its numbers (the plan prints it)


@dataclass(frozen=True, slots=True)
class ResidentModel:
    """One engine kind's coefficients of the module docstring's formula, and where they were
    measured."""

    base_bytes: int
    weights_factor: float
    attention_buffers: float
    source: str

    def estimate(self, shape: ServingShape) -> ResidentMemory:
        weights = int(self.weights_factor * shape.file_bytes)
        activations = int(self.attention_buffers * shape.attention_scores_bytes)
        formula = (
            f"{self.base_bytes / 2**20:.0f} MiB + {self.weights_factor:g} x files + "
            f"{self.attention_buffers:g} x attention scores "
            f"({shape.attention_scores_bytes / 2**20:.0f} MiB); {self.source}"
        )
        return ResidentMemory(weights, self.base_bytes + activations, formula)
