"""Offline batch generation, vLLM's way: ``LLM(path).generate(prompts, params)``.

    from ingot import LLM, SamplingParams
    llm = LLM("out/demo")
    for out in llm.generate(["The os module"], SamplingParams(max_tokens=32, temperature=0)):
        print(out.prompt, out.outputs[0].text)

The same generation loop as the server (the Generator: scheduler, paged KV cache, prefix
caching); no torch. A prompt whose params ask for n > 1 samples (or best_of) runs as one
generator request per sample (runtime.sampling.fan_out: with seed s, sample i is seeded s + i)
and returns the n best by cumulative logprob when best_of > n, else all n in order
(runtime.n_best.pick_best), exactly as the server does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ingot.artifacts.resolve import resolve_artifact
from ingot.runtime.generate import DEFAULT_MAX_NUM_SEQS, Completion
from ingot.runtime.kv_pool import KVCacheTooSmall
from ingot.runtime.model import LoadedModel
from ingot.runtime.n_best import pick_best
from ingot.runtime.sampling import SamplingParams, fan_out
from ingot.runtime.tokenizer import ChatTemplateError, TextTokenizer, check_chat_template

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "load_chat_template", "resolve_model"]

Prompt = str | dict[str, Any]  # text, or {"prompt_token_ids": [...]} as vLLM's TokensPrompt
Message = dict[str, Any]  # {"role": ..., "content": ...}


@dataclass(slots=True)
class CompletionOutput:
    index: int  # 0..n-1: its place in RequestOutput.outputs (best first when best_of > n)
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    cumulative_logprob: float | None = None  # sum of the sampled tokens' logprobs
    logprobs: list[dict[int, float]] | None = None  # per token: sampled + top-n {id: logprob}
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


def resolve_model(model: str | Path) -> Path:
    """The local artifact directory for `model`. The one place a model reference is resolved:
    registry references (oci://...) are pulled into the local store here."""
    return resolve_artifact(model)


class LLM:
    """One artifact, loaded and verified, with a generator over its KV cache."""

    def __init__(
        self,
        model: str | Path,
        *,
        kv_cache_memory: int | None = None,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens: int = 2048,
        enable_prefix_caching: bool = True,
        speculative_config: dict[str, Any] | bool | None = None,
        chat_template: str | Path | None = None,
        engine: str | None = None,
        scheduling_policy: str = "fcfs",
    ) -> None:
        """`kv_cache_memory`: bytes of KV cache (keys and values of every layer); None sizes it
        from available memory (half of it, at most `max_num_seqs` sequences of max_seq_len).
        `speculative_config`: vLLM's dict ({"method": "ngram", "num_speculative_tokens": 4,
        "prompt_lookup_max": 4}, or method "draft_model" / "medusa" / "eagle" on an artifact
        built with a draft model / heads / an EAGLE-3 draft); None keeps the artifact's own
        setting, False turns speculation off.
        `chat_template`: the Jinja chat template `chat` renders, instead of the artifact's (or
        where it has none): the template's text, or a file holding it (a Path, or a str naming
        an existing file, as vLLM's --chat-template); a template that does not compile raises
        ChatTemplateError.
        `engine`: the artifact's engine to run, by name ("openvino-cpu") or kind ("openvino"),
        instead of the first one this host runs in the artifact's recorded order; an engine it
        does not have, or one that cannot run here, raises EngineUnavailable.
        `scheduling_policy`: "fcfs" (default) or "priority", vLLM's: with "priority",
        `generate`'s `priority` orders the requests (lower first) and picks whom preemption
        takes (the highest value, latest arrival); under "fcfs" priorities are ignored."""
        template = None if chat_template is None else load_chat_template(chat_template)
        try:
            self.model = LoadedModel.load(
                resolve_model(model),
                chat_template=template,
                kv_cache_bytes=kv_cache_memory,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                enable_prefix_caching=enable_prefix_caching,
                speculative_config=speculative_config,
                engine=engine,
                scheduling_policy=scheduling_policy,
            )
        except KVCacheTooSmall as e:  # in this API's words: kv_cache_memory, not pool blocks
            raise e.worded("kv_cache_memory", f"kv_cache_memory={kv_cache_memory}") from e
        self.generator = self.model.generator()
        self._next_id = 0

    def get_tokenizer(self) -> TextTokenizer:
        return self.model.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        priority: int | Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Complete every prompt, batched; results in the order of `prompts`. `priority`
        (vLLM's: one per prompt, or one for all) matters under the "priority" policy."""
        if isinstance(prompts, str | dict):
            prompts = [prompts]
        texts = [p if isinstance(p, str) else None for p in prompts]
        ids = [self._prompt_ids(p) for p in prompts]
        return self._run(texts, ids, sampling_params, priority)

    def chat(
        self,
        messages: Sequence[Message] | Sequence[Sequence[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Reply to one conversation or a list of them, through the chat template (the
        `chat_template` given to LLM, else the artifact's)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tokenizer = self.model.tokenizer
        texts = [
            tokenizer.apply_chat_template(list(c), add_generation_prompt) for c in conversations
        ]
        # The template writes the special tokens (BOS) itself.
        ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
        return self._run(texts, ids, sampling_params)

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.model.tokenizer.encode(prompt)
        if set(prompt) != {"prompt_token_ids"}:
            raise ValueError(f"a prompt is a str or {{'prompt_token_ids': [...]}}, got {prompt!r}")
        return list(prompt["prompt_token_ids"])

    def _run(
        self,
        texts: list[str | None],
        ids: list[list[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        priority: int | Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        params = sampling_params or SamplingParams()
        per_prompt = params if isinstance(params, Sequence) else [params] * len(ids)
        if len(per_prompt) != len(ids):
            raise ValueError(f"{len(per_prompt)} sampling params for {len(ids)} prompts")
        priority = 0 if priority is None else priority
        priorities = priority if isinstance(priority, Sequence) else [priority] * len(ids)
        if len(priorities) != len(ids):
            raise ValueError(f"{len(priorities)} priorities for {len(ids)} prompts")
        # One generator request per sample, all batched together.
        samples = [fan_out(p) for p in per_prompt]
        flat_ids = [i for i, fan in zip(ids, samples, strict=True) for _ in fan]
        flat_priority = [r for r, fan in zip(priorities, samples, strict=True) for _ in fan]
        completions = iter(
            self.generator.generate(
                flat_ids, [q for fan in samples for q in fan], priority=flat_priority
            )
        )
        outputs = []
        for text, prompt_ids, p, fan in zip(texts, ids, per_prompt, samples, strict=True):
            best = pick_best([next(completions) for _ in fan], p.n)
            outputs.append(
                RequestOutput(
                    request_id=str(self._next_id),
                    prompt=text,
                    prompt_token_ids=list(prompt_ids),
                    outputs=[_completion_output(i, c) for i, c in enumerate(best)],
                )
            )
            self._next_id += 1
        return outputs


def load_chat_template(template: str | Path) -> str:
    """The template source `template` stands for: a str with Jinja syntax or a line break in
    it is the template itself (vLLM's LLM.chat(chat_template=...)); a Path, or any other str,
    names a file holding one (vLLM's --chat-template FILE). Checked to compile, so a bad
    template fails here rather than at the first chat."""
    if isinstance(template, str) and ("{" in template or "\n" in template):
        source, where = template, "chat_template"
    else:
        where = f"chat_template {str(template)!r}"
        try:
            source = Path(template).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(
                f"{where}: not a template (no Jinja syntax in it) and not a readable UTF-8 "
                f"file: {e}"
            ) from e
    try:
        check_chat_template(source)
    except ChatTemplateError as e:
        raise ChatTemplateError(f"{where}: {e}") from e
    return source


def _completion_output(index: int, c: Completion) -> CompletionOutput:
    per_token = None
    if c.logprobs is not None and c.top_logprobs is not None:
        # vLLM's shape: each position's dict holds the top-n and the sampled token.
        per_token = [
            {**top, token: lp}
            for token, lp, top in zip(c.token_ids, c.logprobs, c.top_logprobs, strict=True)
        ]
    return CompletionOutput(
        index,
        c.text,
        c.token_ids,
        c.finish_reason,
        c.cumulative_logprob,
        per_token,
        c.stop_reason,
    )
