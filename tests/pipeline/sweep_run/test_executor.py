"""The sweep's executors: found by name, every job an outcome (a failed build with its reason,
the others finished), each build measured in its own process."""

from __future__ import annotations

import pytest

from ingot.artifacts import verify_artifact
from ingot.common import IngotError
from ingot.pipeline.sweep.executor import (
    EXECUTORS,
    BuildJob,
    ExecutorOptionError,
    make_executor,
)
from ingot.pipeline.sweep.executors.local import LocalExecutor, parallel_builds


def test_registry_names_the_built_in_executors():
    assert EXECUTORS.names()[:2] == ("local", "ray")
    assert isinstance(make_executor("local", jobs=2), LocalExecutor)


def test_an_unknown_executor_is_one_line_naming_the_known_ones():
    with pytest.raises(IngotError) as error:
        make_executor("slurm")
    assert str(error.value) == "unknown executor 'slurm' (known: local, ray)"


@pytest.mark.parametrize("options", [{"workers": 2}, {"jobs": 0}])
def test_a_bad_executor_option_is_one_line(options):
    with pytest.raises(ExecutorOptionError, match="^executor local: ") as error:
        make_executor("local", **options)
    assert "\n" not in str(error.value)


def test_width_is_capped_by_jobs_and_by_memory(tmp_path, sweep_recipes, monkeypatch):
    from ingot.pipeline.sweep.executors import local

    jobs = [BuildJob(f"v{i}", sweep_recipes["g32"], tmp_path / f"v{i}", tmp_path) for i in range(4)]
    assert parallel_builds(jobs, limit=3) == 3
    assert parallel_builds(jobs[:2], limit=3) == 2  # never more than there are builds
    peak = local.planned_peak_bytes(sweep_recipes["g32"])
    assert peak is not None and peak > 0
    monkeypatch.setattr(local, "host_memory_available", lambda: (2 * peak + 1, ""))
    assert parallel_builds(jobs, limit=4) == 2
    monkeypatch.setattr(local, "host_memory_available", lambda: (peak // 2, ""))
    assert parallel_builds(jobs, limit=4) == 1  # one at a time even when none fits


def test_a_failed_build_is_an_outcome_and_the_others_finish(local_outcomes):
    assert [o.name for o in local_outcomes] == ["g32", "bad", "g64"]  # the jobs' order
    good, bad, other = local_outcomes
    assert bad.artifact is None
    assert bad.error is not None and "quantize.0.bits" in bad.error and "\n" not in bad.error
    for outcome in (good, other):
        assert outcome.error is None and outcome.artifact is not None
        assert outcome.artifact.is_absolute() and outcome.artifact.name == outcome.name
        assert verify_artifact(outcome.artifact).name == "tiny"
    for outcome in local_outcomes:  # each process's own: more than an interpreter, under the RAM
        assert 20 << 20 < outcome.peak_build_bytes < 64 << 30
        assert 0 < outcome.build_s < 600


def test_a_builds_peak_is_its_own_not_the_parents(tmp_path, sweep_recipes, local_outcomes):
    """ru_maxrss of a child keeps the high-water mark of the memory it was forked from: a parent
    holding more than a build needs must not read as every build's peak. Built from the shared
    cache (its stages cached: the outcome's peak is the build's own, small)."""
    import numpy as np

    from ingot.pipeline.sweep.build_worker import run_build

    own = local_outcomes[0].peak_build_bytes
    held = np.ones((own + (512 << 20)) // 8)  # the parent now holds more than that build's peak
    cache = local_outcomes[0].artifact.parent / "cache"
    outcome = run_build(BuildJob("again", sweep_recipes["g32"], tmp_path / "again", cache))
    assert outcome.error is None
    assert outcome.peak_build_bytes < held.nbytes
