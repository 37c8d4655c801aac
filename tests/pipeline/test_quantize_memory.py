"""The quantize stage's peak memory does not grow with depth: it holds one decoder layer at a
time, never the whole model.

Two random checkpoints of equal width, 4 and 16 layers, each quantized by the stage in a fresh
interpreter that reports its own peak RSS (VmHWM). Twelve more float layers would cost
12 x (one layer); the test allows a third of that for noise (allocator, page cache of the
mapped shards), so a stage that loads the whole model, or keeps every finished layer, fails.
Not timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fixtures import DEPTH_WIDTH as WIDTH
from fixtures import make_checkpoint

DEPTHS = (4, 16)
RTN = {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": True, "ignore": []}
GPTQ = {
    "method": "gptq",
    "bits": 4,
    "group_size": 32,
    "targets": ["re:layers\\..*"],
    "ignore": [],
    "true_sequential": False,
}

_CHILD = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path

    from ingot.pipeline.recipe.quantize import quantize_entry
    from ingot.pipeline.stages.quantize import run_quantize

    source, out, entry, calibration, work = sys.argv[1:6]
    Path(out).mkdir()
    kwargs = {}
    if calibration != "-":
        kwargs = {"calibration_dir": Path(calibration), "work_dir": Path(work)}
    run_quantize(Path(source), [quantize_entry(json.loads(entry))], Path(out), **kwargs)
    # This process's own peak: VmHWM. (ru_maxrss is no use here: Linux carries the forking
    # parent's RSS, the whole test process, over the exec into the child's.)
    status = Path("/proc/self/status")
    if status.exists():
        hwm = [line for line in status.read_text().splitlines() if line.startswith("VmHWM:")]
        print(int(hwm[0].split()[1]) * 1024)
    else:
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    """
)


def _layer_bytes() -> int:
    h, i = WIDTH["hidden_size"], WIDTH["intermediate_size"]
    return (4 * h * h + 3 * h * i + 2 * h) * 4  # q, k, v, o (MHA), gate, up, down, norms


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("deep")
    return {
        n: make_checkpoint(root / f"l{n}", "llama", num_hidden_layers=n, **WIDTH) for n in DEPTHS
    }


@pytest.fixture(scope="module")
def calibration_dir(tmp_path_factory):
    from ingot.calibration.dataset import CalibrationSet

    root = tmp_path_factory.mktemp("calibration")
    tokens = np.random.default_rng(0).integers(2, WIDTH["vocab_size"], size=(4, 32))
    CalibrationSet(tokens.astype(np.int64), list(range(4)), "sha256:test").save(root)
    return root


def _peak(source: Path, out: Path, entry: dict, calibration: Path | None) -> int:
    args = [str(source), str(out), json.dumps(entry)]
    args += (
        [str(calibration), str(out.with_name(out.name + "-work"))] if calibration else ["-", "-"]
    )
    # One malloc arena: each thread's own arena otherwise adds tens of MiB to the peak, more or
    # less from run to run (+-30 MiB measured), which would drown the layers' 13 MiB each.
    env = {**os.environ, "MALLOC_ARENA_MAX": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, check=False, env=env
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return int(done.stdout.split()[-1])


@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_quantize_peak_memory_is_independent_of_depth(
    tmp_path, checkpoints, calibration_dir, method
):
    entry, calibration = (RTN, None) if method == "rtn" else (GPTQ, calibration_dir)
    peaks = {n: _peak(checkpoints[n], tmp_path / f"q{n}", entry, calibration) for n in DEPTHS}
    extra_layers = DEPTHS[1] - DEPTHS[0]
    growth = peaks[DEPTHS[1]] - peaks[DEPTHS[0]]
    mib = 2**20
    print(
        f"{method} quantize peak RSS: {DEPTHS[0]} layers {peaks[DEPTHS[0]] / mib:.1f} MiB, "
        f"{DEPTHS[1]} layers {peaks[DEPTHS[1]] / mib:.1f} MiB (+{growth / mib:.1f} MiB; "
        f"{extra_layers} float layers = {extra_layers * _layer_bytes() / mib:.1f} MiB)"
    )
    assert growth < extra_layers * _layer_bytes() / 3
