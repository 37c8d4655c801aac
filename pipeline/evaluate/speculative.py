"""Speculative decoding measured as it serves: the mean accepted length of the recipe's
`speculative` section, through the runtime's own Generator, on held-out prompts.

The prompts are the first `prompt_tokens` tokens of consecutive windows of `prompt_tokens` +
`max_tokens` tokens of the evaluation text (read and tokenized like the perplexity's, before
any build work). Each prompt is generated alone (batch 1, the case speculation is for) with
greedy decoding and EOS ignored, `max_tokens` tokens, on the first target's engine, opened
by the runtime's own loader (runtime/loader.py `open_engine`, here on the stage outputs since
nothing is packaged yet) with its drafter: prompt lookup, the draft model's engine of the same
name on a pool of as many blocks as the target's, the Medusa heads graph on the target's hidden
state, or the EAGLE-3 draft's graphs (on a pool like the draft model's) on the target's aux
states; then driven by the runtime's `Generator`. The back-off is off
(`min_acceptance_rate` 0, no batch-size cut-off), so every step drafts and the counters measure
the drafter, not the policy.

The same prompts then run through a second Generator without speculation: `greedy_match`
counts the prompts whose tokens are the same. It is reported, not judged: on an engine with
int8 activations a verification call rounds differently from a one-token call, so a near-tie
can flip (docs/design.md, section 6).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ingot.runtime.generate import Generator, GeneratorConfig
from ingot.runtime.loader import DrafterFiles, EngineFiles, open_engine
from ingot.runtime.sampling import SamplingParams
from ingot.runtime.speculative import SpecDecodeStats, Speculation, SpeculativeConfig
from ingot.runtime.speculative.load import make_drafter
from ingot.runtime.tokenizer import TextTokenizer

from ..recipe import (
    DraftModelSpeculative,
    EagleSpeculative,
    MedusaSpeculative,
    NgramSpeculative,
    Recipe,
    SpeculativeEval,
)
from .errors import EvalDataError
from .perplexity import token_windows, tokenize
from .report import EvalGateError
from .text import load_eval_text

__all__ = [
    "SpeculativePrompts",
    "check_speculative_gate",
    "measure_speculation",
    "speculative_prompts",
    "speculative_summary",
]

_WHERE = "evaluate.speculative"
_DIGITS = 6  # reported precision; the gate judges the reported number


@dataclass(frozen=True, slots=True)
class SpeculativePrompts:
    """What the evaluate stage measures speculation with, prepared before any build work."""

    spec: SpeculativeEval  # the recipe's evaluate.speculative
    # the recipe's section
    method: NgramSpeculative | DraftModelSpeculative | MedusaSpeculative | EagleSpeculative
    dataset: str  # the text source, evaluate.perplexity's when the section names none
    split: str
    text_field: str
    prompts: np.ndarray  # [prompts, prompt_tokens] int64
    digest: str  # sha256 of the text: the stage's input

    def key_slice(self) -> dict[str, Any]:
        """The evaluate stage key's part: what is measured and how (the gate is not in it:
        changing min_accepted_length re-judges, it does not re-measure)."""
        measured = self.spec.model_dump(mode="json", exclude={"min_accepted_length"})
        text = {"dataset": self.dataset, "split": self.split, "text_field": self.text_field}
        # The draft's own section is its engine, whose digest is an input of the stage.
        method = self.method.model_dump(mode="json", exclude={"draft"})
        return {**measured, **text, "method": method}


def speculative_prompts(
    recipe: Recipe, recipe_path: Path, source_path: Path
) -> SpeculativePrompts | None:
    """None when the recipe measures no speculation; EvalDataError when the text is
    unreadable or too short for the prompts."""
    spec = recipe.evaluate.speculative if recipe.evaluate is not None else None
    if spec is None:
        return None
    # The recipe refuses evaluate.speculative without a speculative section or any dataset.
    if spec.dataset is not None:
        dataset, split, text_field = spec.dataset, spec.split, spec.text_field
    else:
        ppl = recipe.evaluate.perplexity
        dataset, split, text_field = ppl.dataset, ppl.split, ppl.text_field
    text = load_eval_text(
        dataset,
        text_field=text_field,
        split=split,
        base_dir=Path(recipe_path).absolute().parent,
        where=_WHERE,
    )
    ids = tokenize(text.text, Path(source_path) / "tokenizer.json")
    window = spec.prompt_tokens + spec.max_tokens
    if len(ids) < spec.prompts * window:
        raise EvalDataError(
            f"{_WHERE}.dataset: {dataset!r} has {len(ids)} tokens, fewer than prompts x "
            f"(prompt_tokens + max_tokens) = {spec.prompts} x {window} = "
            f"{spec.prompts * window}; use more text, fewer prompts or shorter ones"
        )
    windows = token_windows(ids, window, spec.prompts).numpy()
    prompts = np.ascontiguousarray(windows[:, : spec.prompt_tokens])
    return SpeculativePrompts(
        spec, recipe.speculative, dataset, split, text_field, prompts, text.sha256
    )


class _CountingRunner:
    """The engine session, counting the target's calls (prefill and decode)."""

    def __init__(self, session) -> None:
        self.session = session
        self.calls = 0

    def run(self, batch):
        self.calls += 1
        return self.session.run(batch)

    @property
    def hidden(self):
        """The last call's hidden rows (a session opened with hidden=True: medusa)."""
        return self.session.hidden

    @property
    def scratch_block(self) -> int | None:
        """The session's (set when its graph writes the pool): what its batches are built for."""
        return self.session.scratch_block

    @property
    def aux_hidden(self):
        """The last call's aux states (a session opened with aux=True: eagle)."""
        return self.session.aux_hidden


