"""The speculative report's sections beside its tables: where a decode step's time goes, each
drafter trained in its own build, and the notes."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks.speculative.figures import (
    fmt,
    get_path,
    gib,
    one_token_call_ms,
    ordered_rows,
    pct,
    seconds_text,
    speedup_of,
)
from benchmarks.speculative.methods import NGRAM_LOOKUP, OWN_BUILD

__all__ = ["breakdown_section", "drafter_section", "notes"]

NEAR_TIE = 0.1  # top-2 log-probability gap below which rounding may flip greedy's choice


def breakdown_section(ingot: dict[str, Any]) -> list[str]:
    rows = get_path(ingot, "batch1", "code") or {}
    if not any("step_breakdown" in row for row in rows.values()):
        return []
    lines = [
        "",
        "## Where a decode step's time goes (batch 1, code prompts)",
        "",
        "One more run of the code prompts with the engine calls timed (ms per decode step). "
        "target call: the target engine's session call (by tokens per sequence: 1 = plain "
        "decoding, k + 1 = verification); drafter: proposing drafts, its engine's calls "
        "included (in brackets: ms in the draft engine, the Medusa heads' graph, or the EAGLE "
        "draft layer and its fc, and their calls per step: EAGLE calls fc once and the layer "
        "k times per drafting step); rest: the runtime around them "
        "(scheduling, inputs, sampling, K/V writes, acceptance).",
        "",
        "| method | ms / step | target call | target call by tokens / sequence | drafter "
        "(draft engine, calls) | rest of the runtime | tokens / step |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for method, row in ordered_rows(rows):
        b = row.get("step_breakdown")
        if not b:
            continue
        by_q = ", ".join(
            f"{q}: {v['ms']:.2f}" for q, v in b["target_call_ms_by_tokens_per_sequence"].items()
        )
        drafter = (
            f"{b['drafter_ms']:.2f} ({b['draft_engine_ms']:.2f}, "
            f"{b['draft_engine_calls_per_step']:.1f})"
            if method != "plain"
            else "–"
        )
        lines.append(
            f"| {method} | {b['ms_per_step']:.2f} | {b['target_call_ms']:.2f} | {by_q} "
            f"| {drafter} | {b['runtime_other_ms']:.2f} | {row['tokens_per_step']:.2f} |"
        )
    return lines


def drafter_section(method: str, build: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """An OWN_BUILD method's build: what its drafter's stage cost, and the training report of
    its manifest."""
    built = build.get(method)
    if built is None:  # not attempted: the target's own build failed
        return []
    own = OWN_BUILD[method]
    lines = ["", f"## {own.title} (trained in the build)", ""]
    drafter = built.get("drafter") or {}
    if not built.get("ok") or "error" in drafter:
        error = built.get("error") or drafter.get("error")
        return [*lines, f"The {own.title} build failed: {error}. The {method} rows report it."]
    train, cal = settings[method]["train"], settings[method]["calibration"]
    t, stage = drafter.get("training") or {}, drafter.get("stage") or {}
    windows = t.get("windows") or {}
    peak = "–" if stage.get("cached") else gib(stage.get("peak_rss_bytes"))
    text = _DRAFTER_TEXT[method](drafter, train)
    lines += [
        f"{text.what}, on {windows.get('train')} of {cal['samples']} windows of "
        f"{cal['seq_len']} tokens of {Path(settings['calib_text']).name}, the other "
        f"{windows.get('held_out')} held out. This build's stages: "
        f"{_stage_runs(built.get('stages') or [])}.",
        "",
        f"{own.stage} stage: its wall time ({text.stage_work}) and the build process's peak RSS "
        f"during it; a stage-cache hit ({own.title} trained by an earlier run) shows `cached` "
        f"and no peak. training: {text.timed}, from the manifest's training report (so also "
        f"after a hit). {text.legend}",
        "",
        f"| {own.stage} stage | peak RSS | training | steps | loss first → last | {text.column} |",
        "|---:|---:|---:|---:|---|---|",
        f"| {_stage_time(stage)} | {peak} | {seconds_text(t.get('seconds'))} "
        f"| {t.get('steps', '–')} "
        f"| {fmt(t.get('loss_first'))} → {fmt(t.get('loss_last'))} "
        f"| {' / '.join(f'{a:.2f}' for a in t.get(text.key) or []) or '–'} |",
    ]
    return lines


class DrafterText(NamedTuple):
    """An OWN_BUILD drafter's own words in its section of the report."""

    what: str  # what the drafter is and how it learns
    stage_work: str  # what its stage's wall time covers
    timed: str  # what the training report's seconds cover
    legend: str  # the loss and the held-out figure
    column: str  # the held-out figure's header
    key: str  # and its field of the training report


