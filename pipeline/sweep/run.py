"""`ingot sweep`: every variant of a base recipe written and checked, built through an
executor into one shared stage cache, measured the same way (quality, size, speed, build time
and memory), and compared: DIR/sweep.json, sweep.md, pareto.png.

    DIR/recipes/<name>.yaml     each variant's full recipe (kept for the failed ones too)
    DIR/artifacts/<name>/       each built variant's artifact
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingot.common.errors import IngotError

from ..cache import StageCache
from ..evaluate.text import load_eval_text
from .axes import Axes, load_axes
from .executor import BuildJob, BuildOutcome, make_executor
from .markdown import render_sweep
from .pareto import HIGHER, LOWER, pareto_flags
from .plot import require_matplotlib, write_plot
from .quality import OodWindows, Quality, measure_quality
from .recipes import VariantRecipe, base_recipe, one_line, write_variants
from .results import Row, write_sweep
from .speed import SpeedReport, measure_speed
from .variants import expand

__all__ = ["SweepSettings", "run_sweep"]

ARTIFACTS = "artifacts"


@dataclass(frozen=True, slots=True)
class SweepSettings:
    recipe: Path  # the base recipe
    axes: Path  # the axes file
    out: Path  # DIR
    executor: str = "local"  # an EXECUTORS name
    cache_root: Path | None = None  # the shared stage cache (the build's default)
    executor_options: dict[str, Any] = field(default_factory=dict)  # local's jobs, ray's address


def run_sweep(settings: SweepSettings, log: Callable[[str], None] = print) -> list[Row]:
    """Run the sweep `settings` describe; the rows as written to sweep.json. Bad input (the
    axes, the base recipe, the out-of-domain text) fails before any build; a variant that
    fails is a row with its `error`."""
    out = settings.out
    require_matplotlib()
    # The executor first: a bad --executor-option fails before anything is read or written.
    executor = make_executor(settings.executor, **settings.executor_options)
    axes = load_axes(settings.axes)
    spec = base_recipe(settings.recipe).evaluate.perplexity
    ood = load_eval_text(
        axes.ood_text,
        text_field=axes.ood_text_field,
        split=axes.ood_split,
        base_dir=settings.axes.absolute().parent,
        where=f"{settings.axes}: ood_text",
    )
    variants = write_variants(settings.recipe, expand(axes), out)
    windows = OodWindows(ood, variants)  # too short a text fails here, before any build
    for v in variants:
        log(f"variant {v.name}: " + ("ok" if v.error is None else f"skipped: {v.error}"))
    cache_root = StageCache(settings.cache_root).root
    jobs = [
        BuildJob(v.name, v.path.absolute(), (out / ARTIFACTS / v.name).absolute(), cache_root)
        for v in variants
        if v.error is None
    ]
    log(f"building {len(jobs)} variants ({settings.executor} executor, cache {cache_root})")
    outcomes = {o.name: o for o in executor.run(jobs)}
    quality, unmeasured = _quality(variants, outcomes, windows, log)
    built = {name: outcomes[name].artifact for name in quality}
    log(f"timing {len(built)} artifacts")
    speed = _speed(built, axes)
    rows = [_row(v, out, outcomes.get(v.name), quality.get(v.name), speed) for v in variants]
    for row in rows:
        row.error = row.error or unmeasured.get(row.name)
    for row, flag in zip(rows, pareto_flags([r.to_json() for r in rows]), strict=True):
        row.pareto = flag
    about = _about(settings, axes, spec.dataset, speed)
    write_sweep(out, rows, about)
    (out / "sweep.md").write_text(render_sweep(rows, about))
    write_plot(out, rows)
    return rows


def _quality(
    variants: list[VariantRecipe],
    outcomes: dict[str, BuildOutcome],
    windows: OodWindows,
    log: Callable[[str], None],
) -> tuple[dict[str, Quality], dict[str, str]]:
    """Each built variant's quality and size; the one-line reasons of those that could not be
    measured."""
    quality: dict[str, Quality] = {}
    unmeasured: dict[str, str] = {}
    for v in variants:
        outcome = outcomes.get(v.name)
        if outcome is None or outcome.artifact is None:
            continue
        try:
            quality[v.name] = measure_quality(outcome.artifact, windows.of(v))
        except (IngotError, OSError) as e:
            unmeasured[v.name] = f"not measured: {one_line(e)}"
            log(f"variant {v.name}: {unmeasured[v.name]}")
            continue
        log(f"variant {v.name}: built in {outcome.build_s:.1f}s, kl {quality[v.name].kl:.4g}")
    return quality, unmeasured


def _row(
    v: VariantRecipe,
    out: Path,
    outcome: BuildOutcome | None,
    quality: Quality | None,
    speed: SpeedReport,
) -> Row:
    row = Row(v.name, v.path.relative_to(out).as_posix(), error=v.error)
    if outcome is not None:
        row.build_s, row.peak_build_bytes = outcome.build_s, outcome.peak_build_bytes
        row.error = outcome.error
    if quality is not None:
        row.kl, row.perplexity = quality.kl, quality.perplexity
        row.perplexity_ood, row.artifact_bytes = quality.perplexity_ood, quality.artifact_bytes
        timed = speed.results.get(v.name)
        if timed is None:
            row.error = f"speed: not measured ({speed.load.get('error', 'no result')})"
        else:
            row.tok_s_batch1, row.tok_s_batch32 = timed.tok_s_batch1, timed.tok_s_batch32
            row.ttft_ms_p50 = timed.ttft_ms_p50
    return row


def _speed(built: dict[str, Path], axes: Axes) -> SpeedReport:
    """measure_speed over the built variants; when it fails (a worker, or a loaded host with
    refuse_loaded), the report of no results says why, and the rest is still written."""
    if not built:
        return SpeedReport({}, {"error": "nothing built"})
    try:
        return measure_speed(built, **axes.speed.model_dump())
    except IngotError as e:
        return SpeedReport({}, {"quiet": False, "error": one_line(e)})


def _about(settings: SweepSettings, axes: Axes, eval_text: str, speed: SpeedReport) -> dict:
    about: dict[str, Any] = {
        "recipe": str(settings.recipe),
        "axes": str(settings.axes),
        "axes_values": axes.axes,
        "eval_text": eval_text,
        "ood_text": axes.ood_text,
        "pareto": {"lower": list(LOWER), "higher": list(HIGHER)},
        "speed": {**axes.speed.model_dump(mode="json"), "load": speed.load},
    }
    if axes.variants is not None:
        about["variants_listed"] = len(axes.variants)
    return about
