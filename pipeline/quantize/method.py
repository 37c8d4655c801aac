"""A quantization method as a plug-in: the interface every method implements, the values it
exchanges with the layer walk, and the registry that finds methods by name.

A method is one module defining ``PLUGIN``, a `QuantMethod`: the built-ins are methods/rtn.py,
gptq.py, awq.py, smoothquant.py, fp8.py and auto.py (a search over the others' entries, resolved
before the walk: `searches`, `measure`, `resolve`), listed in `QUANT_METHODS`; another
distribution adds one under the entry-point group ``ingot.quant_methods``. The plug-in gives:

- its recipe entry (`QuantMethod.entry`, a `QuantEntry` model whose ``method`` literal is the
  plug-in's name): the recipe's `quantize` union is assembled from them (recipe/quantize.py);
- what it observes of a group's input during the layer walk (`observes`); an entry that
  observes nothing needs no calibration data;
- how it rounds a linear without data, before the walk (`round`), folds a scale into the
  module before a group whose linears it alone selects (`scale_group`), and finishes a linear
  from what was observed (`finish`): the walk (layerwise.py, driver.py) calls these and names
  no method;
- what quantize.json (then the manifest) records of an entry (`record`), and how `ingot
  inspect` describes that record (`describe`);
- the IR scheme of its linears (`scheme`, `grid`), which is what the exporter and the interop
  formats read: they read the IR's QuantizedLinears, never the method;
- its recipe checks against the model (`model_problems`) and the plan's costs (`layer_costs`).

Nothing here imports torch (tensors and modules appear in annotations only): the recipe and
`ingot inspect` (a runtime install has no torch) import the plug-ins; a plug-in imports its
algorithm module (gptq.py, awq.py, ...) inside the hooks the layer walk calls.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict

from ingot.common import Registry

if TYPE_CHECKING:
    from torch import Tensor, nn

    from ingot.calibration.dataset import CalibrationSet

    from ..model.config import ModelConfig
    from ..model.input_quant import InputQuant
    from ..model.layer_source import LayerSource
    from ..model.qlinear import QuantizedLinear

__all__ = [
    "CHANNEL_SAMPLE_TOKENS",
    "QUANT_METHODS",
    "Grid",
    "Group",
    "GroupInputs",
    "IntegerEntry",
    "IntegerMethod",
    "LayerCost",
    "LayerWork",
    "Observation",
    "QuantEntry",
    "QuantMethod",
    "Resolution",
    "Scheme",
    "SearchInputs",
    "method_of",
]


class Observation(enum.Flag):
    """What the layer walk measures of a group's input (the linears reading one tensor) over the
    calibration windows, for the entries that ask (`QuantMethod.observes`)."""

    NONE = 0
    HESSIAN = enum.auto()  # 2 X^T X / tokens [K, K]: GPTQ's solve
    CHANNELS = enum.auto()  # mean |x| [K] and whole sample sequences [S * T, K]: AWQ's searches
    ABSMAX = enum.auto()  # max |x| [K]: SmoothQuant's scales, static input scales


CHANNEL_SAMPLE_TOKENS = 4096  # about this many tokens (whole samples) in CHANNELS' sample


class Scheme(enum.Enum):
    """What the IR holds for an entry's linears, as the interop formats tell them apart."""

    WEIGHT_ONLY_INT = "weight-only integer quantization"
    W8A8 = "W8A8 (int8 weights and activations)"
    FP8 = "FP8 weights"


class Grid(NamedTuple):
    """The integer grid of weight codes: the arguments of round-to-nearest."""

    bits: int
    group_size: int  # -1: one scale per output channel
    symmetric: bool


