"""What an engine builder implements, and what the build gives it and asks of it.

An engine is one package here (and its runtime half one under runtime/engines/), registered by
name in `ENGINE_BUILDERS` (engines/__init__.py); the package defines `PLUGIN`, an
`EngineBuilder`. Who calls it:

- the recipe: `targets` entries are validated by the registered builders' `target_model`s
  (recipe/targets.py assembles the discriminated union on ``engine``), and the rest of the
  recipe against each target by its builder's `recipe_problems` (what the engine cannot run:
  refused when the recipe loads, before any stage); the source model against each target by
  its `model_problems` (the preflight, pipeline/preflight.py);
- the engine stage (stages/engine.py): `build` writes the engine files from the exported
  graph and returns the record (``engine.json``, the manifest's engine entry), `open` runs the
  built engine as the runtime will, and the stage checks it against the IR (export/check.py,
  `GraphCheck`) at the tolerance of its `accuracy`; where that is not exact, it first checks
  `exact` (the same compiled graph computing exactly) at the exact tolerance. An engine that
  keeps a quantized KV cache in a form of its own (`own_kv`) is checked against the IR with
  unrounded K/V: its exact variant (an fp32 cache) exactly, the engine loosely;
- `ingot plan` (plan.py): `estimate` (and `constants`, which ``--json`` shows);
- the evaluate stage: `describe` (the engine's line in eval/report.md).

The recipe imports every registered builder's package to read its target model, so a package
must not import the recipe (its target model subclasses `EngineTarget`, not the recipe's base)
nor the IR check (which imports torch: `build` gets the exported graph's path, the stage runs
the check on the `GraphRunner`s the plug-in returns).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict

__all__ = [
    "Accuracy",
    "EngineBuilder",
    "EngineEstimate",
    "EngineSizing",
    "EngineTarget",
    "ExactRun",
    "GRAPH_INITIALIZERS",
    "GraphRunner",
    "engine_name",
    "reads_graph",
    "ships_portable",
    "weights_engine",
]

# How an engine computes, which picks the check's tolerance (export/check.py `RTOL`).
Accuracy = Literal["exact", "int8_activations"]


class EngineTarget(BaseModel):
    """A recipe ``targets`` entry. An engine's target model subclasses it with ``engine:
    Literal["<its name>"]``, its devices and its options."""

    # As every recipe section (recipe/base.py `_Strict`): unknown keys refused, no coercion.
    # Not `_Strict` itself: the recipe imports every engine's target model, so an engine
    # package must not import the recipe.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    engine: str
    device: str


def engine_name(target: EngineTarget) -> str:
    """The target's name: its engine stage (``engine:<name>``), its ``engines/<name>/``
    directory in the artifact and its manifest entry's ``name``."""
    return f"{target.engine}-{target.device}"


def reads_graph(record: Mapping[str, Any]) -> bool:
    """Whether an engine's file is its model's portable graph (the record's ``path`` is the
    graph's own name, "model.onnx", not ``engines/<name>/<file>``): an engine built from the
    shipped graph's weights at load, adding no file of its own to the artifact."""
    return "/" not in record["path"]


# An engine record's ``build`` key saying its file holds the exported graph's initializers
# under their export names (ONNX Runtime's optimized graph: int4 / int8 linears as MatMulNBits
# inputs): an engine built at load from the graph's weights reads them there instead.
GRAPH_INITIALIZERS = "graph_initializers"


