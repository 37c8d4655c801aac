"""What flows between the generator thread and a handler: the served model, each step's
output for a request, and the handler's end of a request (an asyncio queue the generator thread
fills)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ingot.runtime.generate import Generator
from ingot.runtime.sampling import SamplingParams
from ingot.runtime.server.protocol import APIError
from ingot.runtime.tokenizer import TextTokenizer

__all__ = ["RequestDelta", "RequestStream", "ServedModel", "TokenLogprob", "put_each_threadsafe"]


@dataclass(slots=True)
class ServedModel:
    """What the server needs of a loaded artifact."""

    generator: Generator
    tokenizer: TextTokenizer
    max_model_len: int
    max_num_seqs: int
    # /tokenize refuses a prompt of more tokens, as completions refuse one over the context;
    # None: max_model_len.
    max_tokenize_tokens: int | None = None

    @property
    def tokenize_limit(self) -> int:
        return self.max_model_len if self.max_tokenize_tokens is None else self.max_tokenize_tokens


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: dict[int, float] | None  # the most likely tokens at this position


@dataclass(slots=True)
class RequestDelta:
    """One request's new tokens and text from one step (a delta, streamed as it comes; the
    offline API's `ingot.llm.RequestOutput` is a whole finished request)."""

    token_ids: list[int]
    text: str  # text those tokens completed (stop strings already cut)
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None  # set on the request's last output only
    num_prompt_tokens: int
    num_output_tokens: int  # so far, including these
    stop_reason: str | int | None = None  # on the last output: the stop string or token id
    # On the last output: of all its sampled tokens, if tracked (Completion.cumulative_logprob).
    cumulative_logprob: float | None = None


class RequestStream:
    """The handler's side of one request: outputs arrive in order, then it is finished."""

    __slots__ = (
        "prompt_ids",
        "params",
        "deadline",
        "priority",
        "arrival",
        "_loop",
        "_queue",
        "_held",
        "finished",
        "closed",
    )

    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        deadline: float | None,
        priority: int = 0,
    ) -> None:
        self.prompt_ids = prompt_ids
        self.params = params
        self.deadline = deadline  # time.monotonic() after which the request is aborted
        self.priority = priority  # the generator's (Generator.add)
        self.arrival = time.monotonic()
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[RequestDelta | APIError] = asyncio.Queue()
        self._held: APIError | None = None  # met by next_batch behind outputs: raised next
        self.finished = False  # the generator is done with it (last output or an error)
        self.closed = False  # the handler let go of it (AsyncLLM.close)

    def put_threadsafe(self, items: list[RequestDelta | APIError]) -> None:
        """Hand items to the handler from the generator thread."""
        self._loop.call_soon_threadsafe(self._put_all, items)

    def _put_all(self, items: list[RequestDelta | APIError]) -> None:
        for item in items:
            self._queue.put_nowait(item)

    async def next(self) -> RequestDelta:
        """The next output; raises the request's APIError, or 408 once its deadline passes."""
        if self._held is not None:
            self.finished = True
            raise self._held
        try:
            if not self._queue.empty() or self.deadline is None:
                item = await self._queue.get()
            else:
                timeout = max(0.0, self.deadline - time.monotonic())
                item = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            raise APIError(
                408,
                "the request exceeded the server's request timeout and was aborted",
                type="timeout_error",
                code="request_timeout",
            ) from None
        if isinstance(item, APIError) or item.finish_reason is not None:
            self.finished = True
        if isinstance(item, APIError):
            raise item
        return item

    async def next_batch(self) -> list[RequestDelta]:
        """The next output and every output already queued behind it, in order: what a
        streaming response writes at once when it wakes (one write, not one per step it
        slept through). An error queued behind outputs is raised by the following call."""
        batch = [await self.next()]
        while not self.finished and not self._queue.empty():
            item = self._queue.get_nowait()
            if isinstance(item, APIError):
                self._held = item
                break
            self.finished = item.finish_reason is not None
            batch.append(item)
        return batch

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestDelta:
        if self.finished:
            raise StopAsyncIteration
        return await self.next()


def put_each_threadsafe(
    deliveries: list[tuple[RequestStream, RequestDelta | APIError]],
) -> list[RequestStream]:
    """Hand one item to each stream from the generator thread, with one wake-up of each event
    loop rather than one per stream: a decode step of 32 streams otherwise writes the loop's
    self-pipe 32 times. Returns the streams whose event loop is gone."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestDelta | APIError]]]
    by_loop = {}
    for stream, item in deliveries:
        by_loop.setdefault(stream._loop, []).append((stream, item))
    gone = []
    for loop, pairs in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_pairs, pairs)
        except RuntimeError:  # the loop is closed
            gone += [stream for stream, _ in pairs]
    return gone


def _put_pairs(pairs: list[tuple[RequestStream, RequestDelta | APIError]]) -> None:
    for stream, item in pairs:
        stream._queue.put_nowait(item)
