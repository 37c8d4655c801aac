"""`ingot sweep`: build and measure every variant of a recipe along the axes of an axes file,
mark the Pareto front, and optionally pick one (`--pick`, `--maximize` / `--minimize`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

__all__ = ["register"]


def register(main: click.Group) -> None:
    @main.command()
    @click.option("--recipe", "recipe_path", type=click.Path(dir_okay=False), help="Base recipe.")
    @click.option("--axes", "axes_path", type=click.Path(dir_okay=False), help="Axes file.")
    @click.option("--out", required=True, type=click.Path(file_okay=False), help="Sweep DIR.")
    @click.option(
        "--executor", default="local", show_default=True, help="Where builds run: local, ray."
    )
    @click.option(
        "--executor-option",
        "executor_options",
        multiple=True,
        metavar="KEY=VALUE",
        help="An option of the executor (local: jobs=2; ray: address=HOST:6379), repeatable.",
    )
    @click.option(
        "--cache-dir", type=click.Path(file_okay=False), help="Stage cache (~/.cache/ingot)."
    )
    @click.option("--pick", "pick_text", help='Constraints, e.g. "kl<=0.02,artifact_bytes<=1GiB".')
    @click.option("--maximize", help="Pick the variant with the highest FIELD (tok_s_batch32).")
    @click.option("--minimize", help="Pick the variant with the lowest FIELD (default: kl).")
    def sweep(
        recipe_path: str | None,
        axes_path: str | None,
        out: str,
        executor: str,
        executor_options: tuple[str, ...],
        cache_dir: str | None,
        pick_text: str | None,
        maximize: str | None,
        minimize: str | None,
    ) -> None:
        """Build every variant of a recipe (the product of the axes, or their listed
        variants), measure each (KL, perplexity, size, speed, build time and memory) and
        write DIR/sweep.json, sweep.md and pareto.png; with --pick, --maximize or --minimize
        also DIR/picked.yaml. With --out and --pick alone, pick again from DIR/sweep.json."""
        # torch and the build's packages load when a sweep runs, not for `ingot --help`
        from ingot.pipeline.sweep.pick import objective_of, parse_constraints, pick, write_picked
        from ingot.pipeline.sweep.results import read_sweep
        from ingot.pipeline.sweep.run import SweepSettings, run_sweep

        if (recipe_path is None) != (axes_path is None):
            raise click.UsageError("--recipe and --axes go together (neither: pick again)")
        picking = pick_text is not None or maximize is not None or minimize is not None
        if recipe_path is None and not picking:
            raise click.UsageError("give --recipe and --axes, or --pick to pick from --out")
        if maximize is not None and minimize is not None:
            raise click.UsageError("--maximize and --minimize exclude each other")
        # Options first: a typo fails before any build.
        constraints = parse_constraints(pick_text or "")
        objective = objective_of(maximize, minimize)
        out_dir = Path(out)
        if recipe_path is not None:
            settings = SweepSettings(
                Path(recipe_path),
                Path(axes_path),
                out_dir,
                executor,
                Path(cache_dir) if cache_dir else None,
                _options(executor_options),
            )
            rows = run_sweep(settings, log=lambda line: click.echo(line, err=True))
            for row in rows:
                click.echo(_line(row))
            click.echo(f"results   {out_dir / 'sweep.json'}, sweep.md, pareto.png")
        if picking:
            rows, _ = read_sweep(out_dir)
            chosen = pick(rows, constraints, objective)
            click.echo(f"picked    {chosen.name} -> {write_picked(out_dir, chosen)}")


def _options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """KEY=VALUE pairs, each value a JSON scalar if it reads as one (jobs=2 is the integer 2),
    else a string (address=head:6379)."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--executor-option")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def _line(row) -> str:
    if row.error is not None:
        return f"  {row.name:<32} failed: {row.error}"
    front = "*" if row.pareto else " "
    return (
        f"{front} {row.name:<32} kl {row.kl:9.4g}  ppl {row.perplexity:8.3f}  "
        f"{row.artifact_bytes / 2**20:8.2f} MiB  {row.tok_s_batch1:7.1f} tok/s b1  "
        f"{row.tok_s_batch32:7.1f} tok/s b32"
    )