def measure_speculation(
    job: SpeculativePrompts,
    engine: EngineFiles,
    drafter: DrafterFiles,
    tokenizer_file: Path,
    *,
    max_seq_len: int,
    sliding_window: int | None,
    vocab_size: int,
    eos_token_ids: tuple[int, ...] = (),
) -> dict[str, Any]:
    """The report's `speculative` block: the drafter's counters over the prompts, the target's
    calls with and without speculation, and how many prompts decode as plain greedy does.

    `engine` is the first target's engine stage output; `drafter` what the method drafts with
    (the draft's engine of the same name, the heads graph, the eagle stage's graphs; nothing
    for ngram); `max_seq_len` is the exported graph's."""
    spec, method = job.spec, job.method
    # One request at a time, prefix caching off: a full-length sequence's blocks suffice.
    num_blocks = -(-max_seq_len // engine.kv_layout().block_size)
    opened = open_engine(engine, num_blocks, drafter)
    target = _CountingRunner(opened.session)
    config = SpeculativeConfig(
        method.method,
        method.num_speculative_tokens,
        getattr(method, "prompt_lookup_min", 1),
        getattr(method, "prompt_lookup_max", 4),
        disable_by_batch_size=spec.prompts,  # never cut off (one prompt at a time anyway)
        min_acceptance_rate=0.0,  # never backs off: every step drafts
        adaptive=False,  # nor stops where drafting timed slower: counts, not this machine's clock
    )
    draft = make_drafter(config, opened.draft, sliding_window, opened.heads, opened.eagle)
    speculation = Speculation(config, draft)
    tokenizer = TextTokenizer(tokenizer_file)
    generator_config = GeneratorConfig(
        max_seq_len=max_seq_len,
        eos_token_ids=tuple(eos_token_ids),
        sliding_window=sliding_window,
        max_num_seqs=1,
        enable_prefix_caching=False,  # disjoint prompts; and each measured from scratch
        vocab_size=vocab_size,
    )
    params = SamplingParams(max_tokens=spec.max_tokens, temperature=0.0, ignore_eos=True)
    prompts = job.prompts.tolist()
    speculative = Generator(target, opened.pool, tokenizer, generator_config, speculation)
    drafted = [speculative.generate([p], params)[0].token_ids for p in prompts]
    speculative_calls = target.calls
    plain = Generator(target, opened.pool, tokenizer, generator_config)  # same session, pool
    greedy = [plain.generate([p], params)[0].token_ids for p in prompts]
    calls = (speculative_calls, target.calls - speculative_calls)
    return _report(job, config, engine, speculation.stats, (drafted, greedy), calls)


def _report(
    job: SpeculativePrompts,
    config: SpeculativeConfig,
    engine: EngineFiles,
    stats: SpecDecodeStats,
    outputs: tuple[list[list[int]], list[list[int]]],
    calls: tuple[int, int],
) -> dict[str, Any]:
    """The `speculative` block from the drafter's `stats`, the tokens with and without
    speculation (`outputs`) and the target's calls with and without (`calls`)."""
    spec, (drafted, greedy) = job.spec, outputs
    drafts = stats.num_drafts
    counts = stats.accepted_per_position
    per_position = counts + [0] * (config.num_speculative_tokens - len(counts))
    rates = [round(n / drafts, _DIGITS) if drafts else 0.0 for n in per_position]
    accept_rate = stats.num_accepted_tokens / stats.num_draft_tokens if drafts else 0.0
    lookup = {}
    if config.method == "ngram":
        lookup = {"prompt_lookup_min": config.prompt_lookup_min}
        lookup["prompt_lookup_max"] = config.prompt_lookup_max
    return {
        "method": config.method,
        "num_speculative_tokens": config.num_speculative_tokens,
        **lookup,
        "engine_name": engine.engine.name,
        # The report's field since ONNX Runtime was the only engine (None for an engine
        # without MatMulNBits levels); report.md describes the engine through its plug-in.
        "engine_matmul_accuracy_level": engine.engine.build.get("matmul_accuracy_level"),
        "dataset": job.dataset,
        "dataset_sha256": job.digest,
        "prompts": len(drafted),
        "prompt_tokens": spec.prompt_tokens,
        "max_tokens": spec.max_tokens,
        "batching": "one prompt at a time",
        "tokens": sum(map(len, drafted)),
        "drafts": drafts,
        "draft_tokens": stats.num_draft_tokens,
        "accepted_tokens": stats.num_accepted_tokens,
        "mean_accepted_length": round(stats.mean_accepted_length, _DIGITS),
        "acceptance_rate": round(accept_rate, _DIGITS),
        "accepted_per_position": rates,
        "target_calls": calls[0],
        "plain_target_calls": calls[1],
        "greedy_match": sum(a == b for a, b in zip(drafted, greedy, strict=True)),
    }


def speculative_summary(report: dict[str, Any], min_accepted_length: float | None) -> dict:
    """The manifest's `eval.speculative`: the headline numbers and the gate they passed."""
    spec = report["speculative"]
    keys = (
        "method",
        "num_speculative_tokens",
        "engine_name",
        "dataset",
        "prompts",
        "max_tokens",
        "mean_accepted_length",
        "acceptance_rate",
        "greedy_match",
    )
    return {**{k: spec[k] for k in keys}, "min_accepted_length": min_accepted_length}


def check_speculative_gate(report: dict[str, Any], min_accepted_length: float | None) -> None:
    """`min_accepted_length` bounds the mean accepted length from below."""
    if min_accepted_length is None:
        return
    spec = report["speculative"]
    if spec["mean_accepted_length"] < min_accepted_length:
        raise EvalGateError(
            f"{_WHERE}.min_accepted_length: the mean accepted length "
            f"{spec['mean_accepted_length']:.4f} ({spec['method']}, k = "
            f"{spec['num_speculative_tokens']}, engine {spec['engine_name']}, "
            f"{spec['prompts']} prompts of {spec['dataset']}; acceptance rate "
            f"{spec['acceptance_rate']:.4f}) is below the threshold {min_accepted_length:g}; "
            "the artifact was not packaged (the previous one and the cached stages are kept)"
        )