def weights_engine(records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first engine (of one model's, in target order) whose file holds the exported
    graph's initializers: the one copy of the weights an engine built at load reads."""
    return next((r for r in records if r.get("build", {}).get(GRAPH_INITIALIZERS)), None)


def ships_portable(records: Sequence[Mapping[str, Any]], portable: bool) -> bool:
    """Whether the model's portable graph (model.onnx + .data) goes into the artifact: asked
    for (the recipe's ``artifact.portable``), or an engine built at load from the graph's
    weights has no engine file holding them to read instead."""
    built_at_load = any(reads_graph(r) for r in records)
    return portable or (built_at_load and weights_engine(records) is None)


class GraphRunner(Protocol):
    """An engine running the exported graph's interface (docs/design.md, section 4): what the
    IR check (export/check.py, which knows no engine) runs."""

    @property
    def inputs(self) -> Mapping[str, tuple[tuple[int | str, ...], str]]:
        """{name: (shape, numpy dtype name)} of the graph's inputs; symbolic dims as names."""
        ...

    @property
    def accuracy(self) -> Accuracy | None:
        """How it computes where it can tell (None: it cannot), so that a runner computing
        with int8 activations is not checked as exact by mistake."""
        ...

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every output of the graph, by name, for one call's inputs."""
        ...


class ExactRun(NamedTuple):
    """The same compiled graph computing exactly, checked before a non-exact engine is built."""

    runner: GraphRunner
    what: str  # for the error message: "the exact check (<what>) failed"


@dataclass(frozen=True, slots=True)
class EngineSizing:
    """What `ingot plan` knows when it estimates an engine stage."""

    graph_bytes: int  # the exported graph's weights (model.onnx.data)
    tied_embedding_bytes: int  # the fp32 embedding when lm_head shares it, else 0
    baseline_bytes: int  # the interpreter and libraries of any stage


@dataclass(frozen=True, slots=True)
class EngineEstimate:
    peak_bytes: int  # host memory of the stage
    seconds: float
    disk_bytes: int  # the engine's files (the stage cache's entry, the artifact's engines/)
    notes: str = ""


class EngineBuilder(Protocol):
    """The build side of one engine (see the module docstring for who calls what)."""

    name: str  # the recipe's ``targets[].engine``
    target_model: type[EngineTarget]
    constants: Mapping[str, float]  # the throughput constants `estimate` uses, by name

    def recipe_problems(self, target: Any, recipe: Any) -> list[str]:
        """One line per part of ``recipe`` (the whole `Recipe`, which this package must not
        import) that ``target`` cannot run, each naming the recipe field and why; none when
        it can. Checked when the recipe loads (`ingot build`, `ingot plan`)."""
        ...

    def model_problems(self, target: Any, cfg: Any, where: str) -> list[str]:
        """One line per part of the source model (its `ModelConfig` ``cfg``) that ``target``
        (at recipe path ``where``) cannot run, each naming the config field and why; none
        when it can. Checked before any stage (pipeline/preflight.py)."""
        ...

    def accuracy(self, target: Any) -> Accuracy:
        """How the built engine computes: the tolerance its check is held to."""
        ...

    def own_kv(self, kv_dtype: str) -> bool:
        """Whether the engine stores a ``kv_dtype`` cache (the recipe's kv_cache.dtype) in a
        form of its own rather than the exported graph's (OpenVINO: its u8 blocks with
        in-block scales for int8). The check then cannot read what it stored: its reference
        keeps K/V unrounded, the exact variant (`exact`, with an fp32 cache) is checked
        exactly and the engine loosely ("int8_activations")."""
        ...

    def exact(
        self, graph: Path, target: Any, *, sliding_window: int | None = None
    ) -> ExactRun | None:
        """For an engine that is not exact: the exported ``graph`` compiled as `build`
        compiles it but computing exactly (nothing written), checked first with the exact
        tolerance; None where the engine is exact, or has no such variant. ``sliding_window``:
        the model's attention window, for an engine that applies it itself (its graph has no
        mask input: OpenVINO's PagedAttention), as `open`'s."""
        ...

    def build(self, graph: Path, target: Any, out: Path) -> dict[str, Any]:
        """Write the engine's files into ``out`` from the exported ``graph`` (model.onnx);
        return its record (``engine.json``): name, engine, device, path (``engines/<name>/<file>``,
        or the graph's own name where the engine is built at load from the shipped graph),
        requires (what a host needs: the runtime plug-in's `problems` reads it),
        session_options (what the runtime applies) and build (how it was built)."""
        ...

    def open(
        self,
        graph: Path,
        out: Path,
        record: dict[str, Any],
        *,
        sliding_window: int | None = None,
    ) -> GraphRunner:
        """The engine `build` wrote into ``out`` from ``graph``, run as the runtime will run
        it (an engine whose record's ``path`` is the graph's reads ``graph``; the runtime
        passes it the model's ``sliding_window``, as `SessionSettings` does)."""
        ...

    def estimate(self, target: Any, sizing: EngineSizing) -> EngineEstimate: ...

    def describe(self, record: dict[str, Any], engine_dir: Path) -> str:
        """How the engine computes, in a few words, for eval/report.md (e.g. "MatMulNBits
        accuracy level 4, int8 activations")."""
        ...
