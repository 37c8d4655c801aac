"""Read a Hugging Face safetensors checkpoint into the IR, by tensor name.

`CheckpointReader` is the checkpoint as a `LayerSource`: the tensors are located once by
name across the shards (in any order) and their shapes checked against config.json from the
headers alone; each stays on disk, in its stored dtype, until its layer's turn comes, and is
then read (plain positioned reads, not a memory map) and converted to float32. Nothing is
cached between calls, so a layer-by-layer pass holds one layer's weights, never the whole
model. `load_model` builds the whole model from the same reader.

A tensor stacking several of the layer's linears (the family's `FusedLinear`: Phi-3's
qkv_proj) is located as its parts: a range of rows of a row-major tensor is a contiguous byte
range, so each part is read on its own, at no extra cost.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from ingot.common.errors import IngotError

from .architecture import lm_head_source
from .config import ModelConfig
from .family import ModelFamily
from .layers import DecoderLayer, make_norm
from .llama import LlamaModel

__all__ = ["load_model", "weight_files", "CheckpointError", "CheckpointReader"]


class CheckpointError(IngotError, ValueError):
    """The checkpoint's weight files are missing, unsafe or do not fit the config."""


# Buffers some checkpoints carry that the IR recomputes.
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")
_FLOAT_DTYPES = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F64": torch.float64,
}
_READ_CHUNK_BYTES = 16 * 2**20  # stored bytes converted to float32 at a time


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory; pickled weights are refused."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    pickled = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
    if pickled:
        raise CheckpointError(
            f"{path}: only pickle weights found ({', '.join(pickled)}); ingot loads safetensors "
            "only, because unpickling can run arbitrary code. Convert the checkpoint first."
        )
    raise CheckpointError(f"{path}: no *.safetensors weight files found")


def _expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """{IR name: shape} of every tensor the checkpoint must hold (lm_head only if untied)."""
    with torch.device("meta"):
        model = LlamaModel(cfg)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if model.lm_head_tied:
        shapes.pop("lm_head.weight")
    return shapes


@dataclass(frozen=True, slots=True)
class _Stored:
    """Where one checkpoint tensor's bytes are, and how they are stored."""

    file: Path
    hf_name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # of its first byte in the file
    part: bool = False  # a range of rows of a fused tensor (`FusedLinear`)


def _parts(
    name: str, stored: _Stored, family: ModelFamily, expected: dict[str, tuple[int, ...]]
) -> list[tuple[str, _Stored]]:
    """(IR name, where) of what checkpoint tensor `name` (IR-named) holds: itself, or for a
    fused tensor (`layers.3.attn.qkv_proj.weight`) each part's rows, in the family's order,
    as many as config.json gives each part (`FusedLinear`)."""
    match = re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|bias)", name)
    fused = match and next((f for f in family.fused if f.name == match[2]), None)
    if not fused:
        return [(name, stored)]
    names = [f"layers.{match[1]}.{part}.{match[3]}" for part in fused.parts]
    rows = [expected.get(n, (0,))[0] for n in names]
    if not stored.shape or stored.shape[0] != sum(rows):
        raise CheckpointError(
            f"{stored.file.name}: {stored.hf_name} has shape {stored.shape}; config.json "
            f"implies {sum(rows)} rows ({' + '.join(map(str, rows))}: {', '.join(fused.parts)})"
        )
    row_bytes = math.prod(stored.shape[1:]) * stored.dtype.itemsize
    parts, offset = [], stored.offset
    for part, n in zip(names, rows, strict=True):
        shape = (n, *stored.shape[1:])
        parts.append((part, replace(stored, shape=shape, offset=offset, part=True)))
        offset += n * row_bytes
    return parts


