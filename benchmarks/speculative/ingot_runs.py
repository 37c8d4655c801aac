"""The speculative benchmark's ingot cases, in its worker: every method at batch 1 (both prompt
sets, with the step breakdown) and with concurrent requests, the methods' runs interleaved in one
process so that drift of the host hits them alike, each timed run repeated while other
processes took CPU during it (harness.load.OtherWork)."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict
from functools import partial
from typing import Any

from benchmarks.harness.load import OtherWork
from benchmarks.harness.rounds import interleave, paired
from benchmarks.speculative.breakdown import breakdown
from benchmarks.speculative.compare import explain_differences, matches
from benchmarks.speculative.methods import MAX_ATTEMPTS, OTHERS_LIMIT_CORES
from ingot.runtime import LoadedModel, SamplingParams

__all__ = ["run_ingot"]


def run_ingot(spec: dict[str, Any]) -> dict[str, Any]:
    """Every method on its artifact (spec["artifacts"] or else spec["artifact"]), each its own
    LoadedModel and Generator; per run, the methods one after another (plain first), so drift
    of the host hits them alike."""
    params = SamplingParams(max_tokens=spec["tokens"], temperature=0.0, ignore_eos=True)
    models = _Models(spec)
    quiet = OtherWork(OTHERS_LIMIT_CORES, MAX_ATTEMPTS)
    out: dict[str, Any] = {
        "errors": models.errors,
        "configs": {
            name: asdict(model.speculative) if model.speculative else None
            for name, model in models.loaded.items()
        },
        "forced": models.forced,
    }
    batch1 = {
        set_name: _batch1(models, prompts, params, spec["runs"], quiet)
        for set_name, prompts in spec["batch1"].items()
    }
    out["batch1"] = batch1
    if "plain" in models.generators:
        explain_differences(models.generators["plain"], spec, batch1)
    alone = batch1.get("code", {}).get("plain", {}).get("tokens")
    out["concurrent"] = {
        str(n): _concurrent(models, n, prompts, params, spec["runs"], quiet, alone)
        for n, prompts in models.concurrent.items()
    }
    out["quiet"] = quiet.summary()
    return out


class _Models:
    """Every method's LoadedModel and Generator, and the "forced" variants (the same config
    drafting at every step, at any batch size) of the concurrent methods whose threshold a
    concurrency exceeds. A method that cannot load is an error: its row alone fails."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.concurrent = {int(n): p for n, p in spec["concurrent"].items()}
        self.methods: dict[str, dict | bool] = dict(spec["methods"])
        self.loaded: dict[str, Any] = {}
        self.generators: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.forced: dict[str, str] = {}
        for name, config in self.methods.items():
            self._load(name, config, name)
        for name in spec["concurrent_methods"]:
            config = self.methods[name]
            if config and name in self.loaded:
                threshold = self.loaded[name].speculative.disable_by_batch_size
                if any(n > threshold for n in self.concurrent):
                    self.forced[name] = f"{name} forced"
                    self._load(self.forced[name], config | spec["forced"], name)

    def _load(self, row: str, config: dict | bool, method: str) -> None:
        """`row`'s model: `config` on the artifact of `method`'s rows."""
        spec = self.spec
        artifact = spec.get("artifacts", {}).get(method, spec["artifact"])
        max_seqs = max([1, *self.concurrent])
        batched = max([2048] + [sum(map(len, p)) for p in self.concurrent.values()])
        try:
            if artifact is None:
                built = config["method"]  # an OWN_BUILD method: its own build failed
                raise FileNotFoundError(f"no artifact: its build failed (build.{built})")
            self.loaded[row] = LoadedModel.load(
                artifact,
                kv_cache_bytes=spec["kv_cache_bytes"],
                max_num_seqs=max_seqs,
                max_num_batched_tokens=batched,
                enable_prefix_caching=False,  # repeated runs of a prompt must compute it again
                speculative_config=config,
                engine=spec.get("engine"),  # None: the artifact's first compatible engine
            )
            self.generators[row] = self.loaded[row].generator()
        except Exception as e:  # e.g. no draft model in the artifact: that row fails alone
            self.errors[row] = f"{type(e).__name__}: {e}"


