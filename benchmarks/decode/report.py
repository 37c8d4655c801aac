"""decode.json (every raw number), decode.md (the tables, the bandwidth, the targets) and the
context part's plot, decode_context.png."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.decode.context_report import PLOT, best_cell, context_section, num, plot_context
from benchmarks.decode.rounds import OURS
from benchmarks.decode.targets import issue27_targets
from benchmarks.harness.load import load_line
from benchmarks.harness.report import publish
from benchmarks.harness.rounds import ranged

__all__ = ["STEM", "TARGET_FRACTION", "markdown", "publish_report", "replot", "target_verdict"]

STEM = "decode"  # benchmarks/results/decode.json and decode.md

# The goal: ingot's batch-1 decode at >= 0.85 of the memory-bandwidth bound on the 1B shape.
TARGET_FRACTION = 0.85
TARGET_MODEL, TARGET_ENGINE = "llama-1b-shape", "ingot"
_MIB = 1 << 20
_TOP_OPS = 6  # op types named in the breakdown table; the rest are summed as "other ops"


def publish_report(report: dict[str, Any], out_dir: Path) -> int:
    """The report with its target verdict, written and printed, and its plot; the exit
    status."""
    report["target"] = target_verdict(report["results"])
    status = publish(report, out_dir, STEM, markdown)
    replot(out_dir)
    return status


def replot(out_dir: Path) -> Path | None:
    """The context plot drawn again from out_dir/decode.json (what the markdown renders)."""
    report = json.loads((out_dir / f"{STEM}.json").read_text())
    return plot_context(report, out_dir / PLOT)


def target_verdict(results: dict[str, Any]) -> dict[str, Any]:
    case = results["models"].get(TARGET_MODEL, {}).get("batch1", {}).get(TARGET_ENGINE, {})
    fraction = case.get("fraction_of_bound")
    return {
        "statement": "ingot batch-1 decode on the 1B shape at >= "
        f"{TARGET_FRACTION:.2f} of the memory-bandwidth bound",
        "fraction": fraction,
        "met": None if fraction is None else fraction >= TARGET_FRACTION,
    }


def markdown(report: dict[str, Any]) -> str:
    settings, machine = report["settings"], report["machine"]
    lines = [
        "# Decode: ingot's engines, onnxruntime-genai, OpenVINO GenAI and llama.cpp side by side",
        "",
        f"{machine['date']} on {machine['cpu_model']}, {machine['usable_cores']} cores, "
        f"{machine['ram_bytes'] / (1 << 30):.1f} GiB RAM; " + _versions(machine) + ".",
        f"Weights: {settings['weights']}, MatMulNBits accuracy level "
        f"{settings['matmul_accuracy_level']} (int8 activations; llama.cpp: the same weights as "
        "Q4_0, from ingot's GGUF). " + _engines_line(settings) + " "
        f"Prompt {settings['prompt_tokens']} tokens, {settings['new_tokens']} new tokens per "
        f"sequence (greedy, EOS ignored), {settings['threads']} threads, warm-up of "
        f"{settings['warmup_tokens']} tokens. {settings['runs']} interleaved rounds: each "
        "round times one run of every engine in turn (order rotated per round), then the "
        "memory bandwidth; tok/s is the median over rounds, ingot / engine the median of the "
        "rounds' paired ratios (range in brackets), of bound the median of each round's rate "
        "over that round's bound. tok/s counts decode steps only (the first token comes from "
        "the prefill: TTFT); TPOT is the interval between a sequence's consecutive tokens "
        "(p50 / p99: medians of the rounds' percentiles). / best peer: the median of the "
        "rounds' paired ratios to the peer of the highest tok/s in that row.",
    ]
    models = report["results"]["models"]
    lines += ["", "## Batch 1", ""]
    lines += _decode_table(models, "batch1", agreement=True)
    lines += ["", f"## {settings['batch']} sequences decoding together", ""]
    lines += [
        "ingot (either engine): all added to one Generator (in-flight batching); "
        "onnxruntime-genai: one static batch; OpenVINO GenAI: its ContinuousBatchingPipeline; "
        "llama.cpp: one llama_batch per step, a sequence id per prompt. tok/s is "
        "the sum over the sequences; the bound counts the weights once per step and each "
        "sequence's KV cache.",
        "",
    ]
    lines += _decode_table(models, "batched", agreement=False)
    lines += ["", "## Decode against context (batch 1)", ""]
    lines += context_section(models, settings)
    lines += ["", "## Issue 27's targets", ""]
    lines += _targets_section(report["results"])
    lines += ["", "## Prefill (ingot)", ""]
    lines += _prefill_section(models, settings)
    lines += ["", "## Step time by op type (ingot, ONNX Runtime's profiler)", ""]
    lines += _profile_section(models)
    lines += [
        "",
        _bandwidth_line(report["bandwidth"], models),
        "Bytes read per step: quantized linears = codes (4 bits per weight) + scales (fp32 in "
        "MatMulNBits and ingot's OpenVINO engine, fp16 in Q4_0 and OpenVINO GenAI's export) per "
        "group of 32, lm_head in full, norms, one embedding row and the KV cache of each "
        "sequence at the mean decode context (fp32 for ingot's engines and onnxruntime-genai, "
        "f16 for llama.cpp, u8 for OpenVINO GenAI, its scales left out).",
        "",
        _target_line(report["target"]),
        "",
        load_line(report["host_load"], report.get("refused")),
    ]
    notes = _notes(models)
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    errors = _errors(models)
    if errors:
        lines += ["", "Errors:", ""] + [f"- {e}" for e in errors]
    return "\n".join(lines) + "\n"


def _decode_table(models: dict[str, Any], group: str, agreement: bool) -> list[str]:
    ours = [e for e in OURS if any(e in model.get(group, {}) for model in models.values())]
    head = (
        "| model | engine | tok/s (rounds) | TTFT ms | TPOT p50 / p99 ms | "
        + "".join(f"{e} / engine | " for e in ours)
        + "/ best peer | MB read / step | bound tok/s | of bound | peak RSS MiB |"
    )
    align = "|---|---|---:|---:|---:|" + "---:|" * (len(ours) + 1) + "---:|---:|---:|---:|"
    if agreement:
        head += " greedy = IR |"
        align += "---|"
    if not any(model.get(group) for model in models.values()):
        return ["Not run."]
    lines = [head, align]
    for name, model in models.items():
        for engine, case in model.get(group, {}).items():
            traffic = case["traffic"]
            cells = [
                name,
                engine,
                _rate(case),
                num(case.get("ttft_s"), ".0f", 1000),
                _tpot(case),
                *(_ratio(case, mine) if engine not in OURS else "" for mine in ours),
                best_cell(case.get("best_peer")) if engine in OURS else "",
                f"{traffic['bytes_per_step'] / 1e6:.0f}",
                f"{case['bound_tokens_per_s']:.1f}",
                num(case.get("fraction_of_bound"), ".2f"),
                num(case.get("peak_rss_bytes"), ".0f", 1 / _MIB),
            ]
            if agreement:
                cells.append(_match(case.get("tokens_match_reference")))
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _targets_section(results: dict[str, Any]) -> list[str]:
    rows = issue27_targets(results)
    lines = [
        "Each target as issue 27 states it, for each of ingot's engines: the measured ratio "
        "(from the tables above) against the threshold.",
        "",
        "| target | engine | measured | threshold | met |",
        "|---|---|---:|---:|---|",
    ]
    from benchmarks.decode.targets import TARGETS  # the thresholds, in the rows' order

    thresholds = {t.statement: t for t in TARGETS}
    for row in rows:
        target = thresholds[row["statement"]]
        sign = ">=" if target.at_least else "<="
        met = {None: "–", True: "met", False: "**missed**"}[row["met"]]
        cells = [
            row["statement"],
            row["engine"],
            num(row["value"], ".2f"),
            f"{sign} {target.threshold:g}",
            met,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _prefill_section(models: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    rows = [(n, m["prefill"]) for n, m in models.items() if "prefill" in m]
    if not rows:
        return ["Not run."]
    packed = settings["prefill"]["packed_prompts"]
    lines = [
        f"{settings['prefill']['prompts']} prompts of {settings['prefill']['tokens_per_prompt']} "
        "tokens added at once (one new token each; the step's token budget holds them all), "
        f"then {packed} of them at once against their concatenation as one packed sequence. "
        "A sequence cannot exceed the model's context (pydoc-16m: 1024 tokens), so the packed "
        f"comparison is scaled down to {packed} prompts, cut to max_seq_len - 1 tokens; "
        "tokens/s compares the cases. A packed sequence attends causally across the prompts' "
        "boundaries: more attention work than the batch, the same matmul work.",
        "",
        "| model | case | sequences x tokens | tokens | ms (runs) | tokens/s | steps |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for name, prefill in rows:
        if not prefill.get("ok"):
            lines.append(f"| {name} | error | | | | | |")
            continue
        for case in prefill["cases"]:
            runs = ", ".join(f"{s * 1000:.0f}" for s in case["runs_s"])
            lengths = "/".join(str(n) for n in case["tokens_per_sequence"])
            cells = [
                name,
                case["name"],
                f"{case['sequences']} x {lengths}",
                str(case["tokens"]),
                f"{case['seconds'] * 1000:.0f} ({runs})",
                f"{case['tokens_per_s']:.0f}",
                ", ".join(map(str, case["steps"])),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _profile_section(models: dict[str, Any]) -> list[str]:
    rows = [
        (name, batch, prof)
        for name, model in models.items()
        for batch, prof in model.get("profile", {}).items()
    ]
    if not rows:
        return ["Not run."]
    ops: dict[str, float] = {}
    for _, _, prof in rows:
        for op, ms in (prof.get("op_ms_per_run") or {}).items():
            ops[op] = max(ops.get(op, 0.0), ms / prof["step_wall_ms"])
    top = sorted(ops, key=lambda op: -ops[op])[:_TOP_OPS]
    lines = [
        "Share of a decode step's wall time (profiled run): the runtime's Python around the "
        "session call (scheduling, inputs, KV writes, sampling), ONNX Runtime between kernels, "
        "and each op type's kernels. ONNX Runtime's profiler inflates each node's time, so the "
        "shares are what to read, not absolute times; the step time shown is the profiled one.",
        "",
        "| model | batch | profiled step ms | runtime | ORT between kernels | "
        + " | ".join(top)
        + " | other ops |",
        "|---|---:|---:|---:|---:|" + "---:|" * (len(top) + 1),
    ]
    for name, batch, prof in rows:
        if not prof.get("ok"):
            lines.append(f"| {name} | {batch} | error |" + " |" * (len(top) + 3))
            continue
        shares = prof["shares"]
        named = [shares.get(f"op:{op}", 0.0) for op in top]
        all_ops = sum(v for k, v in shares.items() if k.startswith("op:"))
        cells = [
            name,
            batch,
            f"{prof['step_wall_ms']:.1f}",
            _pct(shares["runtime_outside_ort"]),
            _pct(shares["ort_between_kernels"]),
            *(_pct(v) for v in named),
            _pct(all_ops - sum(named)),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _rate(case: dict[str, Any]) -> str:
    """Median tok/s with the spread of the rounds, which shows a noisy host."""
    if not case.get("ok"):
        return "failed"
    rates = [r["tokens_per_s"] for r in case["runs"]]
    spread = f"{min(rates):.1f}–{max(rates):.1f}" if len(rates) > 1 else "1 round"
    return f"{case['tokens_per_s']:.1f} ({spread})"


def _tpot(case: dict[str, Any]) -> str:
    if not case.get("ok") or case.get("tpot_p50_s") is None:
        return "–"
    return f"{case['tpot_p50_s'] * 1000:.1f} / {case['tpot_p99_s'] * 1000:.1f}"


def _ratio(peer: dict[str, Any], mine: str) -> str:
    """The median of the rounds' paired ratios mine / peer (rounds.pair_ratios), with their
    range; reports written before ingot had a second engine hold ingot's alone."""
    ratios = peer.get("ratios") or {"ingot": peer.get("ingot_ratio")}
    rounds = peer.get("ratio_rounds") or {"ingot": peer.get("ingot_ratio_rounds")}
    ratio = ratios.get(mine)
    return ranged(ratio, rounds.get(mine) or [ratio])


