"""The Pareto flags against a brute-force check, and --pick: constraints, objectives, the
chosen recipe, and the one line when nothing meets the constraints."""

from __future__ import annotations

import random

import pytest

from ingot.pipeline.sweep.errors import SweepError
from ingot.pipeline.sweep.pareto import pareto_flags
from ingot.pipeline.sweep.pick import objective_of, parse_constraints, pick, write_picked
from ingot.pipeline.sweep.results import Row, read_sweep, write_sweep

SENSES = {"kl": -1, "artifact_bytes": -1, "tok_s_batch1": 1, "tok_s_batch32": 1}


def brute_force_front(rows: list[dict]) -> list[bool]:
    """Independently of pareto.py: a built row is off the front iff another built row is
    no worse on every objective (signs make all 'higher is better') and differs on one."""
    built = [r for r in rows if r["error"] is None]

    def score(r):
        return tuple(sense * r[k] for k, sense in SENSES.items())

    return [
        r["error"] is None
        and not any(
            all(a >= b for a, b in zip(score(o), score(r), strict=True)) and score(o) != score(r)
            for o in built
        )
        for r in rows
    ]


def _row(name: str, kl=0.01, size=100, b1=10.0, b32=100.0, error=None) -> Row:
    return Row(
        name,
        f"recipes/{name}.yaml",
        kl=kl,
        perplexity=5.0,
        perplexity_ood=9.0,
        artifact_bytes=size,
        tok_s_batch1=b1,
        tok_s_batch32=b32,
        ttft_ms_p50=20.0,
        build_s=3.0,
        peak_build_bytes=2**30,
        error=error,
    )


def test_flags_match_a_brute_force_check_on_random_sweeps():
    rng = random.Random(0)
    for _ in range(300):
        rows = [
            _row(
                f"v{i}",
                kl=rng.choice([0.01, 0.02, 0.03]),  # few levels: ties and equal rows happen
                size=rng.choice([100, 200]),
                b1=rng.choice([10.0, 20.0]),
                b32=rng.choice([100.0, 150.0]),
                error=rng.choice([None, None, None, "failed"]),
            ).to_json()
            for i in range(rng.randint(1, 7))
        ]
        assert pareto_flags(rows) == brute_force_front(rows)


def test_flags_by_hand():
    rows = [
        _row("best", kl=0.01, size=100, b1=20, b32=200),
        _row("dominated", kl=0.02, size=100, b1=20, b32=200),  # worse kl only
        _row("twin", kl=0.01, size=100, b1=20, b32=200),  # equal: neither dominates
        _row("fast", kl=0.05, size=300, b1=30, b32=100),  # trades quality for batch-1 speed
        _row("failed", kl=0.0, size=1, b1=99, b32=999, error="boom"),  # dominates nothing
    ]
    flags = pareto_flags([r.to_json() for r in rows])
    assert flags == [True, False, True, True, False]


def test_constraints_with_units_and_the_objective():
    constraints = parse_constraints("kl<=0.02, artifact_bytes<=1GiB,tok_s_batch1>5")
    assert [(c.field, c.op, c.bound) for c in constraints] == [
        ("kl", "<=", 0.02),
        ("artifact_bytes", "<=", 2**30),
        ("tok_s_batch1", ">", 5.0),
    ]
    rows = [
        _row("small", kl=0.015, size=2**29, b32=100),
        _row("fast", kl=0.018, size=2**29, b32=300),
        _row("big", kl=0.001, size=2**31, b32=900),
        _row("broken", kl=0.0, size=1, b32=999, error="x"),
    ]
    assert pick(rows, constraints, objective_of("tok_s_batch32", None)).name == "fast"
    assert pick(rows, constraints, objective_of(None, None)).name == "small"  # lowest kl
    assert pick(rows, [], objective_of(None, "artifact_bytes")).name == "small"  # tie: kl


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kl<<0.1", "--pick: 'kl<<0.1' is not FIELD<=VALUE"),
        ("speed>=3", "--pick: unknown field 'speed'"),
        ("artifact_bytes<=1GB2", "is not FIELD<=VALUE"),
        ("artifact_bytes<=1Gb", "unknown unit 'Gb'"),
    ],
)
def test_bad_constraints_are_one_line(text, message):
    with pytest.raises(SweepError, match=message):
        parse_constraints(text)
    with pytest.raises(SweepError, match="--maximize: unknown field 'fast'"):
        objective_of("fast", None)


def test_nothing_meets_names_the_constraint_that_excluded_the_closest():
    rows = [
        _row("near", kl=0.025, size=2**29),
        _row("nearer", kl=0.021, size=2**29),
        _row("far", kl=0.2, size=2**31),
    ]
    with pytest.raises(SweepError) as error:
        pick(rows, parse_constraints("kl<=0.02,artifact_bytes<=1GiB"), objective_of(None, None))
    assert str(error.value) == (
        "--pick: no variant meets kl<=0.02,artifact_bytes<=1GiB: kl<=0.02 excluded the "
        "closest, nearer (kl 0.021), near (kl 0.025)"
    )


def test_picked_yaml_is_the_variants_recipe_and_re_picking_reads_sweep_json(tmp_path):
    rows = [_row("a", kl=0.01), _row("b", kl=0.02, b32=500)]
    (tmp_path / "recipes").mkdir()
    for row in rows:
        (tmp_path / row.recipe).write_text(f"# recipe {row.name}\n")
    write_sweep(tmp_path, rows, {"recipe": "base.yaml"})
    again, about = read_sweep(tmp_path)
    assert again == rows and about == {"recipe": "base.yaml"}
    chosen = pick(again, [], objective_of("tok_s_batch32", None))
    assert write_picked(tmp_path, chosen).read_text() == "# recipe b\n"
    with pytest.raises(SweepError, match="no such file: run the sweep first"):
        read_sweep(tmp_path / "nothing")


def test_a_failed_speed_measurement_is_each_rows_reason(monkeypatch, tmp_path):
    from ingot.pipeline.sweep import run
    from ingot.pipeline.sweep.axes import Axes
    from ingot.pipeline.sweep.speed import SpeedError

    def refuse(artifacts, **settings):
        raise SpeedError("speed measurement refused: load 3.1 over 2 threads")

    monkeypatch.setattr(run, "measure_speed", refuse)
    report = run._speed({"a": tmp_path}, Axes.model_validate({"axes": {"a": [1]}, "ood_text": "o"}))
    assert report.results == {} and report.load["quiet"] is False
    assert report.load["error"] == "speed measurement refused: load 3.1 over 2 threads"
