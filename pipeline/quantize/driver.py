"""Quantization of a whole model, one decoder layer at a time: the one driver of every recipe.

`quantize_layers(source, entries, out, work_dir, calibration)` walks the layers of any
`LayerSource` (the checkpoint read from disk, or a model in memory) once, in order:

- Recipes whose methods round without data (RTN, FP8 with dynamic or no input scales) need no
  activations: per layer, load it -> round the selected linears (`layerwise.round_linears`)
  -> write the finished layer -> let it go.
- Recipes with calibrated entries (GPTQ, AWQ, SmoothQuant, static FP8 inputs: whatever
  observes its inputs) also run layer-sequentially on the calibration windows: layer i is
  quantized (`decoder_layer.quantize_decoder_layer`) on the activations that the *quantized* layers
  0..i-1 produce, then its own quantized outputs become layer i+1's inputs. The layer's
  data-free rounding is applied first.

Only one decoder layer's weights are alive at a time, plus (calibrated) at most three
activation stores: a layer's inputs and two of its attention output, residual stream and
outputs, each spilled to the work directory past a third of the budget (``offload="disk"``:
always spilled).

**Device.** Calibrated layers are computed on ``device`` (cpu, cuda, cuda:N): each layer is
loaded and RTN-quantized on the CPU, moved to the device (float32) for its turn, observed and
quantized there, and moved back to the CPU before it is written. The activation stores stay in
host memory or on disk; chunks go to the device as they are read and come back as they are
written. Matmuls run in full float32 on every device (TF32 off for the walk), so a device's
result depends on the device alone. RTN-only recipes ignore ``device``: they run on the CPU.

Each finished layer is written to ``work_dir`` (`LayerCheckpoints`: ``layer_{i}.*``, then
``layer_{i}.done``; a quantized lm_head as ``lm_head.*``), so a run killed midway resumes: a
rerun skips the finished layers. A calibrated rerun replays their forward passes from the
checkpoints (no observation, no quantization) to rebuild the first unfinished layer's inputs;
the quantizer computes a layer's outputs with the same operations on the same chunks as that
replay, so a resumed run sees bit-identical activations and writes bit-identical layers. The
IR (ir_config.json + ir.safetensors) is then assembled tensor by tensor from those files and
the source's embedding, final norm and float lm_head, never holding the whole model.

`quantize_in_place(model, entries, calibration)` is the same walk over a model in memory
(tests, benchmarks, evaluation): its finished layers stay in the model instead of being
written, and it computes exactly the weights `quantize_layers` writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from torch import nn

from ingot.calibration.activations import ActivationSpace, ActivationStore, budget_from_env
from ingot.calibration.dataset import CalibrationSet

from ..model.architecture import LM_HEAD, fused_names, linear_names
from ..model.config import ModelConfig
from ..model.layer_source import LayerSource, ModelLayers
from ..model.layers import DecoderLayer
from ..model.llama import LlamaModel
from ..model.qembedding import QuantizedEmbedding
from ..model.selection import EMBEDDING, embedding_entry, entry_for
from .checkpoint import (
    TensorSource,
    layer_tensor_sources,
    load_layer,
    save_layer,
    write_ir_config,
    write_safetensors,
)
from .decoder_layer import quantize_decoder_layer
from .layerwise import (
    LayerForward,
    LayerPlan,
    dequantized_for_propagation,
    layer_plan,
    needs_calibration,
    round_linears,
)
from .method import QuantEntry, method_of
from .summary import summaries

__all__ = ["LayerCheckpoints", "full_float32", "quantize_in_place", "quantize_layers"]

# Progress: on_layer(i, "quantized" | "resumed").
OnLayer = Callable[[int, str], None]
# Where the activations between layers live: "cpu" = memory up to the budget, then disk.
Offload = Literal["cpu", "disk"]
_CPU = torch.device("cpu")


class _Finished(Protocol):
    """Where finished layers go, and come back from to be replayed."""

    def done(self, i: int) -> bool: ...

    def put(self, i: int, layer: DecoderLayer, experts: dict[str, dict]) -> None: ...

    def get(self, i: int) -> DecoderLayer: ...

    def experts(self) -> dict[str, dict]:
        """The calibrated experts' records of the finished layers (`moe_calibration`)."""
        ...

    def lm_head_done(self) -> bool: ...

    def put_lm_head(self, head: nn.Module) -> None: ...

    def embedding_done(self) -> bool: ...

    def put_embedding(self, table: QuantizedEmbedding) -> None: ...