def _blocks_line(settings: dict[str, Any]) -> str:
    """Whether ingot's two rows share one artifact (one KV block size) or not."""
    if settings["kv_block_size"] == settings["openvino_kv_block_size"]:
        return "one artifact with both engine targets for both rows"
    return f"its own artifact; the ingot row's has blocks of {settings['kv_block_size']}"


def _engines_line(settings: dict[str, Any]) -> str:
    """How the engines beyond ingot's first one ran (reports from before them say nothing)."""
    if "context" not in settings:
        return ""
    return (
        "ingot-openvino: ingot's OpenVINO engine (the load's engine override "
        f"`{settings['openvino_engine_override']}`; KV blocks of "
        f"{settings['openvino_kv_block_size']} tokens, {_blocks_line(settings)}); "
        "OpenVINO GenAI: its own export of the checkpoint "
        "(optimum-intel, int4 g32 symmetric on every layer, lm_head and embeddings included), "
        "LLMPipeline at batch 1 and ContinuousBatchingPipeline for several sequences, its "
        "defaults on this CPU (bf16 inference, u8 KV, int8 dynamic quantization of "
        "activations), prefix caching off."
    )


def _notes(models: dict[str, Any]) -> list[str]:
    notes = []
    for name, model in models.items():
        run = model.get("run")  # measured by a run of its own, merged into this report
        if run:
            load = run["host_load"]["load_1min_samples"]
            notes.append(
                f"{name}: measured in a run of its own ({run['date']}, {run['wall_s']:.0f} s, "
                f"host load max {max(load):.1f}{', REFUSED' if run.get('refused') else ''}): "
                f"`{run['command']}`; {run['why']}"
            )
        reference = model.get("reference")
        if reference and reference.get("ok"):
            notes.append(
                f"{name}: greedy reference = ingot's IR in fp32 (torch) on the checkpoint "
                f"({reference['tokens_per_s']:.1f} tok/s); agreement is the count of leading "
                "tokens identical to it. The 1B shape has random weights: its argmax is near a "
                "tie everywhere, so agreement is not reported there."
            )
        build = model.get("builds", {}).get("ingot", {})
        engine_graph = (build.get("graphs") or {}).get("onnxruntime_optimized")
        if engine_graph:
            ops = engine_graph["op_types"]
            notes.append(
                f"{name}: ingot engine graph: MatMulNBits {ops.get('MatMulNBits', 0)}, "
                f"DequantizeLinear {ops.get('DequantizeLinear', 0)}, MatMul "
                f"{ops.get('MatMul', 0)}; weights read per step "
                f"{engine_graph['weight_bytes_per_step'] / 1e6:.0f} MB"
            )
        for group in ("batch1", "batched"):
            for engine, case in model.get(group, {}).items():
                if case.get("reduced"):
                    notes.append(f"{name} / {engine} ({group}): {case['reduced']['reason']}")
                info = case.get("info") or {}
                if info.get("pipeline"):
                    notes.append(
                        f"{name} / {engine} ({group}): {info['pipeline']}, KV cache "
                        f"{info['cache_size_gb']} GB"
                    )
                if group == "batch1" and info.get("model_desc"):
                    notes.append(
                        f"{name} / llama.cpp: {info['model_desc']}, "
                        f"{info.get('model_bytes', 0) / 1e6:.0f} MB of tensors"
                    )
    return notes


