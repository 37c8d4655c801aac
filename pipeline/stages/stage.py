"""A declared stage: its name, its recipe slice, its inputs, how it produces its output, and
the contract of that output (the files it writes and how a consumer reads them).

A stage's cache key is `stage_key(kind, key_slice, {input: digest}, versions)`. An input is a
digest that is no stage's (the source's files, a dataset's text, an attached checkpoint), an
earlier stage (its output's digest), or a `Part` of an earlier stage's output (a digest of what
the stage reads of it). `reads` are earlier stages a stage reads without being keyed on them
(another input's digest covers them). The builder (`walk.py`) runs a stage only after every
stage it names, and hands `produce` those stages' outputs, no others.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

__all__ = ["Input", "Part", "Stage", "StageJob", "StageOutput"]


@dataclass(frozen=True, slots=True)
class StageOutput:
    """A stage's output directory in the cache and its digest (`directory_digest`). Each stage
    subclasses it with the names of the files it writes and the readers of them: consumers
    read a stage's files through its output, never by a file name of their own."""

    dir: Path
    digest: str

    def _json(self, name: str) -> Any:
        return json.loads((self.dir / name).read_text())


T = TypeVar("T", bound=StageOutput)


@dataclass(frozen=True, slots=True)
class Stage(Generic[T]):
    """One stage of the build, declared before any stage runs."""

    name: str  # "quantize", "draft-export", "engine:onnxruntime-cpu", "interop:gguf", ...
    output: type[T]  # its output's contract
    key_slice: Any  # the recipe slice it depends on: the key's "recipe"
    inputs: Mapping[str, Input]  # the key's "inputs", each resolved to a digest by the walk
    produce: Callable[[StageJob], None] = field(repr=False)
    reads: tuple[Stage[Any], ...] = field(default=(), repr=False)  # read, not keyed on
    resumable: bool = False  # produce gets a work directory that survives a crash

    @property
    def kind(self) -> str:
        """The name before ':' (`engine:onnxruntime-cpu` -> `engine`): the key's "stage" and
        the cache's directory."""
        return self.name.split(":")[0]

    @property
    def upstream(self) -> tuple[Stage[Any], ...]:
        """Every earlier stage this one reads: its stage inputs, its parts' stages, `reads`."""
        named = [
            value.stage if isinstance(value, Part) else value for value in self.inputs.values()
        ]
        stages = [s for s in named if isinstance(s, Stage)] + list(self.reads)
        return tuple({s.name: s for s in stages}.values())


@dataclass(frozen=True, slots=True)
class Part(Generic[T]):
    """A digest of part of an earlier stage's output: what a stage is keyed on when it reads
    only that part (an interop checkpoint of an fp8 KV cache stores the export's K/V scales,
    not its graph)."""

    stage: Stage[T]
    digest: Callable[[T], str] = field(repr=False)


Input = str | Stage[Any] | Part[Any]


@dataclass(frozen=True, slots=True)
class StageJob:
    """What `produce` gets: the directory to write (`out`), a resumable stage's checkpoint
    directory (`work`, else None), and the outputs of the stages it declared."""

    out: Path
    work: Path | None
    outputs: Mapping[str, StageOutput]

    def __getitem__(self, stage: Stage[T]) -> T:
        """The output of `stage`, one this stage declared (input, part or read)."""
        try:
            return self.outputs[stage.name]  # type: ignore[return-value]
        except KeyError:
            raise KeyError(f"stage {stage.name} was not declared as read") from None
