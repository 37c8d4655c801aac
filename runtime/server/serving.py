"""/v1/completions and /v1/chat/completions: request -> prompt ids and SamplingParams ->
AsyncLLM -> OpenAI response bodies or server-sent events (runtime/server/formats.py).

A request's choices are its prompts x n: each sample is one generator request
(`sampling.fan_out`, seeds s + i, as LLM.generate), and with best_of > n the n best by
cumulative logprob are returned (`n_best.pick_best`). Tokenizing and chat templates run in a
worker thread (the tokenizer releases the GIL), so a huge prompt does not stall other clients.
A streaming request waits for every sample's first output before the response starts, so an
error that shows only when the generator takes the request (a 400, a 503) still gets its own
status code; after that, errors arrive as an `error` event followed by `[DONE]`, as vLLM sends
them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from fastapi.responses import JSONResponse, Response, StreamingResponse

from ingot.runtime.n_best import pick_best
from ingot.runtime.sampling import InvalidSamplingParams, SamplingParams, fan_out
from ingot.runtime.server.async_llm import AsyncLLM
from ingot.runtime.server.formats import Bodies, ChatBodies, Choice, CompletionBodies
from ingot.runtime.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    Usage,
    model_not_found,
)
from ingot.runtime.server.stream import RequestDelta, RequestStream, ServedModel
from ingot.runtime.structured import StructuredOutput
from ingot.runtime.tokenizer import ChatTemplateError, InvalidText

__all__ = ["Serving"]


@dataclass(slots=True)
class _Prompt:
    ids: list[int]
    text: str  # what echo writes before the output


@dataclass(slots=True)
class _Sample:
    """One generator request of a choice-to-be: its stream, and its deltas once collected."""

    prompt_index: int
    stream: RequestStream
    deltas: list[RequestDelta] = dataclasses.field(default_factory=list)

    @property
    def cumulative_logprob(self) -> float | None:  # set for `ranked` samples
        return self.deltas[-1].cumulative_logprob


class Serving:
    """Turns OpenAI requests into generator requests for one served model."""

    def __init__(self, llm: AsyncLLM, model_name: str) -> None:
        self.llm = llm
        self.model_name = model_name

    async def completions(self, body: CompletionRequest) -> Response:
        model = self._served(body.model)
        _refuse_unsupported(body.unsupported())
        structured = body.structured()
        prompts = [await self._completion_prompt(model, p) for p in body.prompts()]
        bodies = CompletionBodies(self.model_name, model.tokenizer, body.logprobs, **_usage(body))
        params = [
            self._params(model, body, p.ids, body.max_tokens, body.logprobs, structured)
            for p in prompts
        ]
        return await self._respond(body, prompts, params, bodies, echo=body.echo)

    async def chat(self, body: ChatCompletionRequest) -> Response:
        model = self._served(body.model)
        _refuse_unsupported(body.unsupported())
        structured = body.structured()
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        _refuse_too_long(model, "".join(m["content"] for m in messages), "messages")
        try:
            text = await asyncio.to_thread(
                model.tokenizer.apply_chat_template, messages, body.add_generation_prompt
            )
            # Templates write BOS themselves; the post-processor must not add another.
            ids = await asyncio.to_thread(model.tokenizer.encode, text, add_special_tokens=False)
        except (ChatTemplateError, InvalidText) as e:
            raise APIError(400, str(e), param="messages") from e
        num_logprobs = (body.top_logprobs or 0) if body.logprobs else None
        prompts = [_Prompt(ids, text)]
        bodies = ChatBodies(self.model_name, model.tokenizer, num_logprobs, **_usage(body))
        params = [self._params(model, body, ids, body.output_limit(), num_logprobs, structured)]
        return await self._respond(body, prompts, params, bodies, echo=False)

    # -- request -> generator ----------------------------------------------------------

    def _served(self, requested: str | None) -> ServedModel:
        if requested is not None and requested != self.model_name:
            raise model_not_found(requested)
        self.llm.check_admitting()  # 503 loading / draining, 500 failed
        return self.llm.model

    async def _completion_prompt(self, model: ServedModel, prompt: str | list[int]) -> _Prompt:
        tokenizer = model.tokenizer
        try:
            if isinstance(prompt, str):
                _refuse_too_long(model, prompt, "prompt")
                return _Prompt(await asyncio.to_thread(tokenizer.encode, prompt), prompt)
        except InvalidText as e:
            raise APIError(400, str(e), param="prompt") from e
        text = await asyncio.to_thread(tokenizer.decode, prompt, skip_special_tokens=False)
        return _Prompt(list(prompt), text)

    def _params(
        self,
        model: ServedModel,
        body: CompletionRequest | ChatCompletionRequest,
        prompt_ids: list[int],
        max_tokens: int | None,
        num_logprobs: int | None,
        structured: StructuredOutput | None,
    ) -> SamplingParams:
        """The request's SamplingParams: its values are checked there (the Python API's rules),
        and a bad one is a 400 naming the field as the request sent it."""
        if max_tokens is None:  # as vLLM: whatever the context leaves
            max_tokens = max(1, model.max_model_len - len(prompt_ids))
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=body.temperature,
                top_k=body.top_k,
                top_p=body.top_p,
                seed=body.seed,
                stop=body.stop_list(),
                stop_token_ids=list(body.stop_token_ids or []),
                ignore_eos=body.ignore_eos,
                logprobs=num_logprobs,
                n=body.n,
                best_of=body.best_of,
                presence_penalty=body.presence_penalty,
                frequency_penalty=body.frequency_penalty,
                repetition_penalty=body.repetition_penalty,
                logit_bias=body.logit_bias,
                min_tokens=body.min_tokens,
                include_stop_str_in_output=body.include_stop_str_in_output,
                structured=structured,
            )
        except InvalidSamplingParams as e:
            field = body.request_field(e.field)
            raise APIError(400, f"{field} {e.reason}", param=field) from e

    async def _respond(
        self,
        body: CompletionRequest | ChatCompletionRequest,
        prompts: list[_Prompt],
        params: list[SamplingParams],
        bodies: Bodies,
        *,
        echo: bool,
    ) -> Response:
        samples = self._open(prompts, params, body.priority)
        close_all = _closer(self.llm, samples)
        try:
            # Every sample's first output: errors a request gets when it is taken keep
            # their status code.
            for sample in samples:
                sample.deltas.append(await sample.stream.next())
            if not body.stream:
                await asyncio.gather(*(_collect(s) for s in samples))
                close_all()
                return JSONResponse(_full(bodies, prompts, samples, body.n, echo))
        except BaseException:
            close_all()  # a disconnect cancels this handler: abort the requests
            raise
        choices = [
            Choice(i, prefix=prompts[s.prompt_index].text if echo else "")
            for i, s in enumerate(samples)
        ]
        events = _sse(bodies, list(zip(choices, samples, strict=True)), prompts)
        return _ClosingStreamingResponse(events, close_all)

    def _open(
        self, prompts: list[_Prompt], params: list[SamplingParams], priority: int
    ) -> list[_Sample]:
        wanted = sum(p.num_samples for p in params)
        room = self.llm.model.max_num_seqs + self.llm.max_queue
        if wanted > room:  # no retry could admit it: a 400, not a 503
            field = "best_of" if params[0].best_of else "n"
            raise APIError(
                400,
                f"the request asks for {wanted} samples (prompts x {field}); this server runs "
                f"and queues at most {room} at once",
                param=field,
            )
        samples: list[_Sample] = []
        try:
            for index, (prompt, request_params) in enumerate(zip(prompts, params, strict=True)):
                for sample_params in fan_out(request_params):
                    stream = self.llm.open(prompt.ids, sample_params, priority)
                    samples.append(_Sample(index, stream))
        except BaseException:
            _closer(self.llm, samples)()  # all of the request's samples, or none
            raise
        return samples


def _refuse_too_long(model: ServedModel, text: str, param: str) -> None:
    """400 for text that cannot fit the context whatever it tokenizes to, before tokenizing
    it: a 10 MB prompt costs microseconds, not seconds of both cores."""
    fewest = model.tokenizer.fewest_tokens(text)
    if fewest >= model.max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {model.max_model_len} tokens. However, "
            f"the {param} holds {len(text)} characters, at least {fewest} tokens. Please reduce "
            f"the length of the {param}.",
            param=param,
        )


def _refuse_unsupported(problem: tuple[str, str] | None) -> None:
    if problem is not None:
        field, reason = problem
        raise APIError(400, reason, param=field)


def _usage(body: CompletionRequest | ChatCompletionRequest) -> dict[str, bool]:
    options = body.stream_options
    return {
        "include_usage": bool(options and options.include_usage),
        "continuous_usage": bool(options and options.continuous_usage_stats),
    }


def _closer(llm: AsyncLLM, samples: Sequence[_Sample]) -> Callable[[], None]:
    def close_all() -> None:
        for sample in samples:
            llm.close(sample.stream)

    return close_all


async def _collect(sample: _Sample) -> None:
    while not sample.stream.finished:
        sample.deltas.append(await sample.stream.next())


def _full(
    bodies: Bodies, prompts: list[_Prompt], samples: list[_Sample], n: int, echo: bool
) -> dict:
    """The whole response: per prompt, the n samples returned (best_of > n: the n best)."""
    chosen: list[tuple[Choice, list[RequestDelta]]] = []
    for index, prompt in enumerate(prompts):
        best = pick_best([s for s in samples if s.prompt_index == index], n)
        for sample in best:
            choice = Choice(len(chosen), prefix=prompt.text if echo else "")
            chosen.append((choice, sample.deltas))
    prompt_tokens = sum(len(p.ids) for p in prompts)
    output_tokens = sum(deltas[-1].num_output_tokens for _, deltas in chosen)
    return bodies.full(chosen, Usage.of(prompt_tokens, output_tokens))


class _ClosingStreamingResponse(StreamingResponse):
    """Closes its request (AsyncLLM.close) however the response ends (done, disconnect,
    cancel)."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream")
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _sse(
    bodies: Bodies, choices: list[tuple[Choice, _Sample]], prompts: list[_Prompt]
) -> AsyncIterator[str]:
    """Every choice's chunks as its deltas arrive (choices interleave), then the usage.

    Each wake-up yields every delta that has arrived as one string: one write through the ASGI
    stack, not one per step the response slept through. A client's disconnect is the
    StreamingResponse's to see: it stops this generator, and the response's close aborts the
    requests, so no chunk polls for it (starlette's is_disconnected per chunk was ~10% of the
    event loop's busy time at 32 concurrent streams, sampled with py-spy).
    """
    try:
        async for arrived in _arrivals(choices):
            yield "".join(_event(c) for choice, d in arrived for c in bodies.chunks(choice, d))
        if bodies.include_usage:
            prompt_tokens = sum(len(p.ids) for p in prompts)
            output_tokens = sum(s.deltas[-1].num_output_tokens for _, s in choices)
            yield _event(bodies.usage_chunk(Usage.of(prompt_tokens, output_tokens)))
    except APIError as e:
        yield _event(e.body())
    yield "data: [DONE]\n\n"