@dataclass(frozen=True, slots=True)
class LayerCheckpoints:
    """``<root>/layer_{i}.*`` files of finished layers; ``layer_{i}.done`` is written last.
    A quantized lm_head is ``lm_head.*`` (+ ``lm_head.done``), a quantized embedding
    ``embed_tokens.*`` (+ ``embed_tokens.done``)."""

    root: Path
    cfg: ModelConfig

    def stem(self, i: int) -> Path:
        return self.root / f"layer_{i}"

    def done(self, i: int) -> bool:
        return (self.root / f"layer_{i}.done").exists()

    def mark_done(self, i: int) -> None:
        self._mark(f"layer_{i}")

    def put(self, i: int, layer: DecoderLayer, experts: dict[str, dict] | None = None) -> None:
        save_layer(layer, self.stem(i))
        if experts:  # before the layer is done: a resumed run finds them
            self.stem(i).with_suffix(".experts.json").write_text(json.dumps(experts))
        self.mark_done(i)

    def experts(self) -> dict[str, dict]:
        records: dict[str, dict] = {}
        for i in range(self.cfg.num_layers):
            file = self.stem(i).with_suffix(".experts.json")
            if file.exists():
                records.update(json.loads(file.read_text()))
        return records

    def get(self, i: int) -> DecoderLayer:
        return load_layer(self.cfg, i, self.stem(i))

    @property
    def lm_head_stem(self) -> Path:
        return self.root / "lm_head"

    def lm_head_done(self) -> bool:
        return (self.root / "lm_head.done").exists()

    def put_lm_head(self, head: nn.Module) -> None:
        holder = nn.Module()  # saved as a module holding `lm_head`: its tensors' IR names
        holder.lm_head = head
        save_layer(holder, self.lm_head_stem)
        self._mark("lm_head")

    @property
    def embedding_stem(self) -> Path:
        return self.root / EMBEDDING

    def embedding_done(self) -> bool:
        return (self.root / f"{EMBEDDING}.done").exists()

    def put_embedding(self, table: QuantizedEmbedding) -> None:
        holder = nn.Module()  # its tensors' IR names: embed_tokens.codes, ...
        holder.embed_tokens = table
        save_layer(holder, self.embedding_stem)
        self._mark(EMBEDDING)

    def _mark(self, stem: str) -> None:
        marker = self.root / f"{stem}.done"
        tmp = marker.with_suffix(".done-tmp")
        tmp.write_text("")
        os.replace(tmp, marker)


@dataclass(frozen=True, slots=True)
class _InModel:
    """Finished layers stay in the model they were quantized in (nothing to resume)."""

    model: LlamaModel
    calibrated_experts: dict[str, dict] = field(default_factory=dict)

    def done(self, i: int) -> bool:
        return False

    def put(self, i: int, layer: DecoderLayer, experts: dict[str, dict] | None = None) -> None:
        self.model.layers[i] = layer
        self.calibrated_experts.update(experts or {})

    def experts(self) -> dict[str, dict]:
        return self.calibrated_experts

    def get(self, i: int) -> DecoderLayer:
        raise AssertionError("an in-memory run has no finished layers to replay")

    def lm_head_done(self) -> bool:
        return False

    def put_lm_head(self, head: nn.Module) -> None:
        self.model.lm_head = head

    def embedding_done(self) -> bool:
        return False

    def put_embedding(self, table: QuantizedEmbedding) -> None:
        self.model.embed_tokens = table
        self.model.tie_lm_head()  # a tied lm_head computes with the quantized table