def _batch1(
    models: _Models, prompts: list[list[int]], params: Any, runs: int, quiet: OtherWork
) -> dict[str, Any]:
    """Every method's rows of one prompt set at batch 1, the speedups paired with plain's run
    of the same round, then one instrumented run each (the step breakdown)."""
    gens = models.generators
    names = [n for n in models.methods if n in gens]
    for name in names:  # warm-up: each method's shapes and drafts
        _ingot_one(gens[name], prompts[0], params)

    def run(name: str, _: int) -> tuple[list, dict | None]:
        return quiet.call(partial(_one_by_one, gens[name], prompts, params))

    measured = interleave(names, runs, run, rotate=False)  # plain first in every round
    traces = {name: [trace for trace, _ in measured[name]] for name in names}
    rows = {
        name: _batch1_summary(traces[name], traces.get("plain"), measured[name][0][1])
        for name in names
    }
    _paired(rows, "runs", "decode_tokens_per_s", "speedup")
    for name in names:  # one more run, instrumented: where a step's time goes
        rows[name]["step_breakdown"] = breakdown(gens[name], prompts, params)
    return rows


def _concurrent(
    models: _Models,
    n: int,
    prompts: list[list[int]],
    params: Any,
    runs: int,
    quiet: OtherWork,
    alone: list[list[int]] | None,
) -> dict[str, Any]:
    """`n` code prompts at once: every concurrent method (and its forced variant above its
    threshold), paired with plain's run of the same round; plain's outputs against the same
    prompts' `alone` (batch 1) as the control."""
    gens = models.generators
    names = [m for m in models.spec["concurrent_methods"] if m in gens]
    names += [
        models.forced[m] for m in names if m in models.forced and n > _threshold(models.loaded[m])
    ]
    for name in names:
        _ingot_many(gens[name], prompts, params)  # warm-up

    def run(name: str, _: int) -> tuple[dict, dict | None]:
        return quiet.call(partial(_all_at_once, gens[name], prompts, params))

    measured = interleave(names, runs, run, rotate=False)
    timed = {name: [result for result, _ in measured[name]] for name in names}
    rows = {
        name: _concurrent_summary(timed[name], timed.get("plain"), measured[name][0][1])
        for name in names
    }
    _paired(rows, "runs_tokens_per_s", None, "ratio_to_plain")
    if "plain" in timed and alone:
        # The control: plain decoding of the same prompts alone against all together.
        together = timed["plain"][0]["tokens"][: len(alone)]
        rows["plain"]["matches_batch1_plain"] = matches(alone[: len(together)], together)
    return rows


def _paired(rows: dict[str, Any], runs_key: str, value_key: str | None, out_key: str) -> None:
    """Each row's ratio to plain per run, under `out_key`_runs, and their median under
    `out_key` (runs of one round are adjacent in time, so a slow stretch hits both)."""
    plain = rows.get("plain")
    if plain is None:
        return

    def values(row: dict[str, Any]) -> list[float]:
        return [run[value_key] if value_key else run for run in row[runs_key]]

    for row in rows.values():
        ratio = paired(values(row), values(plain))
        row[f"{out_key}_runs"] = ratio.rounds
        row[out_key] = ratio.median


def _one_by_one(gen: Any, prompts: list[list[int]], params: Any) -> tuple[list, dict | None]:
    """The prompts one after another; their traces and the run's speculation counters."""
    before = _stats(gen)
    traces = [_ingot_one(gen, p, params) for p in prompts]
    return traces, _stats_delta(before, _stats(gen))


def _all_at_once(gen: Any, prompts: list[list[int]], params: Any) -> tuple[dict, dict | None]:
    before = _stats(gen)
    result = _ingot_many(gen, prompts, params)
    return result, _stats_delta(before, _stats(gen))


def _threshold(model: Any) -> int:
    return model.speculative.disable_by_batch_size if model.speculative else 0


def _ingot_one(gen: Any, prompt: list[int], params: Any) -> dict[str, Any]:
    """One request alone: its tokens, the time of each (tokens of one step share it), steps."""
    start = time.perf_counter()
    rid = gen.add(prompt, params)
    times, steps = [], 0
    while gen.has_unfinished():
        outputs = gen.step()
        now = time.perf_counter()
        steps += 1
        times += [now for o in outputs if o.request_id == rid]
    tokens = list(gen.pop_completion(rid).token_ids)
    return {"tokens": tokens, "start": start, "times": times, "steps": steps}


def _ingot_many(gen: Any, prompts: list[list[int]], params: Any) -> dict[str, Any]:
    start = time.perf_counter()
    ids = [gen.add(p, params) for p in prompts]
    steps = 0
    while gen.has_unfinished():
        gen.step()
        steps += 1
    seconds = time.perf_counter() - start
    tokens = [list(gen.pop_completion(i).token_ids) for i in ids]
    return {"tokens": tokens, "seconds": seconds, "steps": steps}


