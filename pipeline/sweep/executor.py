"""How the sweep's variants are built: `BuildJob`s in, `BuildOutcome`s out, by an `Executor`
found by name in `EXECUTORS` (`local`: this host, as many builds at once as fit in memory;
`ray`: one Ray task per build on an existing cluster). Each build runs in a process of its own
(build_worker.py), so its peak memory and time are its own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from inspect import signature
from pathlib import Path
from typing import Any, Protocol

from ingot.common import IngotError, Registry

from ..plan import plan_build, read_hf_config
from ..recipe import load_recipe

__all__ = [
    "BuildJob",
    "BuildOutcome",
    "EXECUTORS",
    "Executor",
    "ExecutorFactory",
    "ExecutorOptionError",
    "make_executor",
    "planned_peak_bytes",
]


@dataclass(frozen=True)
class BuildJob:
    name: str  # the variant's name (a safe file name)
    recipe: Path  # the variant's full recipe file
    out: Path  # where its artifact goes
    cache_root: Path  # the stage cache all variants share (a directory every worker sees)


@dataclass(frozen=True)
class BuildOutcome:
    name: str
    artifact: Path | None  # None when the build failed
    build_s: float  # wall seconds of the build
    peak_build_bytes: int  # peak resident memory of the build's process (its own process)
    error: str | None  # None, or the one-line reason it failed (the IngotError's text)


class ExecutorOptionError(IngotError, ValueError):
    """An executor option it does not take, or a value it cannot use."""


class Executor(Protocol):
    def run(self, jobs: Sequence[BuildJob]) -> list[BuildOutcome]:
        """Build every job; one outcome per job, in the jobs' order (a failed build is an
        outcome with its error, never an exception)."""
        ...


class ExecutorFactory(Protocol):
    """An executor plug-in's PLUGIN: called with the executor's options."""

    def __call__(self, **options: Any) -> Executor: ...


EXECUTORS: Registry[ExecutorFactory] = Registry(
    "executor",
    {
        "local": "ingot.pipeline.sweep.executors.local",
        "ray": "ingot.pipeline.sweep.executors.ray",
    },
    group="ingot.sweep_executors",
)


def make_executor(name: str = "local", **options: Any) -> Executor:
    """The executor called `name`, made with `options` (e.g. local's `jobs`, ray's
    `address`); `UnknownPlugin` (one line naming the known ones) for an unknown name,
    `ExecutorOptionError` for an option it does not take."""
    factory = EXECUTORS.get(name)
    known = signature(factory).parameters
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ExecutorOptionError(
            f"executor {name}: unknown option {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(known) or 'none'})"
        )
    return factory(**options)


def planned_peak_bytes(recipe: Path) -> int | None:
    """`ingot plan`'s peak host memory for building `recipe`; None when the recipe cannot be
    planned (its build then fails with the reason, as one variant's outcome)."""
    try:
        loaded = load_recipe(recipe)
        config, local = read_hf_config(loaded.stage_slice("source")["source"])
        return plan_build(loaded, Path(recipe), config, local).peak.peak_bytes
    except (IngotError, OSError):
        return None