async def _arrivals(
    choices: list[tuple[Choice, _Sample]],
) -> AsyncIterator[list[tuple[Choice, RequestDelta]]]:
    """(choice, delta) pairs in arrival order, each batch what had arrived when woken, from
    each sample's first delta (already collected) to its last; raises a sample's APIError
    after the deltas before it. One choice reads its stream directly; several are merged
    through a queue their pumps fill."""
    if len(choices) == 1:
        [(choice, sample)] = choices
        yield [(choice, sample.deltas[0])]
        while sample.deltas[-1].finish_reason is None:
            batch = await sample.stream.next_batch()
            sample.deltas += batch
            yield [(choice, d) for d in batch]
        return
    merged: asyncio.Queue[tuple[Choice, RequestDelta] | APIError] = asyncio.Queue()

    async def pump(choice: Choice, sample: _Sample) -> None:
        try:
            merged.put_nowait((choice, sample.deltas[0]))
            while sample.deltas[-1].finish_reason is None:
                batch = await sample.stream.next_batch()
                sample.deltas += batch
                for delta in batch:
                    merged.put_nowait((choice, delta))
        except APIError as e:
            merged.put_nowait(e)

    pumps = [asyncio.ensure_future(pump(choice, sample)) for choice, sample in choices]
    try:
        unfinished = len(choices)
        while unfinished:
            items = [await merged.get()]
            while not merged.empty():
                items.append(merged.get_nowait())
            arrived = []
            for item in items:
                if isinstance(item, APIError):
                    if arrived:
                        yield arrived
                    raise item
                arrived.append(item)
                unfinished -= item[1].finish_reason is not None
            yield arrived
    finally:
        for task in pumps:
            task.cancel()


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"