def _stored_tensors(file: Path) -> dict[str, _Stored]:
    """{HF name: _Stored} of one safetensors file, from its header alone. safetensors checks
    the header first (size, offsets inside the file, no overlap); the offsets are then taken
    from the same JSON."""
    with safe_open(str(file), framework="pt"):
        pass  # validates the header
    with open(file, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    stored = {}
    for hf_name, info in header.items():
        dtype = _FLOAT_DTYPES.get(info["dtype"])
        if dtype is None and not _IGNORED.search(hf_name):
            raise CheckpointError(
                f"{file.name}: {hf_name} is stored as {info['dtype']}; ingot reads float "
                f"weights ({', '.join(_FLOAT_DTYPES)})"
            )
        start = 8 + size + info["data_offsets"][0]
        stored[hf_name] = _Stored(file, hf_name, dtype, tuple(info["shape"]), start)
    return stored


def _read_float32(t: _Stored) -> torch.Tensor:
    """The tensor as float32, read with plain positioned reads: no mapping of the file, so
    reading costs the float32 result plus (another stored dtype) a chunk to convert from."""
    out = torch.empty(t.shape, dtype=torch.float32)
    flat = out.view(-1)
    with open(t.file, "rb", buffering=0) as f:
        if t.dtype == torch.float32:
            _pread_into(f.fileno(), flat.view(torch.uint8).numpy(), t.offset, t)
            return out
        itemsize = torch.empty(0, dtype=t.dtype).element_size()
        per = max(1, _READ_CHUNK_BYTES // itemsize)
        stage = torch.empty(min(per, flat.numel()) * itemsize, dtype=torch.uint8)
        for a in range(0, flat.numel(), per):
            b = min(a + per, flat.numel())
            chunk = stage[: (b - a) * itemsize]
            _pread_into(f.fileno(), chunk.numpy(), t.offset + a * itemsize, t)
            flat[a:b] = chunk.view(t.dtype)  # exact for F16 / BF16
    return out


def _pread_into(fd: int, buffer, offset: int, t: _Stored) -> None:
    view, done = memoryview(buffer).cast("B"), 0
    while done < len(view):  # pread may return less than asked
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise CheckpointError(f"{t.file.name}: {t.hf_name} is truncated")
        done += got


class CheckpointReader:
    """A `LayerSource` over a safetensors checkpoint: each call reads its tensors from disk
    (float32) and keeps nothing."""

    def __init__(self, path: str | Path, cfg: ModelConfig | None = None) -> None:
        self.path = Path(path)
        self._cfg = cfg or ModelConfig.from_dir(self.path)
        expected = _expected_shapes(self._cfg)
        family = self._cfg.family
        names = family.tensor_names
        self._where: dict[str, _Stored] = {}  # by IR name
        for file in weight_files(self.path):
            for hf_name, stored in _stored_tensors(file).items():
                if _IGNORED.search(hf_name):
                    continue
                for name, part in _parts(names.to_ir(hf_name), stored, family, expected):
                    self._locate(name, part, expected)
        missing = sorted(set(expected) - set(self._where))
        if missing:
            raise CheckpointError(
                f"{self.path}: tensors missing from the checkpoint: {missing[:5]}"
            )

    def _locate(self, name: str, stored: _Stored, expected: dict[str, tuple[int, ...]]) -> None:
        """Record where IR tensor `name` is, after checking it is expected, once, in shape."""
        file, hf_name = stored.file.name, stored.hf_name
        if name not in expected:
            raise CheckpointError(f"{file}: unexpected tensor {hf_name!r}")
        if name in self._where:
            raise CheckpointError(f"{file}: {hf_name} is also in {self._where[name].file.name}")
        if stored.shape != expected[name]:
            what = f"rows of {hf_name}" if stored.part else hf_name
            raise CheckpointError(
                f"{file}: {what} has shape {stored.shape}, config.json implies {expected[name]}"
            )
        self._where[name] = stored

    @property
    def cfg(self) -> ModelConfig:
        return self._cfg

    def tensor(self, name: str) -> torch.Tensor:
        """One tensor (by IR name) read now, as float32."""
        if name not in self._where:
            raise CheckpointError(f"{self.path}: tensor {name!r} missing from the checkpoint")
        return _read_float32(self._where[name])

    def embedding(self) -> torch.Tensor:
        return self.tensor("embed_tokens.weight")

    def quantized_embedding(self) -> None:
        return None  # a source checkpoint's embedding is float

    def layer(self, i: int) -> DecoderLayer:
        """Decoder layer ``i`` with its float weights."""
        with torch.device("meta"):
            layer = DecoderLayer(self._cfg, i)
        prefix = f"layers.{i}."
        state = {k: self.tensor(prefix + k) for k in layer.state_dict()}
        try:
            layer.load_state_dict(state, assign=True, strict=True)
        except RuntimeError as e:
            raise CheckpointError(f"{self.path}: layer {i} does not fit config.json: {e}") from e
        return layer.eval()

    def final_norm(self) -> nn.Module:
        with torch.device("meta"):
            norm = make_norm(self._cfg)
        norm.load_state_dict({k: self.tensor(f"norm.{k}") for k in norm.state_dict()}, assign=True)
        return norm.eval()

    def lm_head(self) -> nn.Linear:
        """A float Linear over lm_head's tensor (the embedding's when tied; read again)."""
        cfg = self._cfg
        with torch.device("meta"):
            head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        head.weight = nn.Parameter(self.tensor(lm_head_source(cfg)))
        return head.eval()

    @property
    def lm_head_tied(self) -> bool:
        return self._cfg.tie_word_embeddings


def load_model(path: str | Path, cfg: ModelConfig | None = None) -> LlamaModel:
    """The whole model in memory (float32)."""
    reader = CheckpointReader(path, cfg)
    with torch.device("meta"):
        model = LlamaModel(reader.cfg)
    model.embed_tokens.weight = nn.Parameter(reader.embedding())
    for i in range(reader.cfg.num_layers):
        model.layers[i] = reader.layer(i)
    model.norm = reader.final_norm()
    if reader.lm_head_tied:
        model.tie_lm_head()
    else:
        model.lm_head = reader.lm_head()
    return model.eval()