def _errors(models: dict[str, Any]) -> list[str]:
    errors = []
    for name, model in models.items():
        records = {f"build {k}": v for k, v in model.get("builds", {}).items()}
        records |= {f"{k} (batch 1)": v for k, v in model.get("batch1", {}).items()}
        records |= {f"{k} (batched)": v for k, v in model.get("batched", {}).items()}
        records |= {f"profile batch {k}": v for k, v in model.get("profile", {}).items()}
        for engine, processes in (model.get("context") or {}).get("processes", {}).items():
            records |= {f"{engine} (context, round {i + 1})": p for i, p in enumerate(processes)}
        if "prefill" in model:
            records["prefill"] = model["prefill"]
        if "reference" in model:
            records["reference"] = model["reference"]
        for what, record in records.items():
            if not record.get("ok"):
                errors.append(f"{name} / {what}: `{_one_line(record.get('error', '?'))}`")
    return errors


def _match(match: dict[str, int] | None) -> str:
    if match is None:
        return "–"
    return f"{match['leading_identical']}/{match['of']}"


def _bandwidth_line(bandwidth: dict[str, Any], models: dict[str, Any]) -> str:
    runs = [
        ", ".join(f"{name} {rate / 1e9:.1f}" for name, rate in run["methods_bytes_per_s"].items())
        for run in bandwidth["runs"]
    ]
    rounds = [
        r["bandwidth_bytes_per_s"] / 1e9
        for model in models.values()
        for group in ("batch1", "batched")
        for r in (model.get(group, {}).get("ingot", {}).get("rounds") or [])
        if "bandwidth_bytes_per_s" in r
    ]
    rounds += [
        r["bandwidth_bytes_per_s"] / 1e9
        for model in models.values()
        for point in (model.get("context") or {}).get("points", [])[:1]
        for r in (point["engines"].get("ingot", {}).get("rounds") or [])
        if "bandwidth_bytes_per_s" in r
    ]
    within = f"; after each round: {min(rounds):.1f}–{max(rounds):.1f}" if rounds else ""
    return (
        "Memory bandwidth (bytes read / s over a 1 GiB float32 array, best of 5; highest "
        f"read-only method), GB/s: before the engines {runs[0]}; after them {runs[-1]}"
        f"{within}."
    )


def _target_line(target: dict[str, Any]) -> str:
    if target["met"] is None:
        return f"Target: {target['statement']}: not evaluated in this run."
    verdict = "met" if target["met"] else "NOT met"
    return f"Target: {target['statement']}: **{verdict}** ({target['fraction']:.2f})."


def _versions(machine: dict[str, Any]) -> str:
    versions = {k: v for k, v in machine["versions"].items() if v and k != "ingot"}
    versions |= {k: v for k, v in machine.get("peer_versions", {}).items()}
    return ", ".join(f"{k} {v or 'not installed'}" for k, v in versions.items())


def _pct(value: float) -> str:
    return f"{value * 100:.0f}%"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]
