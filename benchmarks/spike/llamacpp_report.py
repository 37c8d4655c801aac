"""The llama.cpp spike's markdown, rendered from the JSON alone (benchmarks/spike/llamacpp.py
writes it; `--report-only` renders it again). The timed cases' tables are the OpenVINO spike's
(openvino_report.model_sections)."""

from __future__ import annotations

from typing import Any

from benchmarks.harness.load import load_line
from benchmarks.spike.openvino_report import model_sections

__all__ = ["markdown"]

_CHECKS = {  # check -> what was done
    "prefix_sharing": "prefix decoded once, `seq_cp` to a 2nd sequence, two suffixes in one batch",
    "rollback": "4 draft tokens decoded, `seq_rm` from the first, greedy resumed",
    "preemption": "state saved, cells removed and reused, restored under a new sequence id",
}


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    versions = ", ".join(
        f"{venv}: " + ", ".join(f"{k} {v}" for k, v in libs.items())
        for venv, libs in report["versions"].items()
    )
    lines = [
        "# Spike: llama.cpp as ingot's second engine (issue 27)",
        "",
        f"{m['date']} on {m['cpu_model']}, {m['usable_cores']} cores; {versions}.",
        "",
        "Every engine runs one ingot artifact (RTN int4 g32 symmetric on every linear, lm_head "
        "included). `ingot`: its ONNX Runtime engine through ingot's Generator (MatMulNBits at "
        "accuracy level 4: int8 activations; fp32 KV in blocks of 16; prefix caching off). "
        "`llama.cpp`: the GGUF ingot's `gguf` interop format wrote into the same artifact (the "
        "same codes as Q4_0 blocks, fp16 scales) through llama-cpp-python's batch API "
        "(`llama_decode` on a `llama_batch`, one sequence id per prompt, all decoded together; "
        "KV f16, flash attention as llama.cpp picks); `llama.cpp-q8kv`: K and V cached as "
        "q8_0. 2 threads; each engine in its own process per round (load, warm-up, one timed "
        "run), engines in turn, the order rotated; medians over rounds, ratios paired within a "
        "round (range in brackets).",
        "",
    ]
    lines += model_sections(report, _check_section)
    lines += [
        "Notes:",
        "",
        "- Each part (check, batch1, batched, long) of each model is its own invocation; the "
        "date above is the last one's, the host load line covers every part's samples.",
        "- Greedy = ingot: leading tokens equal to ingot's engine, the mean over sequences. "
        "The 1B shape has random weights: its argmax is near a tie everywhere, so any two "
        "engines part within a few tokens there; pydoc-16m's is the meaningful one.",
        "- TTFT of the batched case: all 32 prompts in one prefill (one llama_decode call, "
        "one Generator step).",
        "",
        load_line(report["load"], report.get("refused")),
        "",
    ]
    return "\n".join(lines)


def _check_section(model: str, check: dict[str, Any]) -> list[str]:
    lines = [f"## llama.cpp's KV operations: {model}", ""]
    if not check.get("ok"):
        return [*lines, f"Check failed: `{check.get('error')}`", ""]
    lines += [
        "Each check's greedy tokens against a fresh decode of the same text (24 tokens), with "
        "the KV split per sequence (llama.cpp's default, `kv_unified` off) and as one unified "
        "pool of cells.",
        "",
        "| check | what | per sequence | unified |",
        "|---|---|---|---|",
    ]
    modes = [check.get("per_sequence", {}), check.get("unified", {})]
    for name, what in _CHECKS.items():
        cells = [_same(mode.get(name, {})) for mode in modes]
        lines.append(f"| {name} | {what} | {cells[0]} | {cells[1]} |")
    kv = [mode.get("quantized_kv", {}) for mode in modes]
    cells = [
        f"{q.get('greedy_equal_to_f16')}/{q.get('of')} tokens = f16's; "
        f"{q.get('state_bytes_per_token', 0):.0f} B/token"
        if q
        else "–"
        for q in kv
    ]
    lines.append(f"| quantized_kv | K and V as q8_0 | {cells[0]} | {cells[1]} |")
    em = [mode.get("embeddings", {}) for mode in modes]
    cells = [
        f"{e['n_embd']} floats a row; lm_head(row) vs logits {e['lm_head_of_row_vs_logits']:.1e}, "
        f"argmax {'equal' if e['argmax_equal'] else 'differs'}"
        if e.get("hidden_row")
        else "no row"
        for e in em
    ]
    lines.append(f"| embeddings | the hidden row beside the logits | {cells[0]} | {cells[1]} |")
    pre = modes[0].get("preemption", {})
    if pre:
        lines += [
            "",
            f"A saved sequence state: {pre['state_bytes_per_token']:.0f} bytes a token (f16 "
            f"K/V); saved in {pre['save_s'] * 1e3:.2f} ms, restored in "
            f"{pre['restore_s'] * 1e3:.2f} ms ({pre['state_bytes']} bytes).",
        ]
    return [*lines, ""]


def _same(result: dict[str, Any]) -> str:
    if not result:
        return "–"
    return "same as fresh" if result.get("same_as_fresh") else "**differs**"