def _stats(gen: Any) -> dict[str, Any] | None:
    if gen.speculation is None:
        return None
    s = gen.speculation.stats
    return {
        "num_drafts": s.num_drafts,
        "num_draft_tokens": s.num_draft_tokens,
        "num_accepted_tokens": s.num_accepted_tokens,
        "accepted_per_position": list(s.accepted_per_position),
    }


def _stats_delta(before: dict | None, after: dict | None) -> dict[str, Any] | None:
    """The counters of one run (SpecDecodeStats is cumulative), with vLLM's derived figures:
    mean accepted length = 1 + accepted / drafts (tokens per verification), and per position
    the share of verifications whose i-th draft token was accepted."""
    if before is None or after is None:
        return None
    delta = {k: after[k] - before[k] for k in ("num_drafts", "num_draft_tokens")}
    delta["num_accepted_tokens"] = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    prior = before["accepted_per_position"] + [0] * len(after["accepted_per_position"])
    per_pos = [a - b for a, b in zip(after["accepted_per_position"], prior, strict=False)]
    delta["accepted_per_position"] = per_pos
    drafts = delta["num_drafts"]
    delta["mean_accepted_length"] = 1 + delta["num_accepted_tokens"] / drafts if drafts else None
    delta["acceptance_by_position"] = [a / drafts for a in per_pos] if drafts else []
    delta["draft_acceptance_rate"] = (
        delta["num_accepted_tokens"] / delta["num_draft_tokens"]
        if delta["num_draft_tokens"]
        else None
    )
    return delta


def _batch1_summary(
    runs: list[list[dict]], plain: list[list[dict]] | None, stats: dict | None
) -> dict[str, Any]:
    """Per run: decode tok/s over all prompts (tokens after each prompt's first over the time
    after its first), end-to-end tok/s, TTFT, target steps; the median run's figures."""
    per_run = []
    for traces in runs:
        decode_tokens = sum(len(t["times"]) - 1 for t in traces)
        decode_s = sum(t["times"][-1] - t["times"][0] for t in traces)
        total_tokens = sum(len(t["times"]) for t in traces)
        total_s = sum(t["times"][-1] - t["start"] for t in traces)
        steps = sum(t["steps"] - 1 for t in traces)  # the first step is the prefill
        per_run.append(
            {
                "decode_tokens_per_s": decode_tokens / decode_s,
                "e2e_tokens_per_s": total_tokens / total_s,
                "ttft_ms": 1000 * statistics.mean(t["times"][0] - t["start"] for t in traces),
                "decode_steps": steps,
                "ms_per_step": 1000 * decode_s / steps,
                "tokens_per_step": decode_tokens / steps,
            }
        )
    median = statistics.median(r["decode_tokens_per_s"] for r in per_run)
    middle = min(per_run, key=lambda r: abs(r["decode_tokens_per_s"] - median))
    out = {
        "prompts": len(runs[0]),
        "runs": per_run,
        "decode_tokens_per_s": median,
        "e2e_tokens_per_s": statistics.median(r["e2e_tokens_per_s"] for r in per_run),
        "ttft_ms": statistics.median(r["ttft_ms"] for r in per_run),
        "ms_per_step": middle["ms_per_step"],
        "tokens_per_step": middle["tokens_per_step"],
        "speculation": stats,
        # Of the first run's decode steps, the share that verified drafts.
        "drafting_steps_share": stats["num_drafts"] / per_run[0]["decode_steps"] if stats else None,
        "tokens": [t["tokens"] for t in runs[0]],
    }
    if plain is not None:
        out["matches_plain"] = matches([t["tokens"] for t in plain[0]], out["tokens"])
    return out


def _concurrent_summary(
    runs: list[dict], plain: list[dict] | None, stats: dict | None
) -> dict[str, Any]:
    tokens = sum(map(len, runs[0]["tokens"]))
    per_s = [tokens / r["seconds"] for r in runs]
    out = {
        "requests": len(runs[0]["tokens"]),
        "generated_tokens": tokens,
        "runs_tokens_per_s": per_s,
        "tokens_per_s": statistics.median(per_s),
        "steps": sorted({r["steps"] for r in runs}),
        "speculation": stats,
    }
    if plain is not None:
        out["matches_plain"] = matches(plain[0]["tokens"], runs[0]["tokens"])
    return out
