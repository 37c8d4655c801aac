"""speculative.json and speculative.md: the batch-1 and concurrent tables, transformers' side by
side, the drafters' builds, the targets and the notes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.harness.report import publish
from benchmarks.speculative.figures import (
    SETS,
    fmt,
    get_path,
    ordered_rows,
    pct,
    quiet_line,
    ratio_of,
    share,
    speedup_of,
    spread,
)
from benchmarks.speculative.methods import OWN_BUILD, PEER_CASES
from benchmarks.speculative.sections import breakdown_section, drafter_section, notes

__all__ = ["STEM", "markdown", "publish_report", "report_stem", "target_verdicts"]

STEM = "speculative"  # benchmarks/results/speculative.json and speculative.md


def report_stem(engine: str) -> str:
    """The report's file stem: speculative for ONNX Runtime (the default engine), else
    speculative_<engine> beside it."""
    return STEM if engine == "onnxruntime" else f"{STEM}_{engine}"


def publish_report(report: dict[str, Any], out_dir: Path, stem: str = STEM) -> int:
    """The report without the batch-1 tokens, with its target verdicts, written and printed;
    the exit status."""
    for rows in (get_path(report["results"], "ingot", "batch1") or {}).values():
        for row in rows.values():  # compared already (matches_plain): 100k numbers left out
            row.pop("tokens", None)
    report["targets"] = target_verdicts(report["results"])
    return publish(report, out_dir, stem, markdown)


# The targets at batch 1 on code prompts, and under load.
SPEEDUP_TARGETS = {"ngram k=4": 1.3, "draft_model k=4": 1.5, "medusa k=4": 1.6, "eagle k=3": 2.0}
# transformers' counterpart of a method; it has no Medusa or EAGLE decoding, so those have none.
PEER_OF = {"ngram k=4": "prompt_lookup_num_tokens=4", "draft_model k=4": "assistant_model k=4"}
MAX_SLOWDOWN_AT_32 = 0.05


def target_verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    verdicts = []
    code = get_path(results, "ingot", "batch1", "code") or {}
    peer = get_path(results, "transformers", "results", "code") or {}
    for method, goal in SPEEDUP_TARGETS.items():
        speedup = speedup_of(code, method)
        verdicts.append(
            {
                "statement": f"{method}: batch-1 speedup >= {goal}x on code prompts",
                "value": speedup,
                "met": None if speedup is None else speedup >= goal,
            }
        )
        if method not in PEER_OF:
            continue
        theirs = speedup_of(peer, PEER_OF[method])
        verdicts.append(
            {
                "statement": f"{method}: speedup >= transformers' {PEER_OF[method]}",
                "value": [speedup, theirs],
                "met": None if speedup is None or theirs is None else speedup >= theirs,
            }
        )
    for method, row in ordered_rows(get_path(results, "ingot", "concurrent", "32") or {}):
        ratio = ratio_of(row, (get_path(results, "ingot", "concurrent", "32") or {}).get("plain"))
        if method == "plain" or method.endswith("forced") or ratio is None:
            continue
        verdicts.append(
            {
                "statement": f"{method}: 32 concurrent requests no more than "
                f"{MAX_SLOWDOWN_AT_32:.0%} slower than speculation off",
                "value": ratio,
                "met": ratio >= 1 - MAX_SLOWDOWN_AT_32,
            }
        )
    return verdicts


def markdown(report: dict[str, Any]) -> str:
    settings, results = report["settings"], report["results"]
    ingot = results.get("ingot", {})
    lines = _header(report)
    if not ingot.get("ok"):
        lines += ["", f"ingot failed: {ingot.get('error')}"]
    lines += _batch1_section(ingot)
    lines += breakdown_section(ingot)
    for method in OWN_BUILD:
        lines += drafter_section(method, results.get("build") or {}, settings)
    lines += _concurrent_section(ingot, settings)
    lines += _peer_section(results, settings)
    lines += _targets_section(report)
    lines += ["", "## Notes", ""]
    lines += notes(report)
    return "\n".join(lines) + "\n"


def _header(report: dict[str, Any]) -> list[str]:
    settings, machine, results = report["settings"], report["machine"], report["results"]
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items() if v)
    lines = [
        "# Speculative decoding: ingot (n-gram, draft model, Medusa, EAGLE-3) and transformers' "
        "assisted generation",
        "",
        f"{machine['date']} on {machine['cpu_model']}, {machine['usable_cores']} cores, "
        f"{machine['ram_bytes'] / (1 << 30):.1f} GiB RAM; {versions}; ingot at "
        f"{machine['code']['commit'][:12]}"
        + (" with uncommitted changes" if machine["code"]["dirty"] else "")
        + ".",
        f"Target {settings['target']} ({settings['weights']}; {settings['engine']}), draft "
        f"{settings['draft']} built into the same artifact; the Medusa rows and the EAGLE rows "
        "each load another artifact of the same target with their drafter trained in its "
        "build (an artifact holds one drafter). EAGLE drafts k = 3 tokens a step where the "
        "draft model and Medusa draft 4: each of its tokens is one more draft-layer call after "
        "the previous one, and its training unrolls "
        f"{settings['eagle']['train']['ttt_steps']} drafting steps. Prompts: "
        f"{settings['prompt_tokens']}"
        f' tokens of the held-out pydoc-eval.txt ("code": the windows richest in Python code '
        'lines; "text": windows with none), '
        f"{settings['new_tokens']} new tokens each, greedy, EOS ignored, "
        f"{settings['threads']} threads; {settings['runs']} runs, every method's runs "
        "interleaved with plain decoding's in one process: tok/s is the median run, a speedup "
        "or on / off ratio the median of each run's ratio to plain's run of the same round "
        "(the range over runs in brackets).",
        quiet_line(results),
    ]
    return lines


def _batch1_section(ingot: dict[str, Any]) -> list[str]:
    lines = ["", "## Batch 1 (one request at a time)", ""]
    lines += [
        "tok/s counts decode steps only (the first token comes from the prefill). The "
        "runtime's default is adaptive drafting: it times decode steps with and without drafts "
        "per batch-size bucket and drafts only where drafting has emitted more tokens per "
        'second; "adaptive off" drafts at every step it can. drafting: share of decode steps '
        "that verified drafts; tokens/step: tokens per target step; mean accepted length = 1 + "
        "accepted drafts per verification (steps that drafted); acceptance by position: share "
        "of verifications whose i-th draft token was accepted; = plain: prompts whose tokens "
        "equal plain decoding's.",
        "",
        "| method | prompts | tok/s | speedup | drafting | tokens / step | ms / step | mean "
        "accepted length | acceptance by position | = plain |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for set_name, rows in ordered_rows(ingot.get("batch1") or {}, SETS):
        for method, row in ordered_rows(rows):
            spec = row.get("speculation") or {}
            by_pos = " / ".join(f"{a:.2f}" for a in spec.get("acceptance_by_position", []))
            mal = spec.get("mean_accepted_length")
            match = row.get("matches_plain")
            lines.append(
                f"| {method} | {set_name} ({row['prompts']}) | {row['decode_tokens_per_s']:.0f} "
                f"| {fmt(speedup_of(rows, method))}{spread(row.get('speedup_runs'))} "
                f"| {pct(row.get('drafting_steps_share'))} "
                f"| {row['tokens_per_step']:.2f} "
                f"| {row['ms_per_step']:.2f} | {fmt(mal)} | {by_pos or '–'} "
                f"| {share(match) if method != 'plain' else '–'} |"
            )
    for name, error in (ingot.get("errors") or {}).items():
        lines.append(f"| {name} | – | failed: {error} | | | | | | | |")
    return lines


def _concurrent_section(ingot: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    lines = ["", "## Concurrent requests (all submitted at once to one Generator)", ""]
    conc = dict(sorted((ingot.get("concurrent") or {}).items(), key=lambda kv: int(kv[0])))
    lines += [
        "Generated tokens over the wall time (prefill included), code prompts. on / off: "
        "against plain decoding in the same run. With the default thresholds a step with more "
        'than `disable_by_batch_size` (8) decoding requests does not draft; "forced": '
        f"{settings['forced']} (every step of every request drafts). = plain: outputs equal "
        "to plain decoding's at the same concurrency; on the plain row, the control: plain outputs "
        'equal to the same prompts\' decoded one at a time ("alone").',
        "",
        "| method | " + " | ".join(f"{n} req tok/s | on / off" for n in conc) + " | = plain |",
        "|---|" + "---:|---:|" * len(conc) + "---:|",
    ]
    names: list[str] = []
    for rows in conc.values():
        names += [m for m, _ in ordered_rows(rows) if m not in names]
    for method in names:
        cells, match_cells = [], []
        for rows in conc.values():
            row = rows.get(method)
            if row is None:
                cells += ["–", "–"]
                continue
            ratio = fmt(ratio_of(row, rows.get("plain"))) + spread(row.get("ratio_to_plain_runs"))
            cells += [f"{row['tokens_per_s']:.0f}", ratio]
            match = row.get("matches_batch1_plain" if method == "plain" else "matches_plain")
            if match:
                match_cells.append(share(match) + (" alone" if method == "plain" else ""))
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {', '.join(match_cells) or '–'} |")
    return lines


def _peer_section(results: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """transformers' rows beside the speedup of the ingot method with the same kind of
    drafter."""
    ingot = results.get("ingot", {})
    peer = results.get("transformers", {})
    lines = ["", "## transformers' assisted generation (side by side, same prompts)", ""]
    if not peer.get("ok"):
        return [*lines, f"transformers failed: {peer.get('error')}"]
    defaults = peer["assistant_defaults"]
    lines += [
        f"{settings['target']} in fp32 (torch CPU, {settings['threads']} threads), greedy "
        f"`generate`, first {settings['peer_prompts']} prompts of each set, one run after a "
        "warm-up; decode tok/s from a streamer's timestamps. assistant_model = "
        f'{settings["draft"]} in fp32; "defaults": {defaults["num_assistant_tokens"]} '
        f"tokens, {defaults['num_assistant_tokens_schedule']} schedule, stopping below "
        f"{defaults['assistant_confidence_threshold']} confidence; prompt lookup matches up "
        f"to {defaults['max_matching_ngram_size']}-grams. The ingot columns: the same "
        "prompts' speedup of the ingot method with the same kind of drafter. transformers "
        "has no Medusa or EAGLE decoding: the medusa and eagle rows have no counterpart "
        "here.",
        "",
        "| transformers | prompts | tok/s | speedup | = plain | ingot method | ingot speedup |",
        "|---|---|---:|---:|---:|---|---:|",
    ]
    ours_of = {v: k for k, v in PEER_OF.items()} | {"assistant_model (defaults)": "draft_model k=4"}
    for set_name, rows in ordered_rows(peer["results"], SETS):
        for case, row in ordered_rows(rows, [name for name, _, _ in PEER_CASES]):
            match = row["matches_plain"]
            method = ours_of.get(case)
            ours = speedup_of((ingot.get("batch1") or {}).get(set_name) or {}, method)
            lines.append(
                f"| {case} | {set_name} ({row['prompts']}) | {row['decode_tokens_per_s']:.0f}"
                f" | {fmt(speedup_of(rows, case))} "
                f"| {share(match) if case != 'plain' else '–'} "
                f"| {method or '–'} | {fmt(ours)} |"
            )
    return lines


def _targets_section(report: dict[str, Any]) -> list[str]:
    lines = ["", "## Targets (issue 14)", ""]
    for verdict in report["targets"]:
        met = {True: "met", False: "NOT met", None: "no figure"}[verdict["met"]]
        value = verdict["value"]
        shown = " vs ".join(fmt(v) for v in value) if isinstance(value, list) else fmt(value)
        lines.append(f"- {verdict['statement']}: {shown} — {met}")
    return lines