def _medusa_text(heads: dict[str, Any], train: dict[str, Any]) -> DrafterText:
    return DrafterText(
        what=f"{heads['num_heads']} heads of {heads['num_layers']} residual block(s) "
        f"({heads['origin']}), trained by the build's `heads` stage by self-distillation: from "
        "the quantized target's final hidden state at a position, head i learns the target's "
        "own next-token distribution i positions after the target's next token there (draft "
        f"token i); {train['steps']} AdamW steps of {train['batch_size']} positions at "
        f"learning rate {train['learning_rate']}",
        stage_work="the target's hidden states, the training, the graph's export",
        timed="the optimizer steps alone",
        legend="loss: KL(target || head) averaged over the heads, mean of the first and of the "
        "last 10 steps. held-out agreement: per head, the share of held-out positions where "
        "its token is the target's greedy token, the tokens before it being the calibration "
        "text's; the batch-1 table's acceptance by position follows the target's own tokens "
        "and needs every earlier draft accepted too.",
        column="held-out agreement by head",
        key="held_out_agreement",
    )


def _eagle_text(eagle: dict[str, Any], train: dict[str, Any]) -> DrafterText:
    ttt = train["ttt_steps"]
    mal = (eagle.get("training") or {}).get("mean_accepted_length")
    return DrafterText(
        what=f"One draft decoder layer ({eagle['origin']}; the target's attention and MLP "
        f"shapes, hidden size {eagle['hidden_size']}), trained by the build's `eagle` stage by "
        "self-distillation: from the quantized target's residual streams entering layers "
        f"{', '.join(map(str, eagle['aux_layers']))} (concatenated, through fc) and the next "
        "token's embedding it learns the target's own distribution of the token after that, "
        f"and again from its own output for {ttt - 1} more positions (EAGLE-3's training-time "
        f"test: {ttt} drafting steps unrolled); {train['steps']} AdamW steps of "
        f"{train['batch_size']} spans of {train['span']} tokens at learning rate "
        f"{train['learning_rate']}",
        stage_work="the target's features, the training, the two graphs' export and check; "
        "the build's target graph outputs those features too, so its export and engine stages "
        "are not the other builds'",
        timed="the optimizer steps and the held-out acceptance's evaluation",
        legend="loss: KL(target || draft) summed over the drafting steps, step j's weighted "
        "0.8^j, mean of the first and of the last 10 steps. held-out acceptance: per draft "
        "position i, the share of chains on the held-out windows whose drafts 1 .. i all equal "
        "the target's greedy tokens, drafted as the runtime drafts (the first from the "
        "target's features, each next from the draft's own output); the tokens a chain "
        "continues from are the calibration text's, where the batch-1 table's are the "
        f"target's own. Mean accepted length by these: {fmt(mal)}.",
        column="held-out acceptance by position",
        key="held_out_acceptance",
    )


_DRAFTER_TEXT = {"medusa": _medusa_text, "eagle": _eagle_text}


def _stage_runs(stages: list[dict[str, Any]]) -> str:
    return ", ".join(f"{s['stage']} {_stage_time(s)}" for s in stages) or "–"


def _stage_time(stage: dict[str, Any]) -> str:
    if not stage:
        return "–"
    return "cached" if stage["cached"] else seconds_text(stage["seconds"])


def notes(report: dict[str, Any]) -> list[str]:
    """What the tables do not say by themselves: the step cost behind each speedup, and why
    an output can differ from plain decoding's."""
    ingot = report["results"].get("ingot") or {}
    return [*_cost_notes(get_path(ingot, "batch1", "code") or {}), *_difference_notes(ingot)]