class QuantEntry(BaseModel):
    """The base of every method's recipe entry (one pass of the recipe's `quantize` list).

    An entry declares ``method`` (a Literal of its plug-in's name), ``targets`` and ``ignore``
    (fields.py) and ``bits`` (bits per weight code, a field or a property). Strict, as every
    recipe section is (recipe/base.py; the recipe imports the plug-ins, so they cannot import
    the recipe package).
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    if TYPE_CHECKING:  # declared by each entry model, in its own order, with its own defaults
        method: str
        targets: list[str]
        ignore: list[str]
        bits: int

    @property
    def calibrated(self) -> bool:
        """Whether the entry needs the calibration windows: it observes something in the walk."""
        return bool(method_of(self).observes(self))


class IntegerEntry(QuantEntry):
    """An entry with integer weights of its own grid: ``bits``, ``group_size``, ``symmetric``."""

    if TYPE_CHECKING:
        group_size: int
        symmetric: bool

    @property
    def grid(self) -> Grid:
        return Grid(self.bits, self.group_size, self.symmetric)


@dataclass(frozen=True, slots=True)
class GroupInputs:
    """What the layer walk observed of one group's shared input (float32, on the layer's
    device); None where no entry of the group asked for it (`Observation`)."""

    hessian: Tensor | None = None  # [K, K]
    mean_abs: Tensor | None = None  # [K]
    samples: Tensor | None = None  # [S * T, K]: whole sample sequences, in order
    act_max: Tensor | None = None  # [K]

    def scaled(self, s: Tensor) -> GroupInputs:
        """The same statistics of x / s: what the group's linears receive once a scale s [K]
        was folded into the module before them (`QuantMethod.scale_group`)."""
        inv = 1.0 / s
        return GroupInputs(
            None if self.hessian is None else self.hessian * inv[:, None] * inv[None, :],
            None if self.mean_abs is None else self.mean_abs / s,
            None if self.samples is None else self.samples / s,
            None if self.act_max is None else self.act_max / s,
        )

    def static_scale(self, scheme: InputQuant | None) -> InputQuant | None:
        """``scheme``, a static one with its scale: max |x| over the tokens and channels mapped
        to the dtype's largest value (needs ABSMAX)."""
        if scheme is None or not scheme.static:
            return scheme
        return scheme.with_peak(float(self.act_max.max()))


@dataclass(frozen=True, slots=True)
class Group:
    """A group of a decoder layer's linears reading one input (q,k,v; o; gate,up; down) whose
    linears are all selected by entries of one method, as the walk finishes it."""

    layer: nn.Module
    names: tuple[str, ...]  # the group's linears, as named inside the layer
    entries: tuple[QuantEntry, ...]  # the entry selecting each
    inputs: GroupInputs
    prev: str | None  # the module producing the group's input, if a scale can fold into it
    norm: str | None  # that module when it is the norm before the group
    seq_len: int  # tokens per calibration sample
    # x [S, T, K] -> weights -> what the group feeds, with its linears holding those weights:
    # the attention block's output for q,k,v, the MLP's for gate,up, else the linear's own.
    inspect: Callable[[Tensor], Callable[[list[Tensor]], Tensor]]

    def linears(self) -> list[nn.Module]:
        return [self.layer.get_submodule(n) for n in self.names]


@dataclass(frozen=True, slots=True)
class LayerWork:
    """What the plan knows of one decoder layer's calibrated pass."""

    linears: tuple[tuple[int, int], ...]  # (N, K) of each linear
    tokens: int  # calibration tokens
    forward_flops: float  # one forward pass of the layer over them
    # (K, tokens observed) of each group's input, in compute order: an expert's groups see
    # the tokens routed to it. (): one input per distinct K, over every token.
    inputs: tuple[tuple[int, float], ...] = ()

    def observed(self) -> tuple[tuple[int, float], ...]:
        """(K, tokens) of each input a method observes (`inputs`, or its default)."""
        return self.inputs or tuple((k, self.tokens) for k in sorted({k for _, k in self.linears}))


@dataclass(frozen=True, slots=True)
class LayerCost:
    """A method's share of one layer's calibrated pass."""

    held_bytes: int = 0  # host memory held beside the layer while it is quantized
    flops: float = 0.0


@dataclass(frozen=True, slots=True)
class SearchInputs:
    """What an entry that is resolved by measurement (`QuantMethod.searches`) measures on: the
    float model a layer at a time, the calibration windows, the device of the layer walk."""

    source: LayerSource
    calibration: CalibrationSet
    device: str = "cpu"


@dataclass(frozen=True, slots=True)
class Resolution:
    """A searched entry resolved: the ordinary entries (exact module targets) the layer walk
    runs in its place, and what quantize.json, the manifest and ingot.lock record of the
    search (`record`; its ``resolved`` holds those entries' records)."""

    entries: tuple[QuantEntry, ...]
    record: dict[str, Any]


