"""`ingot plan`: the memory and time a build will need, printed before any work, and what
this machine has of each; `ingot plan ARTIFACT --serve` the memory serving it takes
(cli_plan_serve.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ingot.cli_plan_serve import SERVE_OPTIONS, plan_serve

__all__ = ["register"]


def register(main: click.Group) -> None:
    @main.command()
    @click.argument("artifact", required=False)
    @click.option(
        "--recipe",
        "recipe_path",
        type=click.Path(dir_okay=False),
        help="The recipe whose build to plan.",
    )
    @click.option(
        "--config",
        "config_path",
        type=click.Path(exists=True, dir_okay=False),
        help="The model's config.json to plan with, instead of the source's (the hub is not "
        "contacted): e.g. a vendored copy, to plan a hub recipe offline.",
    )
    @click.option(
        "--out", type=click.Path(file_okay=False), help="Artifact directory (out/<name>)."
    )
    @click.option(
        "--cache-dir", type=click.Path(file_okay=False), help="Stage cache (~/.cache/ingot)."
    )
    @click.option("--json", "as_json", is_flag=True, help="Print the estimate as JSON.")
    @_with(SERVE_OPTIONS)
    def plan(
        artifact: str | None,
        recipe_path: str | None,
        config_path: str | None,
        out: str | None,
        cache_dir: str | None,
        as_json: bool,
        **serve: Any,
    ) -> None:
        """Estimate peak memory and time per stage (from config.json and the recipe only),
        and check RAM, GPU memory and disk against this machine. With ARTIFACT (a directory
        or oci://...) and --serve: the memory `ingot serve` holds and the KV cache --memory
        leaves (weights, engine overhead, KV bytes per token, sequences that fit, the options
        to serve with, the container's memory request and limit)."""
        if (artifact is None) == (recipe_path is None):  # a usage error, as click's own
            raise click.UsageError(
                "Missing option '--recipe' (plan a build), or ARTIFACT --serve (plan serving "
                "it); not both"
            )
        if artifact is not None:
            plan_serve(artifact, as_json=as_json, **serve)
            return
        if serve["serve"]:
            raise click.UsageError("--serve plans an artifact: ingot plan ARTIFACT --serve ...")
        _plan_build(recipe_path, config_path, out, cache_dir, as_json)


def _plan_build(
    recipe_path: str, config_path: str | None, out: str | None, cache_dir: str | None, as_json: bool
) -> None:
    """`ingot plan --recipe`: the build's estimate per stage and this machine's resources."""
    # torch (the plan's model sizes) loads when the command runs, not for `ingot --help`
    from ingot.pipeline.cache import StageCache
    from ingot.pipeline.plan import format_bytes, format_seconds, plan_build, read_hf_config
    from ingot.pipeline.recipe import load_recipe
    from ingot.pipeline.resources import calibration_device, check_resources

    # RecipeError, ConfigError, SourceError, OSError: user errors, reported by the group
    recipe = load_recipe(recipe_path)
    config, local = read_hf_config(
        recipe.stage_slice("source")["source"], Path(config_path) if config_path else None
    )
    estimate = plan_build(recipe, Path(recipe_path), config, local)
    calibrated = any(s.stage == "calibrate" for s in estimate.stages)
    resources = check_resources(
        estimate,
        cache_dir=StageCache(Path(cache_dir) if cache_dir else None).root,
        out_dir=Path(out) if out else Path("out") / recipe.artifact.name,
        device=calibration_device(recipe) if calibrated else None,
    )
    if as_json:
        report = {**estimate.to_json(), "resources": resources.to_json()}
        click.echo(json.dumps(report, indent=2))
        return
    m = estimate.model
    click.echo(f"plan  {recipe_path}: {_model_line(m)}")
    if "draft" in m:
        click.echo(f"  draft model: {_model_line(m['draft'])}")
    width = max(24, *(len(s.stage) for s in estimate.stages))  # draft-engine:... is long
    click.echo(f"  {'stage':<{width}} {'peak memory':>12} {'time':>10}  notes")
    for s in estimate.stages:
        click.echo(
            f"  {s.stage:<{width}} {format_bytes(s.peak_bytes):>12} "
            f"{format_seconds(s.seconds):>10}  {s.notes}"
        )
    peak = estimate.peak
    total = sum(s.seconds for s in estimate.stages)
    click.echo(
        f"  peak {format_bytes(peak.peak_bytes)} ({peak.stage}), "
        f"total ~{format_seconds(total)} (estimates; constants in ingot.pipeline.plan)"
    )
    click.echo("resources on this machine:")
    for line in resources.lines():
        click.echo(f"  {line}")
    click.echo(f"  {resources.verdict()}")


def _with(options: tuple) -> Any:
    def apply(command: Any) -> Any:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


def _model_line(model: dict) -> str:
    kv = model["kv_cache"]
    experts = model.get("experts")
    active = (
        f" ({model['active_params'] / 1e6:.1f} M active: {experts['per_token']} of "
        f"{experts['count']} experts per token; widest layer "
        f"{experts['widest_layer_params'] / 1e6:.1f} M)"
        if experts
        else ""
    )
    return (
        f"{model['architecture']}, {model['layers']} layers, hidden {model['hidden_size']}, "
        f"{model['params'] / 1e6:.1f} M params{active}, KV cache {kv['dtype']} "
        f"{kv['bytes_per_token']} bytes/token"
    )
