"""OpenAI's response bodies for one request: the whole response, or its stream of chunks.

A request's choices are its prompts x n samples (`Choice`); each choice's deltas arrive from
the generator as `RequestDelta`s and are written here as `text_completion` or
`chat.completion(.chunk)` objects, with vLLM's extensions (stop_reason, continuous usage).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ingot.runtime.server.protocol import Usage, random_id
from ingot.runtime.server.stream import RequestDelta, TokenLogprob
from ingot.runtime.tokenizer import TextTokenizer

__all__ = ["Bodies", "ChatBodies", "Choice", "CompletionBodies"]


@dataclass(slots=True)
class Choice:
    """One returned sample of a request, as its response is written."""

    index: int
    prefix: str = ""  # echo: the prompt's text, written before the first output
    text_offset: int = 0  # completions' logprobs: where the next token's text starts
    opened: bool = False  # its first chunk (chat: the role) has been written


class Bodies:
    """The bodies of one request's response (one model name, id and creation time)."""

    object_full: str
    object_chunk: str
    id_prefix: str

    def __init__(
        self,
        model_name: str,
        tokenizer: TextTokenizer,
        num_logprobs: int | None,
        *,
        include_usage: bool = False,
        continuous_usage: bool = False,
    ) -> None:
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.num_logprobs = num_logprobs  # top logprobs per token; None = no logprobs
        self.include_usage = include_usage
        self.continuous_usage = include_usage and continuous_usage
        self.id = random_id(self.id_prefix)
        self.created = int(time.time())

    def envelope(self, obj: str, choices: list[dict], usage: Usage | None) -> dict:
        body = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model_name,
            "choices": choices,
        }
        if usage is not None or (obj == self.object_chunk and self.include_usage):
            body["usage"] = usage.model_dump() if usage is not None else None
        return body

    def full(self, choices: list[tuple[Choice, list[RequestDelta]]], usage: Usage) -> dict:
        """The whole response: every choice's deltas, in choice order."""
        bodies = []
        for choice, deltas in choices:
            last = deltas[-1]
            bodies.append(
                {
                    "index": choice.index,
                    **self.content(choice.prefix + "".join(d.text for d in deltas)),
                    "logprobs": self.logprobs(choice, deltas),
                    "finish_reason": last.finish_reason,
                    "stop_reason": last.stop_reason,
                }
            )
        return self.envelope(self.object_full, bodies, usage)

    def chunks(self, choice: Choice, delta: RequestDelta) -> list[dict]:
        """The chunks one delta of `choice` streams as (possibly none)."""
        raise NotImplementedError

    def usage_chunk(self, usage: Usage) -> dict:
        return self.envelope(self.object_chunk, [], usage)

    def content(self, text: str) -> dict:
        """The whole response's text as its choice carries it."""
        raise NotImplementedError

    def logprobs(self, choice: Choice, deltas: list[RequestDelta]) -> dict | None:
        raise NotImplementedError

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _chunk(
        self, choice_body: dict, delta: RequestDelta, num_output_tokens: int | None = None
    ) -> dict:
        """A chunk of `choice_body`; with continuous usage, the usage so far (`num_output_tokens`
        output tokens, default all of the delta's)."""
        usage = None
        if self.continuous_usage:
            if num_output_tokens is None:
                num_output_tokens = delta.num_output_tokens
            usage = Usage.of(delta.num_prompt_tokens, num_output_tokens)
        return self.envelope(self.object_chunk, [choice_body], usage)


class CompletionBodies(Bodies):
    object_full = "text_completion"
    object_chunk = "text_completion"
    id_prefix = "cmpl"

    def content(self, text: str) -> dict:
        return {"text": text}

    def chunks(self, choice: Choice, delta: RequestDelta) -> list[dict]:
        text = delta.text if choice.opened else choice.prefix + delta.text
        if not text and delta.finish_reason is None and delta.logprobs is None:
            return []  # nothing to show yet (an incomplete character, a held-back stop)
        choice.opened = True
        body = {
            "index": choice.index,
            "text": text,
            "logprobs": self.logprobs(choice, [delta]),
            "finish_reason": delta.finish_reason,
            "stop_reason": delta.stop_reason,
        }
        return [self._chunk(body, delta)]

    def logprobs(self, choice: Choice, deltas: list[RequestDelta]) -> dict | None:
        if self.num_logprobs is None:
            return None
        entries = [lp for d in deltas for lp in d.logprobs or []]
        tokens = [self.token_text(lp.token_id) for lp in entries]
        offsets = []
        for token in tokens:  # offsets run on across the chunks of a stream
            offsets.append(choice.text_offset)
            choice.text_offset += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in entries],
            "top_logprobs": [self._top(lp) for lp in entries],
            "text_offset": offsets,
        }

    def _top(self, lp: TokenLogprob) -> dict[str, float] | None:
        if not self.num_logprobs:
            return None
        return {self.token_text(t): v for t, v in (lp.top or {}).items()}


class ChatBodies(Bodies):
    object_full = "chat.completion"
    object_chunk = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def content(self, text: str) -> dict:
        return {"message": {"role": "assistant", "content": text}}

    def chunks(self, choice: Choice, delta: RequestDelta) -> list[dict]:
        chunks = []
        if not choice.opened:  # OpenAI opens each choice with the role
            choice.opened = True
            # Before any token: as vLLM's, its continuous usage counts no completion tokens.
            role = {"role": "assistant", "content": ""}
            chunks.append(self._delta(choice, role, None, delta, num_output_tokens=0))
        if delta.text or delta.logprobs is not None:
            logprobs = self.logprobs(choice, [delta])
            chunks.append(self._delta(choice, {"content": delta.text}, logprobs, delta))
        if delta.finish_reason is not None:
            chunks.append(self._delta(choice, {}, None, delta, finished=True))
        return chunks

    def _delta(
        self,
        choice: Choice,
        content: dict,
        logprobs: dict | None,
        delta: RequestDelta,
        finished: bool = False,
        num_output_tokens: int | None = None,
    ) -> dict:
        body = {
            "index": choice.index,
            "delta": content,
            "logprobs": logprobs,
            "finish_reason": delta.finish_reason if finished else None,
            "stop_reason": delta.stop_reason if finished else None,
        }
        return self._chunk(body, delta, num_output_tokens)

    def logprobs(self, choice: Choice, deltas: list[RequestDelta]) -> dict | None:
        if self.num_logprobs is None:
            return None
        content = []
        for lp in (lp for d in deltas for lp in d.logprobs or []):
            entry = self._entry(lp.token_id, lp.logprob)
            top = list((lp.top or {}).items())[: self.num_logprobs]
            entry["top_logprobs"] = [self._entry(t, v) for t, v in top]
            content.append(entry)
        return {"content": content}

    def _entry(self, token_id: int, logprob: float) -> dict:
        token = self.token_text(token_id)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}