class QuantMethod(ABC):
    """One quantization method. Subclasses set `name` and `entry`; the defaults fit a method
    that rounds without data (override `round`) or one that observes its inputs (override
    `observes` and `finish`)."""

    name: ClassVar[str]
    entry: ClassVar[type[QuantEntry]]

    def observes(self, entry: QuantEntry) -> Observation:
        """What the walk must measure of the inputs of the linears ``entry`` selects."""
        return Observation.NONE

    def sequential(self, entry: QuantEntry) -> bool:
        """Whether each group of a layer is fitted to what the already quantized groups before
        it produce (GPTQ's true-sequential), rather than observed on the layer as loaded."""
        return False

    def round(self, linear: nn.Linear, entry: QuantEntry) -> QuantizedLinear | None:
        """The linear rounded without data, before the walk reaches its layer; None when the
        method needs the walk (`finish`) to quantize it. Also what lm_head gets."""
        return None

    def scale_group(self, group: Group) -> Tensor | None:
        """Fold a per-input-channel scale s [K] into the module before ``group`` and its
        linears' columns (the float function unchanged) and return it; None for none. Called
        for groups whose linears this method alone selects; the walk then hands `finish` the
        inputs of x / s."""
        return None

    def finish(
        self, linear: nn.Module, name: str, entry: QuantEntry, inputs: GroupInputs
    ) -> QuantizedLinear:
        """``linear`` (``name`` inside its layer) quantized from what was observed of its
        group's input. The walk calls it for entries that observe something; the default
        rounds without data."""
        rounded = self.round(linear, entry)
        if rounded is None:
            raise NotImplementedError(f"{self.name}: neither rounds nor finishes a linear")
        return rounded

    @abstractmethod
    def scheme(self, entry: QuantEntry) -> Scheme:
        """What the IR holds for the entry's linears."""

    def grid(self, entry: QuantEntry) -> Grid | None:
        """The integer grid of a weight-only integer entry's codes; None otherwise."""
        return None

    def record(self, entry: QuantEntry) -> dict[str, Any]:
        """The entry as quantize.json and the manifest record it (the module count aside)."""
        return entry.model_dump(mode="json")

    @abstractmethod
    def describe(self, record: dict[str, Any]) -> str:
        """`ingot inspect`'s words for a `record` (read back from a manifest)."""

    def model_problems(
        self, at: str, entry: QuantEntry, chosen: list[str], cfg: ModelConfig
    ) -> list[str]:
        """One line per way the entry at recipe path ``at``, selecting the linears ``chosen``,
        does not fit the model (beyond the checks every entry gets)."""
        return []

    def layer_costs(self, entry: QuantEntry, work: LayerWork) -> dict[str, LayerCost]:
        """{method name: its cost} for one layer of the walk: this method's, and any it runs
        on its behalf (the plan counts each name once)."""
        return {self.name: LayerCost()} if entry.calibrated else {}

    def nested(self, entry: QuantEntry) -> dict[str, QuantEntry]:
        """Entries inside this one ({path relative to it: entry}, auto's candidates): the
        recipe checks check each against the modules this entry selects, as its own."""
        return {}

    def searches(self, entry: QuantEntry) -> bool:
        """Whether the entry stands for ordinary entries chosen by measuring the model before
        the layer walk (`measure` in the precision stage, then `resolve` in the quantize
        stage); the walk never sees it."""
        return False

    def measure_key(self, entry: QuantEntry) -> dict[str, Any]:
        """What `measure` depends on of a searched entry (the precision stage's key): auto's
        entry without its budget, so entries that differ only there share one measurement."""
        raise NotImplementedError(f"{self.name}: not an entry resolved by a search")

    def measure(self, entry: QuantEntry, inputs: SearchInputs) -> dict[str, Any]:
        """A searched entry's measurements (JSON), which `resolve` chooses from."""
        raise NotImplementedError(f"{self.name}: not an entry resolved by a search")

    def resolve(self, entry: QuantEntry, measured: dict[str, Any], cfg: ModelConfig) -> Resolution:
        """The searched entry resolved into ordinary entries from its measurements."""
        raise NotImplementedError(f"{self.name}: not an entry resolved by a search")


class IntegerMethod(QuantMethod):
    """A weight-only integer method: codes on its entry's grid, zero points when asymmetric."""

    def scheme(self, entry: QuantEntry) -> Scheme:
        return Scheme.WEIGHT_ONLY_INT

    def grid(self, entry: QuantEntry) -> Grid:
        return entry.grid  # an IntegerEntry

    def record(self, entry: QuantEntry) -> dict[str, Any]:
        """The entry's settings and its grid, also where the method fixes it (no field)."""
        return {**entry.model_dump(mode="json"), **self.grid(entry)._asdict()}

    def describe(self, record: dict[str, Any]) -> str:
        kind = "sym" if record.get("symmetric") else "asym"
        return f"{record['method']} int{record['bits']} g{record['group_size']} {kind}"


QUANT_METHODS: Registry[QuantMethod] = Registry(
    "quantization method",
    {
        "rtn": "ingot.pipeline.quantize.methods.rtn",
        "gptq": "ingot.pipeline.quantize.methods.gptq",
        "awq": "ingot.pipeline.quantize.methods.awq",
        "smoothquant": "ingot.pipeline.quantize.methods.smoothquant",
        "fp8": "ingot.pipeline.quantize.methods.fp8",
        "auto": "ingot.pipeline.quantize.methods.auto",
    },
    group="ingot.quant_methods",
)


def method_of(entry: QuantEntry) -> QuantMethod:
    """The plug-in of a quantize entry."""
    return QUANT_METHODS.get(entry.method)
