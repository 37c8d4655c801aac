"""Where a decode step's time goes: one run of the prompts with the target's and the drafter's
calls timed (the speculative benchmark's step breakdown, in its worker)."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["breakdown"]


class _StepTimes:
    """One decode step's seconds (and number of calls) per timed part, and the tokens per
    sequence and seconds of each of its target calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.target: list[tuple[int, float]] = []

    def clear(self) -> None:
        self.seconds.clear()
        self.target.clear()


class _Timed:
    """`inner` with the named methods timed into `times` under `name`."""

    def __init__(self, inner: Any, name: str, methods: tuple[str, ...], times: _StepTimes) -> None:
        self._inner, self._name, self._methods, self._times = inner, name, methods, times

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._inner, attr)
        if attr not in self._methods:
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                self._times.seconds[self._name] += elapsed
                self._times.seconds[f"{self._name} calls"] += 1
                if self._name == "target":
                    self._times.target.append((int(args[0].input_ids.shape[1]), elapsed))

        return timed


@contextmanager
def _instrumented(gen: Any, times: _StepTimes) -> Iterator[None]:
    """The generator's target session, its drafter and the drafter's own engines timed into
    `times` while the block runs, as they were after it."""
    session, spec = gen.session, gen.speculation
    drafter = spec.drafter if spec is not None else None
    # The drafter's own engines, as (holder, attribute): a draft model's session, the graph of
    # Medusa's heads, or the EAGLE draft's layer and fc sessions (held by its `draft`).
    holders = [drafter, getattr(drafter, "draft", None)] if drafter is not None else []
    engines = [
        (holder, attr, getattr(holder, attr))
        for holder in holders
        for attr in ("session", "heads", "layer", "fc")
        if holder is not None and hasattr(holder, attr)
    ]
    gen.session = _Timed(session, "target", ("run",), times)
    if drafter is not None:  # `record`: the EAGLE drafter keeps the target's features rows
        methods = ("propose", "observe", "accepted", "record")
        spec.drafter = _Timed(drafter, "drafter", methods, times)
    for holder, attr, engine in engines:
        setattr(holder, attr, _Timed(engine, "draft_engine", ("run",), times))
    try:
        yield
    finally:
        gen.session = session
        if drafter is not None:
            spec.drafter = drafter
        for holder, attr, engine in engines:
            setattr(holder, attr, engine)


def breakdown(gen: Any, prompts: list[list[int]], params: Any) -> dict[str, Any]:
    """One run of the prompts with the target's and the drafter's calls timed: per decode
    step (each prompt's prefill step left out), ms in the target engine's call, in the
    drafter (its engines' calls apart: a draft model's session, Medusa's heads graph, the
    EAGLE draft layer's and fc's sessions) and in the rest of the runtime (scheduling, inputs,
    sampling, K/V writes, acceptance); the target call's ms by tokens per sequence."""
    times = _StepTimes()
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, float] = defaultdict(float)
    by_q: dict[int, list[float]] = defaultdict(list)
    steps, wall = 0, 0.0
    with _instrumented(gen, times):
        for prompt in prompts:
            rid = gen.add(prompt, params)
            prefill = True
            while gen.has_unfinished():
                times.clear()
                started = time.perf_counter()
                gen.step()
                elapsed = time.perf_counter() - started
                if prefill:  # a prompt's first step is its prefill, not a decode step
                    prefill = False
                    continue
                steps, wall = steps + 1, wall + elapsed
                for key, value in times.seconds.items():
                    (calls if key.endswith(" calls") else total)[key] += value
                for q, seconds in times.target:
                    by_q[q].append(seconds)
            gen.pop_completion(rid)
    ms = {k: 1000 * v / steps for k, v in total.items()}
    step_ms = 1000 * wall / steps
    return {
        "decode_steps": steps,
        "ms_per_step": step_ms,
        "target_call_ms": ms.get("target", 0.0),
        "target_calls_per_step": calls["target calls"] / steps,
        "drafter_ms": ms.get("drafter", 0.0),  # its engine's calls included
        "draft_engine_ms": ms.get("draft_engine", 0.0),
        "draft_engine_calls_per_step": calls["draft_engine calls"] / steps,
        "runtime_other_ms": step_ms - ms.get("target", 0.0) - ms.get("drafter", 0.0),
        "target_call_ms_by_tokens_per_sequence": {
            str(q): {"calls": len(v), "ms": 1000 * statistics.mean(v)}
            for q, v in sorted(by_q.items())
        },
    }
