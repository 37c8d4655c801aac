"""The generation loop: the scheduler decides each step, the generator runs it and samples.

One step is at most one decode-batch call and a few prefill calls of the engine session, each
of chunks of similar lengths (see scheduler.py for who gets which tokens, and split_prefill).
Each call's new keys and values reach the pool
(the engine writes them itself, or an fp8 engine returns them and they are scattered), full
blocks are offered to the prefix cache, and every sequence whose chunk completed it samples its
next token (its logits through the request's LogitsProcessor first: penalties, logit_bias,
min_tokens, structured output), which is detokenized and checked against its stop conditions.

With speculation (runtime/speculative/), the decode call also verifies drafts: each request's
last token and up to k drafted tokens go in (slots reserved for all of them; k is cut so that
the call, padded to its longest row, fits what the scheduled tokens left of
`max_num_batched_tokens`, and a step with no room does not draft), the logits of
every row come out, and the rows are read in order: row i either accepts draft i+1 (greedy:
it is the argmax; sampled: `sample_verified`, so the output distribution is the target's) or
emits its own token and ends the request's step; a row past every accepted draft emits the
bonus token. The table is cut back to the tokens kept (an engine that writes the pool wrote
every row, the rest beyond the cut; for an fp8 engine only the kept rows are written).

The generator drives the drafter through its interface (speculative/drafter.py) and names
none. A drafter that reads the target's hidden state (`needs_hidden`) is handed each
sequence's row of the call that produced its last token (`record_hidden`: the session's
`hidden`, bound only for such a drafter; a completing chunk's row, or in verification the last
emitted row). A drafter that reads the target's features (`needs_features`) is handed, after
every call, each sequence's rows of the session's `aux_hidden` (bound only for such a drafter)
for the tokens the call keeps: `record_features(seq, start, rows)` with every real row of a
chunk (prefill chunks, complete or not, and plain decode steps: only while a step could draft,
as a draft model's prefill) and, after a verification, the rows of the last token and the
accepted drafts. What a drafter keeps of a sequence (SequenceState.drafter_state) goes when
the request retires; a preemption is passed on (`Drafter.preempted`).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ingot.common.errors import IngotError
from ingot.runtime.batch import Batch, DecodeInputs, LocalLayers, build_inputs
from ingot.runtime.kv_pool import KVPool, OutOfBlocks
from ingot.runtime.logits import LogitsProcessor
from ingot.runtime.outputs import Completion, SchedulerStats, StepOutput
from ingot.runtime.sampling import (
    SamplingParams,
    logsumexp_rows,
    make_rng,
    sample,
    sample_verified,
    token_logprobs,
)
from ingot.runtime.scheduler import Chunk, Scheduler, SequenceState
from ingot.runtime.speculative import DraftState, Speculation
from ingot.runtime.structured import Matcher, ll_tokenizer
from ingot.runtime.tokenizer import IncrementalDecoder, TextTokenizer

if TYPE_CHECKING:
    import llguidance

__all__ = [
    "DEFAULT_MAX_NUM_SEQS",
    "Completion",
    "Generator",
    "GeneratorConfig",
    "RequestError",
    "SchedulerStats",
    "StepOutput",
]


log = logging.getLogger(__name__)

# Requests decoding at once unless set: enough for a burst of 32 clients to share every step
# (vLLM's own default is higher still); the KV cache's automatic size follows it.
DEFAULT_MAX_NUM_SEQS = 64


class RequestError(IngotError, ValueError):
    """A request the generator cannot run: an empty prompt, token ids outside the vocabulary,
    or more tokens than the context holds (the caller's input, a 400 to a server client).
    `param` names the request field at fault, when one is."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelRunner(Protocol):
    """What the loop needs of an engine session (EngineSession, or a fake in tests). With a
    drafter that `needs_hidden`, also `hidden` [N, H]: the last call's rows beside its logits;
    with one that `needs_features`, `aux_hidden` [S*Q, 3Ht]: every row of the last call. A
    runner whose graph writes the pool itself has `scratch_block` (the pool's), and its
    batches are built for that (build_inputs' `scratch_block`)."""

    def run(self, batch: Batch) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """logits [N, V] of the batch's logits_indices rows; per layer new (K, V), none when
        the graph wrote them into the pool."""
        ...


@dataclass(frozen=True, slots=True)
class GeneratorConfig:
    max_seq_len: int  # prompt + output tokens, from the model
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS  # running requests at once
    max_num_batched_tokens: int = 2048  # tokens per step: decodes + the padded prefill chunk
    enable_prefix_caching: bool = True
    vocab_size: int | None = None  # prompt token ids are checked against it when known
    scheduling_policy: str = "fcfs"  # "fcfs" | "priority" (scheduler.SCHEDULING_POLICIES)


@dataclass(slots=True, eq=False)
class _Request:
    seq: SequenceState
    params: SamplingParams
    rng: np.random.Generator
    decoder: IncrementalDecoder
    hold: int  # characters held back: a stop string could be starting there
    processor: LogitsProcessor
    text: str = ""
    streamed: int = 0  # characters of `text` already handed out as deltas
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    # Of the sampled tokens, under the raw logits; None unless tracked: with `logprobs` or
    # when `ranked` (vLLM's: a vocabulary-wide logsumexp per token only where it is asked for).
    cumulative_logprob: float | None = None
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    drafting: DraftState = field(default_factory=DraftState)
    scheduled_at: float | None = None  # time.monotonic() when a step first scheduled it

    @property
    def output_ids(self) -> list[int]:
        return self.seq.token_ids[self.seq.num_prompt_tokens :]


def _freeing_window(window: int | None, speculation: Speculation | None) -> int | None:
    """The window outside which the scheduler gives blocks back: the model's, unless the
    drafter attends past it (an EAGLE-3 draft layer reads every position it holds)."""
    if speculation is not None and not speculation.drafter.windowed:
        return None
    return window


def _local_layers(pool: KVPool, config: GeneratorConfig) -> LocalLayers | None:
    """A pool with local layers (a model mixing local and global layers): their window and
    scratch block for the batches (None: no local layers)."""
    if pool.local_scratch_block is None:
        return None
    if config.sliding_window is None:
        raise ValueError("a pool with local layers needs the model's sliding_window")
    if config.enable_prefix_caching:
        log.info("prefix caching off: the model mixes local and global layers (a first cut)")
    return LocalLayers(config.sliding_window, pool.local_scratch_block)


class Generator:
    """Runs requests to completion over one session and one KV pool (not thread-safe: one
    thread calls every method)."""

    def __init__(
        self,
        session: ModelRunner,
        pool: KVPool,
        tokenizer: TextTokenizer,
        config: GeneratorConfig,
        speculation: Speculation | None = None,
    ) -> None:
        if pool.num_blocks * pool.block_size < config.max_seq_len:
            # Otherwise a lone request could need a block nobody else holds to give back.
            raise ValueError(
                f"the KV pool holds {pool.num_blocks * pool.block_size} tokens, fewer than "
                f"max_seq_len {config.max_seq_len}"
            )
        self.session = session
        self._scratch = getattr(session, "scratch_block", None)  # set: the graph writes the pool
        self.pool = pool
        self.tokenizer = tokenizer
        self.config = config
        self.speculation = speculation
        self.scheduler = Scheduler(
            pool,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.enable_prefix_caching,
            on_preempt=self._preempted,
            policy=config.scheduling_policy,
            sliding_window=_freeing_window(config.sliding_window, speculation),
        )
        # A model mixing local and global layers: the window is the local layers' (their own
        # inputs and pool), the global layers' inputs have none.
        self._local = _local_layers(pool, config)
        self._window = None if self._local is not None else config.sliding_window
        # Plain decode calls: the last one's arrays, advanced in place while the batch holds.
        self._decode_inputs = DecodeInputs(self._window, self._scratch, self._local)
        self._ids = itertools.count()
        self._requests: dict[int, _Request] = {}  # unfinished
        self._finished: dict[int, _Request] = {}  # until popped

    def validate(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Refuse a request that cannot fit the context, in vLLM's words, or whose logit_bias
        names tokens outside the vocabulary (a 400 to a server)."""
        self._check_prompt(prompt_ids)
        self._check_params(params)
        total = len(prompt_ids) + params.max_tokens
        if total > self.config.max_seq_len:
            raise RequestError(
                f"This model's maximum context length is {self.config.max_seq_len} tokens. "
                f"However, you requested {total} tokens ({len(prompt_ids)} in the messages, "
                f"{params.max_tokens} in the completion). Please reduce the length of the "
                "messages or completion."
            )

    def add(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        request_id: int | None = None,
        priority: int = 0,
    ) -> int:
        """Queue a prompt; returns its request id. Generation stops at the context length.

        `priority`: lower is served first under the "priority" scheduling policy, ties by
        arrival; under "fcfs" it is ignored, as vLLM ignores it."""
        prompt_ids = [int(t) for t in prompt_ids]
        self._check_prompt(prompt_ids)
        params = params or SamplingParams()
        self._check_params(params)
        if params.num_samples != 1:
            raise ValueError(
                f"a Generator request is one sample (n={params.n}, best_of={params.best_of}): "
                "add each of sampling.fan_out(params) and pick with n_best.pick_best"
            )
        if request_id is None:
            request_id = next(i for i in self._ids if not self._known(i))
        elif self._known(request_id):
            raise ValueError(f"request id {request_id} is already in use")
        matcher = None
        if params.structured is not None:
            try:
                matcher = Matcher(self._ll_tokenizer(), params.structured)
            except ValueError as e:
                raise RequestError(str(e)) from e
        seq = SequenceState(request_id, prompt_ids, len(prompt_ids), self.pool.new_block_table())
        seq.priority = priority
        self._requests[request_id] = _Request(
            seq=seq,
            params=params,
            rng=make_rng(params.seed),
            decoder=self.tokenizer.incremental_decoder(prompt_ids),
            hold=max(map(len, params.stop), default=1) - 1,
            processor=LogitsProcessor(params, prompt_ids, self.config.eos_token_ids, matcher),
            cumulative_logprob=0.0 if params.logprobs is not None or params.ranked else None,
        )
        self.scheduler.add(seq)
        return request_id

    def abort(self, request_id: int) -> None:
        """Drop a request wherever it is, freeing its blocks (unknown ids are ignored)."""
        req = self._requests.pop(request_id, None)
        if req is not None:
            self.scheduler.abort(req.seq)
        self._finished.pop(request_id, None)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def pop_completion(self, request_id: int) -> Completion:
        """The result of a finished request (each is kept until popped)."""
        req = self._finished.pop(request_id)
        want = req.params.logprobs is not None
        return Completion(
            req.seq.id,
            req.seq.token_ids[: req.seq.num_prompt_tokens],
            req.output_ids,
            req.text,
            req.finish_reason,
            req.logprobs if want else None,
            req.top_logprobs if want else None,
            req.stop_reason,
            req.cumulative_logprob,
            req.scheduled_at,
        )

    def stats(self) -> SchedulerStats:
        scheduler = self.scheduler
        spec = self.speculation.stats if self.speculation is not None else None
        return SchedulerStats(
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            kv_cache_usage=self.pool.allocator.num_used / self.pool.num_blocks,
            num_preemptions=scheduler.num_preemptions,
            prefix_cache_queries=scheduler.prefix_cache_queries,
            prefix_cache_hits=scheduler.prefix_cache_hits,
            num_blocks=self.pool.num_blocks,
            block_size=self.pool.block_size,
            spec_num_drafts=spec.num_drafts if spec else 0,
            spec_num_draft_tokens=spec.num_draft_tokens if spec else 0,
            spec_num_accepted_tokens=spec.num_accepted_tokens if spec else 0,
            spec_accepted_per_position=tuple(spec.accepted_per_position) if spec else (),
        )

    def step(self) -> list[StepOutput]:
        """One scheduled step: a token for every request whose computation completed.

        A step that only advanced a chunked prefill returns no outputs.
        """
        plan = self.scheduler.schedule()
        if not plan:
            if self.has_unfinished():
                raise OutOfBlocks("no request could be scheduled: the KV pool is held elsewhere")
            return []
        now = time.monotonic()
        for chunk in plan.prefill:  # a preempted request's recompute keeps its first time
            req = self._requests[chunk.seq.id]
            req.scheduled_at = now if req.scheduled_at is None else req.scheduled_at
        # Drafts ride in the decode call: they get what the scheduled tokens left of the budget.
        spare = self.scheduler.max_num_batched_tokens - plan.num_batched_tokens
        outputs = self._decode(plan.decode, spare) if plan.decode else []
        for call in plan.prefill_calls:  # chunks of similar lengths together
            outputs += self._run(call, observe=True)
        return outputs

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        priority: int | Sequence[int] = 0,
    ) -> list[Completion]:
        """Run `prompts` (text or token ids) together to completion, in order; `params` and
        `priority` are one for all or one per prompt."""
        per_prompt = params if isinstance(params, Sequence) else [params] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"{len(per_prompt)} sampling params for {len(prompts)} prompts")
        priorities = priority if isinstance(priority, Sequence) else [priority] * len(prompts)
        if len(priorities) != len(prompts):
            raise ValueError(f"{len(priorities)} priorities for {len(prompts)} prompts")
        ids = [
            self.add(self._prompt_ids(p), q, priority=r)
            for p, q, r in zip(prompts, per_prompt, priorities, strict=True)
        ]
        try:
            while any(i in self._requests for i in ids):
                self.step()
        except BaseException:
            for i in ids:
                self.abort(i)
            raise
        return [self.pop_completion(i) for i in ids]

    def stream(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None
    ) -> Iterator[str]:
        """Text deltas of one request as they are decided."""
        rid = self.add(self._prompt_ids(prompt), params)
        try:
            while rid in self._requests:
                for out in self.step():
                    if out.request_id == rid and out.text_delta:
                        yield out.text_delta
        finally:
            self.abort(rid)  # a finished request is only dropped; an abandoned one is freed

    def _known(self, request_id: int) -> bool:
        return request_id in self._requests or request_id in self._finished

    def _check_prompt(self, prompt_ids: Sequence[int]) -> None:
        if not prompt_ids:
            raise RequestError("prompt is empty", param="prompt")
        if len(prompt_ids) >= self.config.max_seq_len:
            raise RequestError(
                f"prompt has {len(prompt_ids)} tokens; max_seq_len {self.config.max_seq_len} "
                "leaves no room to generate"
            )
        vocab = self.config.vocab_size
        bad = None if vocab is None else next((t for t in prompt_ids if not 0 <= t < vocab), None)
        if bad is not None:
            # a token of the tokenizer past the model's vocabulary (added without resizing the
            # embeddings): named, as vLLM refuses it ("Token id N is out of vocabulary")
            token = self.tokenizer.token(bad) if bad >= 0 else None
            named = "" if token is None else f" is {token!r}, a token of the tokenizer, and"
            raise RequestError(
                f"prompt token id {bad}{named} is out of the model's vocabulary: prompt token "
                f"ids must be in [0, {vocab})",
                param="prompt",
            )

    def _check_params(self, params: SamplingParams) -> None:
        vocab = self.config.vocab_size
        if vocab is not None and params.logit_bias:
            bad = sorted(t for t in params.logit_bias if t >= vocab)
            if bad:
                raise RequestError(
                    f"logit_bias token ids must be in [0, {vocab}), got {bad}", param="logit_bias"
                )

    def _ll_tokenizer(self) -> llguidance.LLTokenizer:
        """The tokenizer structured output's matchers read (built once, then cached)."""
        return ll_tokenizer(self.tokenizer, self.config.vocab_size, self.config.eos_token_ids)

    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        return self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)

    def _run(self, chunks: list[Chunk], observe: bool = False) -> list[StepOutput]:
        seqs = [(c.seq.table, c.token_ids, c.start) for c in chunks]
        if all(c.num_tokens == 1 for c in chunks):
            inputs = self._decode_inputs.build(seqs)
        else:
            inputs = build_inputs(
                seqs, self._window, scratch_block=self._scratch, local=self._local
            )
        last, new_kv = self.session.run(inputs)  # [S, V]: each sequence's last new token
        hidden = self.session.hidden if self._needs_hidden else None  # [S, H], as `last`
        soon = self._drafts_soon()
        # [S*Q, 3Ht]: kept only while a step could draft, as a draft model's prefill below.
        features = self.session.aux_hidden if soon and self._needs_features else None
        inputs.write_kv(self.pool, new_kv)
        if observe and soon:
            self.speculation.drafter.observe(inputs, chunks)  # a draft model prefills too
        argmaxes = last.argmax(axis=-1)  # [S]: one vector operation rather than one per row
        outputs = []
        q = inputs.input_ids.shape[1]
        for s, chunk in enumerate(chunks):
            self.scheduler.cache_computed_blocks(chunk.seq)
            if features is not None:  # chunk s's real rows: s*Q .. s*Q + n - 1
                rows = features[s * q : s * q + chunk.num_tokens]
                self.speculation.drafter.record_features(chunk.seq, chunk.start, rows)
            if chunk.completes:  # else a prefill chunk that is not the prompt's last
                if hidden is not None:
                    self.speculation.drafter.record_hidden(chunk.seq, hidden[s])
                req = self._requests[chunk.seq.id]
                outputs.append(self._append(req, last[s], int(argmaxes[s])))
                self._retire_if_finished(req)
        return outputs

    def _decode(self, chunks: list[Chunk], spare: int) -> list[StepOutput]:
        """The decode call: plain, or verifying drafts when this step speculates (within
        `spare` more tokens of the step's budget); with speculation on, the step is timed
        (whether drafting pays is measured, step_rate.py)."""
        spec = self.speculation
        if spec is None:
            return self._run(chunks)
        started = time.perf_counter()
        # The verification call is padded to its longest row: S rows of 1 + k tokens.
        most = (len(chunks) + spare) // len(chunks) - 1
        drafting = most > 0 and spec.step_drafts(len(chunks))
        outputs = self._speculate(chunks, most) if drafting else self._run(chunks)
        spec.rates.record(len(chunks), drafting, len(outputs), time.perf_counter() - started)
        return outputs

    def _speculate(self, chunks: list[Chunk], most: int) -> list[StepOutput]:
        """Draft up to `most` tokens for every request that may, then verify (a plain call if
        none drafted)."""
        spec = self.speculation
        assert spec is not None
        reqs = [self._requests[c.seq.id] for c in chunks]
        ks = [
            self._reserve_drafts(req, min(most, spec.policy.num_drafts(req.drafting)))
            for req in reqs
        ]
        drafts = spec.drafter.propose([r.seq for r in reqs], ks)
        for chunk, k, draft in zip(chunks, ks, drafts, strict=True):
            if len(draft) < k:  # slots reserved for drafts that did not come
                chunk.seq.table.truncate(chunk.start + 1 + len(draft))
        if not any(drafts):
            return self._run(chunks)
        return self._verify(chunks, drafts)

    def _reserve_drafts(self, req: _Request, k: int) -> int:
        """Reserve pool slots for up to `k` drafts after `req`'s last token; how many it got.

        No more than the request can still emit (max_tokens, the context) nor than the pool
        has free: drafts never preempt anybody.
        """
        seq = req.seq
        num_out = len(seq.token_ids) - seq.num_prompt_tokens
        # A step emits at most k + 1 tokens; the last drafted position must be in context.
        room = self.config.max_seq_len - len(seq.token_ids)
        k = min(k, req.params.max_tokens - num_out - 1, room, self.scheduler.capacity(seq))
        if k > 0:
            seq.table.reserve(k)
        return max(k, 0)

    def _verify(self, chunks: list[Chunk], drafts: list[list[int]]) -> list[StepOutput]:
        """One call over every request's last token and its drafts; see the module docstring."""
        spec = self.speculation
        assert spec is not None
        seqs = [
            (c.seq.table, [c.token_ids[0], *d], c.start)
            for c, d in zip(chunks, drafts, strict=True)
        ]
        inputs = build_inputs(
            seqs, self._window, all_logits=True, scratch_block=self._scratch, local=self._local
        )
        logits, new_kv = self.session.run(inputs)  # [T, V]: every real token, in order
        hidden = self.session.hidden if self._needs_hidden else None  # [T, H], as `logits`
        features = self.session.aux_hidden if self._needs_features else None  # [S*Q, 3Ht]
        argmaxes = logits.argmax(axis=-1)  # [T]
        outputs: list[StepOutput] = []
        kept: list[int] = []  # tokens (rows of `logits`) whose K/V go into the pool
        num_kept: list[int] = []
        row = 0
        for chunk, draft in zip(chunks, drafts, strict=True):
            req = self._requests[chunk.seq.id]
            accepted = 0
            for i in range(len(draft) + 1):
                proposal = draft[i] if i < len(draft) else None
                r = row + i
                out = self._append(req, logits[r], int(argmaxes[r]), proposal)
                outputs.append(out)
                if out.finished or proposal is None or out.token != proposal:
                    break
                accepted += 1
            if hidden is not None:  # the loop's last row produced the last token appended
                spec.drafter.record_hidden(chunk.seq, hidden[r])
            if draft:
                spec.stats.record(len(draft), accepted)
                spec.policy.update(req.drafting, len(draft), accepted)
            kept.extend(range(row, row + 1 + accepted))  # its last token and accepted drafts
            num_kept.append(1 + accepted)
            row += 1 + len(draft)
        inputs.write_kv_of(self.pool, new_kv, np.asarray(kept, dtype=np.int64))
        q = inputs.input_ids.shape[1]
        for s, (chunk, n) in enumerate(zip(chunks, num_kept, strict=True)):
            seq = chunk.seq
            seq.table.truncate(chunk.start + n)  # rejected drafts' slots go back
            if features is not None:  # the kept rows: its last token and accepted drafts
                spec.drafter.record_features(seq, chunk.start, features[s * q : s * q + n])
            spec.drafter.accepted(seq)
            self.scheduler.cache_computed_blocks(seq)
            self._retire_if_finished(self._requests[seq.id])
        return outputs

    def _drafts_soon(self) -> bool:
        """Whether a draft model should compute this prefill too: not while more requests run
        than drafting allows (`disable_by_batch_size`), when no step would use its K/V; it
        catches up on the tokens it missed when drafting resumes (draft_model.py). At 32
        requests that prefill cost 10% of throughput with no draft ever proposed
        (benchmarks/results/speculative.md before this)."""
        spec = self.speculation
        return spec is not None and spec.policy.step_drafts(len(self.scheduler.running))

    @property
    def _needs_hidden(self) -> bool:
        """Whether the drafter reads the target's hidden state (the session must bind it)."""
        spec = self.speculation
        return spec is not None and spec.drafter.needs_hidden

    @property
    def _needs_features(self) -> bool:
        """Whether the drafter reads the target's aux_hidden rows (the session must bind it)."""
        spec = self.speculation
        return spec is not None and spec.drafter.needs_features

    def _preempted(self, seq: SequenceState) -> None:
        """The scheduler preempted `seq` (its blocks went back): the drafter hears of it."""
        if self.speculation is not None:
            self.speculation.drafter.preempted(seq)

    def _retire_if_finished(self, req: _Request) -> None:
        """A finished request's blocks go back, with what the drafter kept of it, and its
        completion waits to be popped."""
        if req.finish_reason is not None and req.seq.id in self._requests:
            self.scheduler.finish(req.seq)
            req.seq.drafter_state = None
            self._finished[req.seq.id] = self._requests.pop(req.seq.id)

    def _append(
        self,
        req: _Request,
        logits: np.ndarray,
        argmax: int,
        draft: int | None = None,
    ) -> StepOutput:
        """Sample `req`'s next token from its logits [V] (whose argmax is given)
        and check its stop conditions. With a `draft` in that place, the token is drawn by
        `sample_verified`: the draft itself if it is accepted. The caller retires a finished
        request (after writing its K/V)."""
        params = req.params
        if params.temperature == 0 and not req.processor.active:
            token = argmax  # greedy on the raw logits: what sample() would return
        elif draft is not None:
            token = sample_verified(req.processor.process(logits), params, req.rng, draft)
        else:
            token = sample(req.processor.process(logits), params, req.rng)
        logprob = top = None
        if params.logprobs is not None:
            logprob, top = token_logprobs(logits, token, params.logprobs)
            req.logprobs.append(logprob)
            req.top_logprobs.append(top)
            req.cumulative_logprob += logprob
        elif req.cumulative_logprob is not None:  # ranked: the token's logprob only
            req.cumulative_logprob += float(logits[token] - logsumexp_rows(logits[None])[0])
        req.seq.token_ids.append(token)
        req.processor.accept(token)
        num_out = len(req.seq.token_ids) - req.seq.num_prompt_tokens

        eos = not params.ignore_eos and token in self.config.eos_token_ids
        if eos or token in params.stop_token_ids:
            # The stop token stays in token_ids but not in the text (min_tokens masked these
            # unless a grammar could only end here).
            reason = "stop"
            req.stop_reason = None if eos else token
        else:
            reason = None
            delta = req.decoder.step(token)
            if req.processor.is_finished:
                reason = "stop"  # the structured output is complete
            elif num_out >= params.max_tokens or len(req.seq.token_ids) >= self.config.max_seq_len:
                reason = "length"
            if reason is not None:
                delta += req.decoder.flush()
            stop = self._append_text(req, delta, stops=num_out >= params.min_tokens)
            if stop is not None:
                reason, req.stop_reason = "stop", stop

        # Hand out the text no stop string can still claim.
        end = max(req.streamed, len(req.text) - (0 if reason else req.hold))
        text_delta, req.streamed = req.text[req.streamed : end], end
        if reason is not None:
            req.finish_reason = reason
        return StepOutput(
            req.seq.id,
            token,
            reason is not None,
            reason,
            text_delta,
            logprob,
            top,
            req.stop_reason,
        )

    def _append_text(self, req: _Request, delta: str, stops: bool = True) -> str | None:
        """Add `delta` to the text; if it completed a stop string (and `stops`: min_tokens is
        reached), cut the text before it (after it with include_stop_str_in_output) and return
        the stop string."""
        stop_strings = req.params.stop
        if not delta or not stop_strings or not stops:
            req.text += delta
            return None
        # Only a match that ends inside the delta is new: search from where one could begin.
        begin = max(0, len(req.text) - max(map(len, stop_strings)) + 1)
        req.text += delta
        hits = [(i, s) for s in stop_strings if (i := req.text.find(s, begin)) >= 0]
        if not hits:
            return None
        index, stop = min(hits, key=lambda hit: hit[0])  # the first to start; list order on ties
        if req.params.include_stop_str_in_output:
            index += len(stop)
        req.text = req.text[:index]
        return stop
