"""pipeline/evaluate: quality of the quantized model against the original (perplexity), and
of the recipe's speculative decoding (mean accepted length)."""

from .errors import EvalDataError
from .perplexity import perplexity, token_windows
from .report import EvalGateError, check_perplexity_gate, perplexity_summary
from .speculative import (
    SpeculativePrompts,
    check_speculative_gate,
    speculative_prompts,
    speculative_summary,
)
from .text import EvalText, load_eval_text

__all__ = [
    "EvalDataError",
    "EvalGateError",
    "EvalText",
    "SpeculativePrompts",
    "check_perplexity_gate",
    "check_speculative_gate",
    "load_eval_text",
    "perplexity",
    "perplexity_summary",
    "speculative_prompts",
    "speculative_summary",
    "token_windows",
]
