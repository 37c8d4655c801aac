"""A whole build's per-stage peak memory stays flat in depth: every stage holds one decoder
layer at a time (or, for the engine, the quantized weights once), never the float model.

Two random checkpoints of equal width, 4 and 16 layers, each built from an empty cache in a
fresh interpreter; the build reports each stage's peak resident memory (`StagePeak`: the
kernel's high-water mark, reset at the stage's start). Twelve more float layers would cost
12 x (one layer): quantize, export and package may grow by at most a third of that (allocator
and page-cache noise), so a stage that holds the whole model fails. The engine stage must hold
what it ships (ORT's session over the engine's weights, prepacked for its kernels), so it is
bounded by its growth in engine bytes, 3x, and still far below the float layers. Not timed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fixtures import DEPTH_WIDTH as WIDTH
from fixtures import make_checkpoint, write_recipe

DEPTHS = (4, 16)
RECIPE = dict(kv_cache={"dtype": "fp16", "block_size": 8}, export={"max_seq_len": 128})

_CHILD = textwrap.dedent(
    """
    import json, sys
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    recipe, out, cache = sys.argv[1:4]
    print(json.dumps(build(recipe, out, cache=StageCache(cache)).to_json()))
    """
)


def _layer_bytes() -> int:
    h, i = WIDTH["hidden_size"], WIDTH["intermediate_size"]
    return (4 * h * h + 3 * h * i + 2 * h) * 4  # q, k, v, o (MHA), gate, up, down, norms


def _build(root: Path, layers: int) -> tuple[dict[str, int], int]:
    """Peak RSS per stage of a fresh build, and the size of its engine's weights."""
    source = make_checkpoint(root / "source", "llama", num_hidden_layers=layers, **WIDTH)
    recipe = write_recipe(root / "recipe.yaml", source, **RECIPE)
    args = [str(recipe), str(root / "artifact"), str(root / "cache")]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    peaks = {s["stage"]: s["peak_rss_bytes"] for s in result["stages"]}
    engine = root / "artifact" / "engines" / "onnxruntime-cpu" / "model.onnx.data"
    return peaks, engine.stat().st_size


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_every_stage_peak_is_flat_in_depth(tmp_path):
    (shallow, engine_a), (deep, engine_b) = (_build(tmp_path / f"l{n}", n) for n in DEPTHS)
    extra_float = (DEPTHS[1] - DEPTHS[0]) * _layer_bytes()
    mib = 2**20
    engine_bytes = (engine_b - engine_a) / mib
    lines = [f"12 float layers {extra_float / mib:.0f} MiB, engine data +{engine_bytes:.1f} MiB"]
    for stage in shallow:
        lines.append(
            f"{stage}: {shallow[stage] / mib:.0f} -> {deep[stage] / mib:.0f} MiB "
            f"({(deep[stage] - shallow[stage]) / mib:+.1f})"
        )
    print("\n".join(lines))
    assert list(shallow) == ["quantize", "export", "engine:onnxruntime-cpu", "package"]
    for stage in ("quantize", "export", "package"):
        assert deep[stage] - shallow[stage] < extra_float / 3, stage
    engine_growth = deep["engine:onnxruntime-cpu"] - shallow["engine:onnxruntime-cpu"]
    assert engine_growth < 3 * (engine_b - engine_a)
