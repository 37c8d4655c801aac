"""AsyncLLM: one thread owns the Generator; HTTP handlers talk to it through queues.

Handlers run on an asyncio event loop and must never block it, while `Generator.step()` runs
for milliseconds at a time and is not thread-safe. So one background thread owns the
generator: requests reach it through a locked inbox (add / abort), it steps while there is
work and sleeps on a condition when there is none, and each step's outputs go back to the
request's `asyncio.Queue` through `loop.call_soon_threadsafe`.

    llm = AsyncLLM(load_model, metrics)               # load runs in the generator thread
    llm.start()
    stream = llm.open(prompt_ids, params)             # 503 when full, loading or draining
    try:
        async for output in stream: ...
    finally:
        llm.close(stream)                             # aborts it unless it finished
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass

from ingot.runtime.generate import Generator, SchedulerStats, StepOutput
from ingot.runtime.sampling import SamplingParams
from ingot.runtime.server.metrics import Metrics
from ingot.runtime.server.protocol import APIError
from ingot.runtime.server.stream import (
    RequestDelta,
    RequestStream,
    ServedModel,
    TokenLogprob,
    put_each_threadsafe,
)

__all__ = ["AsyncLLM"]

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # what a full server asks clients to wait before retrying


@dataclass(slots=True, eq=False)
class _Live:
    """Generator-thread bookkeeping of one admitted request."""

    stream: RequestStream
    gen_id: int
    text: str = ""  # streamed so far
    num_output: int = 0
    first_token_time: float = 0.0
    last_token_time: float = 0.0


class AsyncLLM:
    """Runs a Generator in a background thread (the generator thread) and serves requests
    from asyncio handlers: vLLM's AsyncLLM, with the loop in a thread rather than a process."""

    def __init__(
        self,
        load: Callable[[], ServedModel],
        metrics: Metrics,
        *,
        max_queue: int = 64,
        request_timeout: float | None = None,
        on_load_failure: Callable[[BaseException], None] | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        """`on_load_failure(error)`, if given, is called from the generator thread when loading
        fails (and the traceback is not logged: the owner reports it, e.g. by stopping the
        server and exiting); without it the failure is logged and /health stays 503.
        `on_ready()`, if given, is called from the generator thread once the model is loaded
        and warmed up, before requests are admitted."""
        self._load = load
        self.metrics = metrics
        self.max_queue = max_queue
        self.request_timeout = request_timeout
        self.model: ServedModel | None = None  # set once loaded and warmed up
        self.stats: SchedulerStats | None = None  # the last snapshot
        self.error: str | None = None  # why the generator thread is dead, if it is
        self.load_error: BaseException | None = None  # what loading raised, if it failed
        self.on_load_failure = on_load_failure
        self.on_ready = on_ready
        self.draining = False
        self._cond = threading.Condition()
        self._inbox: list[tuple[str, RequestStream]] = []
        self._stopping = False
        self._closed = False  # the loop has ended: nothing queued now would ever run
        self._drain_deadline: float | None = None  # then requests still running are aborted
        self._thread: threading.Thread | None = None
        self._num_open = 0  # admitted and not yet closed
        self._live: dict[RequestStream, _Live] = {}  # generator thread only

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ingot-generator", daemon=True)
            self._thread.start()

    @property
    def ready(self) -> bool:
        return self.model is not None and self.error is None and not self.draining

    def begin_drain(self, grace: float | None = None) -> None:
        """Admit nothing new (503); requests already in run on, for `grace` seconds if given,
        after which they end with a 503."""
        self.draining = True
        if grace is not None:
            with self._cond:
                self._drain_deadline = time.monotonic() + grace
                self._cond.notify()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Abort whatever still runs and stop the thread."""
        with self._cond:
            self.draining = True
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def num_open(self) -> int:
        return self._num_open

    # -- handler side (event loop) ---------------------------------------------------------

    def check_admitting(self) -> None:
        """Raise the APIError a new request would get now: 500 dead, 503 loading / draining."""
        if self.error is not None:
            raise APIError(500, f"the server failed: {self.error}", type="server_error")
        if self.draining or self.model is None:
            reason = "shutting down" if self.draining else "loading the model"
            raise _unavailable(f"the server is {reason}")

    def open(
        self, prompt_ids: Sequence[int], params: SamplingParams, priority: int = 0
    ) -> RequestStream:
        """Admit a request, or raise APIError (503 full / loading / draining, 500 dead);
        `priority` orders it under the "priority" scheduling policy (Generator.add)."""
        with self._cond:  # the same lock the loop takes to end, so no request is left behind
            self.check_admitting()
            if self._closed:
                raise _unavailable("the server is shutting down")
            if self._num_open >= self.model.max_num_seqs + self.max_queue:
                raise _unavailable(
                    f"the server is at capacity ({self.model.max_num_seqs} running and "
                    f"{self.max_queue} queued requests); retry later"
                )
            self._num_open += 1
            deadline = None
            if self.request_timeout is not None:
                deadline = time.monotonic() + self.request_timeout
            stream = RequestStream(list(prompt_ids), params, deadline, priority)
            self._inbox.append(("add", stream))
            self._cond.notify()
        return stream

    def close(self, stream: RequestStream) -> None:
        """Release the request's slot, aborting it (freeing its blocks) unless it finished.

        Idempotent; handlers call it in `finally`, so a disconnect, a deadline or a cancelled
        task all end here.
        """
        with self._cond:
            if stream.closed:
                return
            if not stream.finished:
                self._inbox.append(("abort", stream))
                self._cond.notify()
            stream.closed = True
            self._num_open -= 1

    # -- generator thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            model = self._load()
            _warm_up(model)
            self._publish_stats(model.generator)
        except Exception as e:  # noqa: BLE001 - reported by /health and every request
            self.error = f"{type(e).__name__}: {e}"
            self.load_error = e
            if self.on_load_failure is None:
                log.exception("loading the model failed")
            else:
                self.on_load_failure(e)
            return
        self.metrics.bind_model(model.max_model_len)
        if self.on_ready is not None:
            self.on_ready()
        self.model = model
        log.info("model loaded and warmed up; ready")
        generator = model.generator
        while True:
            with self._cond:
                while not self._inbox and not generator.has_unfinished() and not self._stopping:
                    self._cond.wait()
                commands, self._inbox = self._inbox, []
                stopping = self._stopping
            for kind, stream in commands:
                if kind == "add":
                    self._add(generator, stream)
                else:
                    self._abort(generator, stream)
            if stopping:
                self._end(generator, _unavailable("the server shut down"))
                return
            if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline:
                self._fail_all(generator, _unavailable("the server shut down before it finished"))
            if generator.has_unfinished():
                try:
                    outputs = generator.step()
                except Exception as e:  # noqa: BLE001 - fail everyone loudly rather than hang
                    log.exception("generator step failed; failing every in-flight request")
                    reason = f"{type(e).__name__}: {e}"
                    self._end(generator, APIError(500, reason, type="server_error"), reason)
                    return
                self._dispatch(generator, outputs)
            self._publish_stats(generator)

    def _add(self, generator: Generator, stream: RequestStream) -> None:
        try:
            generator.validate(stream.prompt_ids, stream.params)  # context length, vLLM's words
            gen_id = generator.add(stream.prompt_ids, stream.params, priority=stream.priority)
        except ValueError as e:
            stream.put_threadsafe([APIError(400, str(e), param=getattr(e, "param", None))])
            return
        except Exception as e:  # noqa: BLE001 - one bad request must not stop the thread
            log.exception("adding a request failed")
            stream.put_threadsafe([APIError(500, f"{type(e).__name__}: {e}", type="server_error")])
            return
        self._live[stream] = _Live(stream, gen_id)

    def _abort(self, generator: Generator, stream: RequestStream) -> None:
        live = self._live.pop(stream, None)
        if live is not None:
            generator.abort(live.gen_id)
            self.metrics.request_finished("abort")

    def _end(self, generator: Generator, error: APIError, reason: str | None = None) -> None:
        """Leave the loop: admit nothing more; fail what runs and what is still queued."""
        with self._cond:
            if reason is not None:
                self.error = reason
            self._closed = True
            queued = [stream for kind, stream in self._inbox if kind == "add"]
            self._inbox = []
        self._fail_all(generator, error)
        for stream in queued:
            stream.put_threadsafe([error])

    def _fail_all(self, generator: Generator, error: APIError) -> None:
        for live in list(self._live.values()):
            with suppress(Exception):  # the generator is already broken: free what we can
                generator.abort(live.gen_id)
            live.stream.put_threadsafe([error])
        self._live.clear()

    def _dispatch(self, generator: Generator, outputs: list[StepOutput]) -> None:
        by_id = {live.gen_id: live for live in self._live.values()}
        grouped: dict[int, list[StepOutput]] = {}
        for out in outputs:
            grouped.setdefault(out.request_id, []).append(out)
        now = time.monotonic()
        deliveries = []
        step_tokens = 0  # vLLM's count: sampled tokens, plus the prompts that got their first
        for gen_id, outs in grouped.items():
            live = by_id.get(gen_id)
            if live is None:  # aborted while its step ran
                continue
            step_tokens += len(outs) + (len(live.stream.prompt_ids) if live.num_output == 0 else 0)
            item = self._to_delta(generator, live, outs, now)
            if item.finish_reason is not None:
                del self._live[live.stream]
            deliveries.append((live.stream, item))
        if step_tokens:
            self.metrics.iteration_tokens.observe(step_tokens)
        for stream in put_each_threadsafe(deliveries):  # their handlers' event loop is gone
            self._abort(generator, stream)

    def _to_delta(
        self, generator: Generator, live: _Live, outs: list[StepOutput], now: float
    ) -> RequestDelta:
        m = self.metrics
        stream = live.stream
        if live.num_output == 0:
            m.time_to_first_token.observe(now - stream.arrival)
            m.prompt_tokens.inc(len(stream.prompt_ids))
            live.first_token_time = now
        else:
            m.time_per_output_token.observe(now - live.last_token_time)
            m.inter_token_latency.observe(now - live.last_token_time)
        live.last_token_time = now
        live.num_output += len(outs)
        m.generation_tokens.inc(len(outs))
        finish_reason = outs[-1].finish_reason if outs[-1].finished else None
        if finish_reason is not None:
            m.request_finished(finish_reason)
            # The completion's text is authoritative (stop strings cut, held-back text flushed).
            completion = generator.pop_completion(live.gen_id)
            m.observe_finished(
                arrival=stream.arrival,
                scheduled=completion.scheduled_at,
                first_token=live.first_token_time,
                finished=now,
                num_prompt_tokens=len(stream.prompt_ids),
                num_generation_tokens=live.num_output,
            )
            text = completion.text[len(live.text) :]
        else:
            text = "".join(out.text_delta for out in outs)
        live.text += text
        logprobs = None
        if stream.params.logprobs is not None:
            logprobs = [TokenLogprob(o.token, o.logprob, o.top_logprobs) for o in outs]
        return RequestDelta(
            token_ids=[o.token for o in outs],
            text=text,
            logprobs=logprobs,
            finish_reason=finish_reason,
            num_prompt_tokens=len(stream.prompt_ids),
            num_output_tokens=live.num_output,
            stop_reason=None if finish_reason is None else completion.stop_reason,
            cumulative_logprob=None if finish_reason is None else completion.cumulative_logprob,
        )

    def _publish_stats(self, generator: Generator) -> None:
        stats = generator.stats()
        self.stats = stats
        self.metrics.observe_stats(stats)


def _unavailable(message: str) -> APIError:
    return APIError(
        503,
        message,
        type="service_unavailable",
        code="service_unavailable",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def _warm_up(model: ServedModel) -> None:
    """One short greedy generation: the first session run allocates and initializes kernels."""
    prompt = model.tokenizer.encode("Hello") or [0]
    model.generator.generate([prompt], SamplingParams(max_tokens=2, temperature=0.0))