def quantize_layers(
    source: LayerSource,
    entries: Sequence[QuantEntry],
    out: Path,
    work_dir: Path,
    calibration: CalibrationSet | None = None,
    *,
    budget_bytes: int | None = None,
    on_layer: OnLayer | None = None,
    device: torch.device | str = "cpu",
    offload: Offload = "cpu",
) -> list[dict[str, Any]]:
    """Quantize ``source`` by ``entries``; ``out`` gets ir_config.json + ir.safetensors.
    Returns one summary per entry (quantize.json, then the manifest).

    ``work_dir`` holds the finished layers and spilled activations; it must survive a crash
    for a rerun to resume. Calibrated entries need ``calibration``; they run on ``device``
    (a resumed run must use the one the first run used), with the activations in memory up to
    ``budget_bytes`` ($INGOT_ACTIVATION_BUDGET_MB) and on disk past it, or always on disk
    (``offload="disk"``)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    checkpoints = LayerCheckpoints(work_dir, source.cfg)
    where = _Where.of(device, offload, budget_bytes)
    _walk(source, entries, checkpoints, calibration, work_dir, where, on_layer)
    return _write_ir(source, entries, checkpoints, out)


def quantize_in_place(
    model: LlamaModel,
    entries: Sequence[QuantEntry],
    calibration: CalibrationSet | None = None,
    *,
    budget_bytes: int | None = None,
    device: torch.device | str = "cpu",
    offload: Offload = "cpu",
) -> list[dict[str, Any]]:
    """Quantize a model in memory (on the CPU), replacing its selected linears; returns the
    summaries. Calibrated layers are computed on ``device`` and come back to the CPU; spilled
    activations go to a temporary directory."""
    source, finished = ModelLayers(model), _InModel(model)
    where = _Where.of(device, offload, budget_bytes)
    if not needs_calibration(entries):
        _walk(source, entries, finished, None, None, where, None)
    else:
        with tempfile.TemporaryDirectory(prefix="ingot-acts-") as tmp:
            _walk(source, entries, finished, calibration, Path(tmp), where, None)
    return summaries(
        entries, linear_names(model.cfg), fused=fused_names(model.cfg), experts=finished.experts()
    )


@dataclass(frozen=True, slots=True)
class _Where:
    """Where a calibrated walk computes and keeps its activations."""

    device: torch.device
    offload: Offload
    budget_bytes: int | None  # None: $INGOT_ACTIVATION_BUDGET_MB

    @classmethod
    def of(cls, device: torch.device | str, offload: str, budget_bytes: int | None) -> _Where:
        if offload not in ("cpu", "disk"):
            raise ValueError(f"offload: {offload!r} is neither 'cpu' nor 'disk'")
        return cls(torch.device(device), offload, budget_bytes)

    def budget(self) -> int:
        """Bytes of activations kept in memory; 0 (everything on disk) for offload disk."""
        if self.offload == "disk":
            return 0
        return budget_from_env() if self.budget_bytes is None else self.budget_bytes


@contextlib.contextmanager
def full_float32() -> Iterator[None]:
    """Matmuls in full float32 (no TF32 on a GPU, no reduced precision on a CPU) while the
    layers are calibrated: the results must depend on the device alone, not on a setting
    someone else left in the process."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _walk(
    source: LayerSource,
    entries: Sequence[QuantEntry],
    finished: _Finished,
    calibration: CalibrationSet | None,
    spill_dir: Path | None,
    where: _Where,
    on_layer: OnLayer | None,
) -> None:
    """Every layer once, in order, then the embedding and lm_head."""
    n = source.cfg.num_layers
    done = [finished.done(i) for i in range(n)]
    # The last layer to quantize: a layer's outputs are needed only by a later one.
    last = max((i for i in range(n) if not done[i]), default=-1)
    acts = None
    with contextlib.ExitStack() as stack:
        if needs_calibration(entries) and last >= 0:
            if calibration is None:
                raise ValueError(
                    "quantize: calibrated entries need calibration data (calibration=...)"
                )
            stack.enter_context(full_float32())
            acts = _Activations.start(source, calibration, spill_dir, where)
            stack.callback(acts.close)
        for i in range(n):
            if done[i]:
                if acts is not None and i < last:
                    acts.replay(i, finished.get(i))
                event = "resumed"
            else:
                _quantize_one_layer(source, entries, finished, acts, i, keep=i < last)
                event = "quantized"
            if on_layer is not None:
                on_layer(i, event)
    _quantize_embedding(source, entries, finished)
    _quantize_lm_head(source, entries, finished)


def _quantize_one_layer(
    source: LayerSource,
    entries: Sequence[QuantEntry],
    finished: _Finished,
    acts: _Activations | None,
    i: int,
    *,
    keep: bool,
) -> None:
    """Load layer i, quantize it, hand it to ``finished`` (on the CPU); nothing of it outlives
    the call (unless the source keeps it: a model in memory)."""
    layer, plan = source.layer(i), layer_plan(i, entries, fused_names(source.cfg), source.cfg)
    round_linears(layer, plan)  # on the CPU, whatever the device
    experts: dict[str, dict] = {}
    if acts is not None:
        acts.quantize(i, layer, plan, keep=keep, experts=experts)
    finished.put(i, layer, experts)


def _quantize_lm_head(
    source: LayerSource, entries: Sequence[QuantEntry], finished: _Finished
) -> None:
    # Outside the decoder layers only rounding without data (RTN, FP8 without static
    # activations) applies: the recipe checks refuse calibrated entries.
    entry = entry_for(LM_HEAD.name, entries)
    if entry is None or finished.lm_head_done():
        return
    if source.cfg.tie_word_embeddings and embedding_entry(entries) is not None:
        return  # tied: lm_head computes with the quantized embedding's codes
    with torch.no_grad():
        rounded = method_of(entry).round(source.lm_head(), entry)
    if rounded is not None:
        finished.put_lm_head(rounded)


def _quantize_embedding(
    source: LayerSource, entries: Sequence[QuantEntry], finished: _Finished
) -> None:
    """The table [V, H] rounded as the weight of a linear with V outputs (blocks along H):
    after the walk, so the layers are calibrated on the float embedding, as the check's
    reference is. Only rounding without data applies here (the recipe checks)."""
    entry = embedding_entry(entries)
    if entry is None or finished.embedding_done():
        return
    table = source.embedding()  # [V, H]
    with torch.device("meta"):
        linear = nn.Linear(table.shape[1], table.shape[0], bias=False)
    linear.weight = nn.Parameter(table, requires_grad=False)
    with torch.no_grad():
        rounded = method_of(entry).round(linear, entry)
    if rounded is None:
        raise ValueError(f"quantize: {entry.method} does not round without data (embed_tokens)")
    finished.put_embedding(QuantizedEmbedding.of(rounded))