def _cost_notes(code: dict[str, Any]) -> list[str]:
    """Per method (code prompts, batch 1): tokens per step against the step's cost; the draft
    model's one-token call; what verification costs; what a plain step is made of."""
    plain = code.get("plain")
    if not plain:
        return []
    notes = []
    for method, row in ordered_rows(code):
        if method == "plain":
            continue
        cost = row["ms_per_step"] / plain["ms_per_step"]
        notes.append(
            f"- {method}, code prompts: {row['tokens_per_step']:.2f} tokens per target "
            f"step at {cost:.2f}x plain's step time ({row['ms_per_step']:.2f} against "
            f"{plain['ms_per_step']:.2f} ms) gives {row['tokens_per_step'] / cost:.2f}x; "
            f"the measured speedup is {fmt(speedup_of(code, method))}x."
        )
    plain_call = one_token_call_ms(plain)
    for method, row in ordered_rows(code):
        call = one_token_call_ms(row)
        if "draft_model" in method and call and plain_call and call > 1.2 * plain_call:
            notes.append(
                f"- {method}: the target's one-token call costs {call:.2f} ms against "
                f"plain's {plain_call:.2f} ms. The draft engine's session has its own ONNX "
                "Runtime intra-op thread pool beside the target's, each of the recipe's "
                "threads, so on this host 4 threads share 2 cores (measured apart from "
                "this run: with the draft session on 1 thread the target's one-token call "
                "is back near plain's, and the verification calls are faster too)."
            )
    calls = (get_path(code, "ngram k=4 adaptive off", "step_breakdown") or {}).get(
        "target_call_ms_by_tokens_per_sequence"
    ) or {}
    k1 = str(max((int(q) for q in calls), default=0))
    if "1" in calls and k1 != "1":
        row = code["ngram k=4 adaptive off"]
        mal = (row.get("speculation") or {}).get("mean_accepted_length")
        notes.append(
            f"- Verification is not free at this size: the target's call over {k1} tokens "
            f"costs {calls[k1]['ms']:.2f} ms against {calls['1']['ms']:.2f} ms over one "
            f"({calls[k1]['ms'] / calls['1']['ms']:.1f}x; ngram k=4 adaptive off), so a "
            "verification must keep about that many tokens to pay for itself; it keeps "
            f"{fmt(mal)} (mean accepted length), and "
            f"{pct(row.get('drafting_steps_share'))} of the steps find an n-gram to draft "
            "from."
        )
    notes.append(
        f"- A plain step costs {plain['ms_per_step']:.2f} ms at batch 1, most of it fixed "
        "per call (the runtime around the engine and the engine's session call itself: "
        "benchmarks/results/decode.md), not weight reads. A step that verifies k + 1 "
        "tokens pays that fixed part once, so the gain is bounded by tokens per step; a "
        "draft model and an EAGLE draft add their own k calls per step, each with the same "
        "kind of fixed cost."
    )
    return notes


def _difference_notes(ingot: dict[str, Any]) -> list[str]:
    """How many batch-1 outputs differ from plain decoding's, whether they part at near-ties,
    and why they can."""
    notes = []
    gaps, second, total = [], 0, 0
    for rows in (ingot.get("batch1") or {}).values():
        for row in rows.values():
            for d in (row.get("matches_plain") or {}).get("differences", []):
                total += 1
                if d.get("plain_top2_logprob_gap") is not None:
                    gaps.append(d["plain_top2_logprob_gap"])
                    second += bool(d["token_is_plains_second"])
    if total:
        notes.append(
            f"- Batch-1 outputs that differ from plain decoding's: {total} (over the methods and "
            f"prompt sets). Where they part, the speculative token is plain decoding's second "
            f"choice in {second}, and plain's top two log-probabilities are "
            f"{statistics.median(gaps):.3f} apart at the median ({max(gaps):.3f} at most)"
            + (": near-ties." if max(gaps) < NEAR_TIE else ".")
            if gaps
            else f"- Batch-1 outputs that differ from plain decoding's: {total}."
        )
    notes += [
        "- = plain: greedy speculative decoding is exact in exact arithmetic, but the engine "
        "rounds activations to int8 at run time (ONNX Runtime's MatMulNBits accuracy level 4, "
        "OpenVINO's dynamic quantization) and a call over "
        "k + 1 tokens per sequence (verification) or over many sequences does not run the "
        "arithmetic of a call over one token (other kernel paths, another summation order): a "
        "near-tie between the two best tokens can flip, and every later token then follows the "
        "other branch. A prompt that differs is counted, not failed (first_difference_at in "
        "the JSON says where); the plain row of the concurrent table is the control: "
        "batching alone, no speculation.",
        "- transformers runs the float checkpoint (fp32) in torch, ingot the int4 artifact: "
        "compare speedups (each over its own plain decoding) and absolute tok/s separately. "
        "transformers' prompt lookup matches n-grams of up to 2 tokens, ingot's up to "
        f"{NGRAM_LOOKUP['prompt_lookup_max']}.",
    ]
    return notes
