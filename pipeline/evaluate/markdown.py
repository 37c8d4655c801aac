"""eval/report.md: a section per block of report.json (perplexity: report.py; speculative
decoding: speculative.py), each naming how the engine computes as its plug-in describes it."""

from __future__ import annotations

from typing import Any

__all__ = ["render_markdown"]


def render_markdown(report: dict[str, Any], engine_label: str) -> str:
    """report.md: a section per measurement the report holds (perplexity, speculative);
    `engine_label` says how the engine computes (its builder's `describe`)."""
    lines = ["# Evaluation", ""]
    if "perplexity" in report:
        lines += _perplexity_markdown(report["perplexity"], engine_label)
    if "speculative" in report:
        lines += _speculative_markdown(report["speculative"], engine_label)
    return "\n".join(lines)


def _perplexity_markdown(ppl: dict[str, Any], engine_label: str) -> list[str]:
    return [*_ppl_table(ppl, engine_label), *_heads_markdown(ppl.get("embedding_lm_head"))]


def _heads_markdown(heads: dict[str, Any] | None) -> list[str]:
    """What quantizing the embedding / lm_head costs (report.py's `embedding_lm_head`)."""
    if heads is None:
        return []
    names = " and ".join(f"`{m}`" for m in heads["quantized"])
    return [
        f"Quantized {names}: the IR with them float instead scores "
        f"{heads['ir_with_them_float']:.4f}, so they cost "
        f"{_delta(heads['cost'], heads['relative_cost'])} of the IR's delta.",
        "",
    ]


def _ppl_table(ppl: dict[str, Any], engine_label: str) -> list[str]:
    return [
        f"Perplexity on `{ppl['dataset']}` ({ppl['windows']} windows of {ppl['seq_len']} "
        f"tokens, {ppl['tokens_scored']} tokens scored; text {ppl['dataset_sha256']}).",
        "",
        "| model | perplexity | delta vs original | mean KL to original (nats/token) |",
        "|---|---:|---:|---:|",
        f"| original (float, PyTorch) | {ppl['original']:.4f} | | |",
        f"| quantized IR (PyTorch) | {ppl['quantized']:.4f} | "
        f"{_delta(ppl['delta'], ppl['relative_delta'])} | {ppl['kl']:.3g} |",
        f"| engine `{ppl['engine_name']}` ({engine_label}) | {ppl['engine']:.4f} | "
        f"{_delta(ppl['engine_delta'], ppl['engine_relative_delta'])} | "
        f"{ppl['engine_kl']:.3g} |",
        "",
        "KL: KL(original || model) of the next-token distributions, averaged over the "
        "scored tokens.",
        "",
        "The gate (`evaluate.perplexity.max_delta`) judges the engine's delta: the engine is "
        "what the artifact serves.",
        "",
    ]


def _delta(delta: float, relative: float) -> str:
    return f"{delta:+.4f} ({100 * relative:+.2f}%)"


def _speculative_markdown(spec: dict[str, Any], engine_label: str) -> list[str]:
    """report.md's section on speculative decoding (lines); `engine_label` says how the engine
    computes (its builder's `describe`)."""
    method = f"`{spec['method']}`, k = {spec['num_speculative_tokens']}"
    if spec["method"] == "ngram":
        method += f", prompt lookup {spec['prompt_lookup_min']}..{spec['prompt_lookup_max']}"
    k_rates = ", ".join(f"{r:.3f}" for r in spec["accepted_per_position"])
    return [
        "## Speculative decoding",
        "",
        f"{method}, on engine `{spec['engine_name']}` ({engine_label}): "
        f"{spec['prompts']} prompts of {spec['prompt_tokens']} tokens from "
        f"`{spec['dataset']}` (text {spec['dataset_sha256']}), {spec['max_tokens']} greedy "
        f"tokens each (EOS ignored), {spec['batching']}, no back-off.",
        "",
        "| measure | value |",
        "|---|---:|",
        f"| mean accepted length (tokens per verification) | {spec['mean_accepted_length']:.4f} |",
        f"| acceptance rate (accepted / drafted tokens) | {spec['acceptance_rate']:.4f} |",
        f"| verifications with drafts | {spec['drafts']} |",
        f"| drafted / accepted tokens | {spec['draft_tokens']} / {spec['accepted_tokens']} |",
        f"| accepted at draft position 1..k (per verification) | {k_rates} |",
        f"| target calls, speculative / plain | {spec['target_calls']} / "
        f"{spec['plain_target_calls']} |",
        f"| prompts whose tokens equal plain greedy decoding | {spec['greedy_match']} / "
        f"{spec['prompts']} |",
        "",
        "The gate (`evaluate.speculative.min_accepted_length`) judges the mean accepted length.",
        "",
    ]
