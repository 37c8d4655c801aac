"""The speculative benchmark's peer, in its worker: transformers' generate on the float
checkpoint (fp32), plain, with assisted generation (the draft model) and with prompt lookup,
each prompt through every case in turn, the tokens timestamped by a streamer."""

from __future__ import annotations

import statistics
import time
from functools import partial
from typing import Any

from benchmarks.harness.load import OtherWork
from benchmarks.harness.rounds import interleave
from benchmarks.speculative.compare import matches
from benchmarks.speculative.methods import MAX_ATTEMPTS, OTHERS_LIMIT_CORES

__all__ = ["run_transformers"]


def run_transformers(spec: dict[str, Any]) -> dict[str, Any]:
    """transformers' generate on the float checkpoint (fp32), greedy, EOS never stopping it
    (no eos_token_id), each prompt through every case in turn; tokens timestamped by a
    streamer (assisted generation puts every verification's tokens at once)."""
    # transformers only in this worker (see _generate).
    from transformers import GenerationConfig

    one = _generate(spec)
    cases = {name: (fields, assisted) for name, fields, assisted in spec["cases"]}
    quiet = OtherWork(OTHERS_LIMIT_CORES, MAX_ATTEMPTS)
    results: dict[str, Any] = {}
    for set_name, prompts in spec["prompts"].items():
        for fields, assisted in cases.values():  # warm-up
            one(prompts[0], fields, assisted)

        def run(name: str, index: int, prompts: list[list[int]] = prompts) -> dict[str, Any]:
            return quiet.call(partial(one, prompts[index], *cases[name]))

        # A round is a prompt: every case on it in turn, plain first.
        traces = interleave(list(cases), len(prompts), run, rotate=False)
        plain = traces[next(iter(cases))]
        results[set_name] = {name: _summary(traces[name], plain) for name in cases}
    return {
        "cases": {name: fields | {"assistant_model": a} for name, (fields, a) in cases.items()},
        "assistant_defaults": _assistant_defaults(GenerationConfig),
        "results": results,
        "quiet": quiet.summary(),
    }


def _generate(spec: dict[str, Any]) -> Any:
    """`one(prompt, fields, assisted)`: one greedy generate of the target (with the draft as
    assistant model if `assisted`), its tokens, start and token times."""
    # torch and transformers only in this worker: the benchmark's own process never loads them.
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.streamers import BaseStreamer

    torch.set_num_threads(spec["threads"])
    transformers.logging.set_verbosity_error()
    target = AutoModelForCausalLM.from_pretrained(spec["target"], dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(spec["draft"], dtype=torch.float32).eval()
    for model in (target, draft):
        # generate fills a config's unset fields from the model's generation_config (EOS 1):
        # without one there, nothing stops a sequence before max_new_tokens.
        model.generation_config.eos_token_id = None
    n = spec["tokens"]

    class Clock(BaseStreamer):
        def __init__(self) -> None:
            self.prompt_seen, self.times = False, []

        def put(self, value: torch.Tensor) -> None:
            if not self.prompt_seen:  # generate puts the prompt first
                self.prompt_seen = True
                return
            self.times += [time.perf_counter()] * value.numel()

        def end(self) -> None:
            pass

    def one(prompt: list[int], fields: dict, assisted: bool) -> dict[str, Any]:
        config = GenerationConfig(
            max_new_tokens=n,
            do_sample=False,
            bos_token_id=0,
            pad_token_id=0,
            **fields,
        )
        ids = torch.tensor([prompt])
        clock = Clock()
        extra = {"assistant_model": draft} if assisted else {}
        start = time.perf_counter()
        with torch.inference_mode():
            out = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                generation_config=config,
                streamer=clock,
                **extra,
            )
        tokens = out[0, len(prompt) :].tolist()
        if len(tokens) != n or len(clock.times) != n:
            raise RuntimeError(f"{len(tokens)} tokens ({len(clock.times)} streamed), wanted {n}")
        return {"tokens": tokens, "start": start, "times": clock.times}

    return one


def _summary(runs: list[dict[str, Any]], plain: list[dict[str, Any]]) -> dict[str, Any]:
    """A case's prompts, one run each: decode and end-to-end tok/s over all of them, TTFT, and
    its outputs against plain generate's."""
    decode_tokens = sum(len(t["times"]) - 1 for t in runs)
    decode_s = sum(t["times"][-1] - t["times"][0] for t in runs)
    total_s = sum(t["times"][-1] - t["start"] for t in runs)
    return {
        "prompts": len(runs),
        "decode_tokens_per_s": decode_tokens / decode_s,
        "e2e_tokens_per_s": sum(len(t["times"]) for t in runs) / total_s,
        "ttft_ms": 1000 * statistics.mean(t["times"][0] - t["start"] for t in runs),
        "matches_plain": matches([t["tokens"] for t in plain], [t["tokens"] for t in runs]),
    }


def _assistant_defaults(config_class: Any) -> dict[str, Any]:
    """What transformers fills in for the assisted-generation fields a config leaves unset."""
    defaults = config_class._get_default_generation_params()
    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule")
    out = {k: defaults.get(k) for k in (*keys, "assistant_confidence_threshold")}
    out["max_matching_ngram_size"] = 2  # generate's `max_matching_ngram_size or 2`
    return out