@dataclass(slots=True)
class _Activations:
    """The calibration activations flowing through the layers: ``x`` holds the inputs of the
    next layer to visit."""

    space: ActivationSpace
    forward: LayerForward
    cfg: ModelConfig
    x: ActivationStore | None

    @classmethod
    def start(
        cls, source: LayerSource, calibration: CalibrationSet, spill_dir: Path, where: _Where
    ) -> _Activations:
        """Layer 0's inputs: the embeddings of the calibration tokens (looked up on the CPU:
        a gather, the same on every device)."""
        cfg = source.cfg
        tokens = torch.as_tensor(calibration.tokens)
        n, t = tokens.shape
        forward = LayerForward.for_config(cfg, n, t, where.device)
        space = ActivationSpace(spill_dir, where.budget(), where.device)
        x = space.store("embed", (n, t, cfg.hidden_size))
        table = source.embedding()
        for start in range(0, n, forward.batch):
            x.write(start, nn.functional.embedding(tokens[start : start + forward.batch], table))
        return cls(space, forward, cfg, x)

    def _stores(self, i: int) -> Callable[[str, tuple[int, ...]], ActivationStore]:
        """Layer i's stores; names alternate by layer so its outputs never reuse its inputs'
        file."""
        return lambda name, shape: self.space.store(f"{name}-{i % 2}", shape)

    def quantize(
        self, i: int, layer: DecoderLayer, plan: LayerPlan, *, keep: bool, experts: dict
    ) -> None:
        """Quantize layer i's calibrated linears on its inputs, on the device; the layer is
        back on the CPU when this returns. Its outputs (if ``keep``) become the next layer's
        inputs; a sparse layer's calibrated experts' records go in ``experts``."""
        x = self.x
        layer.to(self.forward.device)
        stores = self._stores(i)
        try:
            outputs = quantize_decoder_layer(
                layer, x, plan, self.forward, self.cfg, stores, outputs=keep, experts=experts
            )
        finally:
            layer.to(_CPU)
        self._advance(outputs)

    def replay(self, i: int, layer: nn.Module) -> None:
        """A finished layer's outputs, recomputed from its checkpoint on the device."""
        x = self.x
        outputs = self._stores(i)("out", x.shape)
        layer = dequantized_for_propagation(layer.to(self.forward.device))
        with torch.inference_mode():
            for a in range(0, len(x), self.forward.batch):
                b = min(a + self.forward.batch, len(x))
                outputs.write(a, self.forward(layer, x.read(a, b)))
        self._advance(outputs)

    def _advance(self, outputs: ActivationStore | None) -> None:
        self.x.close()
        self.x = outputs

    def close(self) -> None:
        if self.x is not None:
            self.x.close()
            self.x = None


def _write_ir(
    source: LayerSource,
    entries: Sequence[QuantEntry],
    checkpoints: LayerCheckpoints,
    out: Path,
) -> list[dict[str, Any]]:
    """ir_config.json + ir.safetensors from the layer checkpoints and the source's other
    tensors, one tensor in memory at a time."""
    cfg = source.cfg
    h, v = cfg.hidden_size, cfg.vocab_size
    f32 = torch.float32
    tensors: list[TensorSource] = [
        ("norm.weight", (h,), f32, lambda: source.final_norm().weight.detach()),
    ]
    stems = [(checkpoints.stem(i), f"layers.{i}.") for i in range(cfg.num_layers)]
    if checkpoints.embedding_done():  # a tied lm_head is then its codes: nothing stored
        stems.append((checkpoints.embedding_stem, ""))
    else:
        tensors.append(("embed_tokens.weight", (v, h), f32, source.embedding))
    if checkpoints.lm_head_done():
        stems.append((checkpoints.lm_head_stem, ""))
    elif not source.lm_head_tied:
        tensors.append(("lm_head.weight", (v, h), f32, lambda: source.lm_head().weight.detach()))
    quantized = {}
    for stem, prefix in stems:
        tensors += layer_tensor_sources(stem, prefix)
        meta = json.loads(stem.with_suffix(".json").read_text())["quantized"]
        quantized.update({prefix + k: q for k, q in meta.items()})
    write_ir_config(cfg, dict(sorted(quantized.items())), out)
    write_safetensors(out / "ir.safetensors", tensors)
    return summaries(
        entries, linear_names(cfg), fused=fused_names(cfg), experts=checkpoints.experts()
    )
