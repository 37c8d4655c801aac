"""The minimal iteration-level generation loop (a scheduler will replace `step`).

Each step makes at most one decode-batch call (every running request feeds its last token)
and one prefill call (waiting prompts admitted together, up to a token budget). Blocks are
allocated per step as sequences grow; when the pool runs dry the newest running request is
preempted (its blocks released) and later recomputed from its prompt and output so far.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from ingot.runtime.batch import build_inputs
from ingot.runtime.kv_pool import BlockTable, KVPool, OutOfBlocks
from ingot.runtime.sampling import SamplingParams, make_rng, sample
from ingot.runtime.tokenizer import IncrementalDecoder, TextTokenizer

__all__ = ["Completion", "Generator", "GeneratorConfig", "StepOutput"]


class ModelRunner(Protocol):
    """What the loop needs of an engine session (EngineSession, or a fake in tests)."""

    def run(
        self,
        input_ids: np.ndarray,
        positions: np.ndarray,
        block_tables: np.ndarray,
        context_lens: np.ndarray,
        attention_mask: np.ndarray,
    ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]: ...


@dataclass(frozen=True, slots=True)
class GeneratorConfig:
    max_seq_len: int  # prompt + output tokens, from the model
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None
    max_num_seqs: int = 16  # running requests at once
    max_num_batched_tokens: int = 2048  # padded prefill tokens per step (one prompt always fits)


@dataclass(slots=True)
class Completion:
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length"


class StepOutput(NamedTuple):
    request_id: int
    token: int
    finished: bool
    finish_reason: str | None


@dataclass(slots=True, eq=False)  # identity: two requests are never "equal"
class _Request:
    id: int
    prompt_ids: list[int]
    params: SamplingParams
    rng: np.random.Generator
    table: BlockTable
    decoder: IncrementalDecoder
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    streamed: int = 0  # characters of `text` already handed to a stream
    finish_reason: str | None = None


class Generator:
    """Runs requests to completion over one session and one KV pool."""

    def __init__(
        self, session: ModelRunner, pool: KVPool, tokenizer: TextTokenizer, config: GeneratorConfig
    ) -> None:
        if pool.num_blocks * pool.block_size < config.max_seq_len:
            # Otherwise a lone request could need a block nobody else holds to give back.
            raise ValueError(
                f"the KV pool holds {pool.num_blocks * pool.block_size} tokens, fewer than "
                f"max_seq_len {config.max_seq_len}"
            )
        self.session = session
        self.pool = pool
        self.tokenizer = tokenizer
        self.config = config
        self._ids = itertools.count()
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []  # in admission order; the last is preempted first
        self._finished: dict[int, _Request] = {}

    def add(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> int:
        """Queue a prompt; returns its request id."""
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("prompt is empty")
        if len(prompt_ids) >= self.config.max_seq_len:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens; max_seq_len {self.config.max_seq_len} "
                "leaves no room to generate"
            )
        params = params or SamplingParams()
        req = _Request(
            id=next(self._ids),
            prompt_ids=prompt_ids,
            params=params,
            rng=make_rng(params.seed),
            table=self.pool.new_block_table(),
            decoder=self.tokenizer.incremental_decoder(prompt_ids),
        )
        self._waiting.append(req)
        return req.id

    def abort(self, request_id: int) -> None:
        """Drop a request wherever it is, freeing its blocks."""
        for req in [*self._waiting, *self._running]:
            if req.id == request_id:
                req.table.release()
                if req in self._running:
                    self._running.remove(req)
                else:
                    self._waiting.remove(req)
        self._finished.pop(request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def pop_completion(self, request_id: int) -> Completion:
        """The result of a finished request (each is kept until popped)."""
        req = self._finished.pop(request_id)
        return Completion(req.id, req.prompt_ids, req.output_ids, req.text, req.finish_reason)

    def step(self) -> list[StepOutput]:
        """One decode-batch call for running requests, one prefill call for waiting ones."""
        outputs = self._decode() if self._running else []
        if self._waiting and len(self._running) < self.config.max_num_seqs:
            outputs += self._prefill()
        if not outputs and self.has_unfinished():
            raise OutOfBlocks("no request could be scheduled: the KV pool is held elsewhere")
        return outputs

    def generate(
        self, prompts: Sequence[str] | Sequence[Sequence[int]], params: SamplingParams | None = None
    ) -> list[Completion]:
        """Run `prompts` (text or token ids) together to completion, in order."""
        ids = [self.add(self._prompt_ids(p), params) for p in prompts]
        while any(i not in self._finished for i in ids):
            self.step()
        return [self.pop_completion(i) for i in ids]

    def stream(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None
    ) -> Iterator[str]:
        """Text deltas of one request as they are generated."""
        rid = self.add(self._prompt_ids(prompt), params)
        req = self._find(rid)
        try:
            while req.finish_reason is None:
                self.step()
                # Hold back what could be the start of a stop string until it is decided.
                hold = 0 if req.finish_reason else max(map(len, req.params.stop), default=1) - 1
                end = max(req.streamed, len(req.text) - hold)
                if end > req.streamed:
                    yield req.text[req.streamed : end]
                    req.streamed = end
        finally:
            self.abort(rid)  # a finished request is only dropped; an abandoned one is freed

    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        return self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)

    def _find(self, request_id: int) -> _Request:
        return next(r for r in [*self._waiting, *self._running] if r.id == request_id)

    def _decode(self) -> list[StepOutput]:
        batch = []  # (request, new token ids, start position)
        for req in list(self._running):
            if req not in self._running:  # preempted below to make room for an earlier one
                continue
            start = req.table.num_tokens
            # Make room by preempting the newest requests, possibly this one itself.
            while req in self._running and not self._try_allocate(req, 1):
                self._preempt(self._running[-1])
            if req in self._running:
                batch.append((req, [req.output_ids[-1]], start))
        return self._run(batch) if batch else []

    def _prefill(self) -> list[StepOutput]:
        batch = []
        longest = 0
        while self._waiting and len(self._running) + len(batch) < self.config.max_num_seqs:
            req = self._waiting[0]
            ids = req.prompt_ids + req.output_ids  # output too when recomputing a preempted one
            longest_if_added = max(longest, len(ids))
            padded = (len(batch) + 1) * longest_if_added
            if batch and padded > self.config.max_num_batched_tokens:
                break
            if not self._try_allocate(req, len(ids)):
                break  # wait for running requests to finish and free blocks
            self._waiting.popleft()
            batch.append((req, ids, 0))
            longest = longest_if_added
        self._running += [req for req, _, _ in batch]
        return self._run(batch) if batch else []

    def _try_allocate(self, req: _Request, n_new: int) -> bool:
        try:
            req.table.slots_for(n_new)
        except OutOfBlocks:
            return False
        return True

    def _preempt(self, req: _Request) -> None:
        if len(self._running) == 1:  # __init__ guarantees a lone request always fits
            raise OutOfBlocks("a single request does not fit in the KV pool")
        req.table.release()
        self._running.remove(req)
        self._waiting.appendleft(req)

    def _run(self, batch: list[tuple[_Request, list[int], int]]) -> list[StepOutput]:
        seqs = [(req.table, ids, start) for req, ids, start in batch]
        inputs = build_inputs(seqs, self.config.sliding_window)
        logits, new_kv = self.session.run(
            inputs.input_ids,
            inputs.positions,
            inputs.block_tables,
            inputs.context_lens,
            inputs.attention_mask,
        )
        inputs.write_kv(self.pool, new_kv)
        last = inputs.last_logits(logits)  # [S, V]
        tokens = [sample(last[s], req.params, req.rng) for s, (req, _, _) in enumerate(batch)]
        return [self._append(req, token) for (req, _, _), token in zip(batch, tokens, strict=True)]

    def _append(self, req: _Request, token: int) -> StepOutput:
        req.output_ids.append(token)
        params = req.params
        eos = not params.ignore_eos and token in self.config.eos_token_ids
        if eos or token in params.stop_token_ids:
            reason = "stop"  # the stop token stays in token_ids but not in the text
        else:
            reason = None
            delta = req.decoder.step(token)
            total = len(req.prompt_ids) + len(req.output_ids)
            if len(req.output_ids) >= params.max_tokens or total >= self.config.max_seq_len:
                reason = "length"
                delta += req.decoder.flush()
            if self._append_text(req, delta):
                reason = "stop"
        if reason is not None:
            self._finish(req, reason)
        return StepOutput(req.id, token, reason is not None, reason)

    def _append_text(self, req: _Request, delta: str) -> bool:
        """Add `delta` to the text; True if it completed a stop string (text cut before it)."""
        stops = req.params.stop
        if not delta or not stops:
            req.text += delta
            return False
        # Only a match that ends inside the delta is new: search from where one could begin.
        begin = max(0, len(req.text) - max(map(len, stops)) + 1)
        req.text += delta
        hits = [i for i in (req.text.find(s, begin) for s in stops) if i >= 0]
        if not hits:
            return False
        req.text = req.text[: min(hits)]
        return True

    def _finish(self, req: _Request, reason: str) -> None:
        req.finish_reason = reason
        req.table.release()
        self._running.remove(req)
        self._finished[req.id] = req
