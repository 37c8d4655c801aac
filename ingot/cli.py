"""The ``ingot`` command line. Heavy imports stay inside commands: a pod runs ``generate`` /
``verify`` with the runtime install only (no torch).

Commands raise; the group reports (ingot/cli_errors.py): a user error is one line, exit 1;
anything else is an internal error with its traceback, exit 70; ``--debug`` shows every
traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ingot.cli_errors import UserError, report
from ingot.cli_speculative import SPECULATIVE_HELP, SpeculativeConfigParam
from ingot.progress import StageProgress

__all__ = ["main"]


class _Main(click.Group):
    """The group: every command's exception ends here, reported as a user or internal error."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click reports these itself (usage errors: exit 2)
        except Exception as e:  # noqa: BLE001 - reported by kind, never swallowed
            ctx.exit(report(e, debug=ctx.params.get("debug", False)))


@click.group(cls=_Main)
@click.option(
    "--debug", is_flag=True, help="Print the traceback of every error, user errors included."
)
@click.version_option(package_name="ingot")
def main(debug: bool) -> None:
    """ingot: compile an LLM recipe into a verified artifact, and run it."""


@main.command()
@click.option("--recipe", "recipe_path", required=True, type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(file_okay=False), help="Artifact directory (out/<name>).")
@click.option("--cache-dir", type=click.Path(file_okay=False), help="Stage cache (~/.cache/ingot).")
@click.option("--json", "as_json", is_flag=True, help="Print path, digest and stages as JSON.")
def build(recipe_path: str, out: str | None, cache_dir: str | None, as_json: bool) -> None:
    """Build the artifact a recipe describes."""
    # torch and the build's packages load when a build runs, not for `ingot --help`
    from ingot.pipeline.build import build as run_build
    from ingot.pipeline.cache import StageCache

    with StageProgress(enabled=not as_json) as progress:  # stopped before errors print
        result = run_build(
            recipe_path,
            out,
            cache=StageCache(Path(cache_dir)) if cache_dir else None,
            on_stage=progress.update,
        )
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    click.echo(f"artifact  {result.artifact}")
    click.echo(f"digest    {result.digest}")
    for run in result.stages:
        state = "cached" if run.cached else "built"
        peak = "" if run.peak_rss_bytes is None else f"  peak {run.peak_rss_bytes / 2**30:5.2f} GiB"
        click.echo(f"  {run.stage:<28} {state:<7} {run.seconds:7.2f}s{peak}")


@main.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def inspect(artifact: str, as_json: bool) -> None:
    """Show an artifact's manifest: model, quantization, engines, files."""
    from ingot.artifacts import read_manifest  # pydantic: loads when the command runs

    manifest = read_manifest(Path(artifact))  # ArtifactError: a user error
    if as_json:
        click.echo(json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True))
        return
    m = manifest.model
    click.echo(f"{manifest.name} {manifest.version}")
    click.echo(
        f"  model      {m.architecture}: {m.num_layers} layers, hidden {m.hidden_size}, "
        f"heads {m.num_heads}/{m.num_kv_heads}, vocab {m.vocab_size}, max_seq_len {m.max_seq_len}"
    )
    for q in m.quantization:
        click.echo(f"  quantize   {_quantization(q)}")
    g = manifest.graph
    kv = f"kv {g.kv_dtype} blocks of {g.kv_block_size}"
    click.echo(f"  graph      {g.path} (opset {g.opset}), {kv}")
    for e in manifest.engines:
        click.echo(f"  engine     {e.name}: {e.path} requires {e.requires}")
    if manifest.speculative is not None:
        _echo_speculative(manifest)
    total = sum(f.size for f in manifest.files)
    click.echo(f"  files      {len(manifest.files)}, {total / 2**20:.1f} MiB")
    for f in manifest.files:
        click.echo(f"    {f.size:>12,}  {f.sha256[:12]}  {f.path}")


def _quantization(q: dict[str, Any]) -> str:
    """A manifest's quantize record in words: its method's own (`QuantMethod.describe`), or
    the method's name where this install has no such plug-in."""
    # Loads when inspect runs; the plug-ins import no torch: inspect runs on a runtime install.
    from ingot.pipeline.quantize.method import QUANT_METHODS

    method = q["method"]
    what = QUANT_METHODS.get(method).describe(q) if method in QUANT_METHODS else method
    return f"{what}: {q['modules']} modules"


def _echo_speculative(manifest) -> None:
    """inspect's lines for manifest.speculative: the method, the Medusa heads, the EAGLE-3
    draft or the draft model and its engines, and the mean accepted length the build measured
    (eval.speculative), if it did."""
    spec = manifest.speculative
    line = f"{spec.method}, k={spec.num_speculative_tokens}"
    if spec.method == "ngram":
        line += f", prompt lookup {spec.prompt_lookup_min}..{spec.prompt_lookup_max}"
    measured = (manifest.eval or {}).get("speculative")
    if measured is not None:
        line += (
            f"; mean accepted length {measured['mean_accepted_length']:.2f} "
            f"({measured['prompts']} prompts of {measured['dataset']})"
        )
    click.echo(f"  speculate  {line}")
    heads = getattr(spec, "heads", None)
    if heads is not None:
        origin = heads.origin
        if heads.training is not None:
            agreement = " / ".join(f"{a:.2f}" for a in heads.training["held_out_agreement"])
            origin += f" {heads.training['steps']} steps, held-out agreement {agreement}"
        click.echo(
            f"  heads      medusa: {heads.num_heads} heads of {heads.num_layers} layer(s), "
            f"{heads.path} ({origin})"
        )
    eagle = getattr(spec, "eagle", None)  # manifests from before EAGLE have none
    if eagle is not None:
        origin = eagle.origin
        if eagle.training is not None:
            shares = " / ".join(f"{a:.2f}" for a in eagle.training["held_out_acceptance"])
            origin += f" {eagle.training['steps']} steps, held-out acceptance {shares}"
        click.echo(
            f"  eagle      eagle3: 1 layer, hidden {eagle.hidden_size}, draft vocab "
            f"{eagle.draft_vocab_size}, aux layers {eagle.aux_layers}, {eagle.path} ({origin})"
        )
    if spec.draft is None:
        return
    d = spec.draft.model
    click.echo(
        f"  draft      {d.architecture}: {d.num_layers} layers, hidden {d.hidden_size}, "
        f"heads {d.num_heads}/{d.num_kv_heads}, vocab {d.vocab_size}"
    )
    for q in d.quantization:
        click.echo(f"  draft q    {_quantization(q)}")
    for e in spec.draft.engines:
        click.echo(f"  draft eng  {e.name}: {e.path}")


@main.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--verify-key", type=click.Path(exists=True, dir_okay=False), default=None,
    help="PEM public key: also require model.sig to be a valid signature by it.",
)  # fmt: skip
@click.option(
    "--full", is_flag=True,
    help="Re-hash every file, even where the store recorded its stat when it was verified.",
)  # fmt: skip
def verify(artifact: str, verify_key: str | None, full: bool) -> None:
    """Check every file of an artifact against its manifest (exit 1 on any mismatch). A
    partial pull's artifact (ingot.partial.json) is checked for the files it has and the
    absent ones are listed: exit 0 when what is there is intact. A directory in the local
    store is checked by the stat recorded when it was pulled, unless --full."""
    # the artifact modules (pydantic) load when the command runs, not for `ingot --help`
    from ingot.artifacts.signing import verify_signature
    from ingot.artifacts.store import verify_stored

    # A mismatch is an ArtifactError: a user error, exit 1.
    if verify_key is not None:
        verify_signature(Path(artifact), verify_key)
    verified = verify_stored(Path(artifact), full=full)
    manifest = verified.manifest
    signed = "  signature ok" if verify_key is not None else ""
    partial = f"  partial: {len(verified.absent)} files absent" if verified.absent else ""
    click.echo(f"ok  {manifest.name} {manifest.version}  {verified.digest}{signed}{partial}")
    if verified.partial is not None:
        click.echo(f"  pulled roles: {', '.join(sorted(verified.partial.roles))}")
        for path in verified.absent:
            click.echo(f"  absent  {path}")


@main.command()
def schema() -> None:
    """Print the recipe JSON Schema."""
    from ingot.pipeline.recipe import recipe_json_schema  # pydantic: when the command runs

    click.echo(json.dumps(recipe_json_schema(), indent=2, sort_keys=True))


@main.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--prompt", required=True)
@click.option("--max-tokens", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0))
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--seed", default=None, type=int)
@click.option("--json", "as_json", is_flag=True, help="Print the token ids and text as JSON.")
@click.option(
    "--speculative-config", type=SpeculativeConfigParam(), default=None, help=SPECULATIVE_HELP
)
@click.option(
    "--engine",
    default=None,
    help="The artifact's engine to run, by name (openvino-cpu) or kind (openvino). "
    "[default: the first one this host runs, in the recipe's targets order]",
)
def generate(
    artifact: str,
    prompt: str,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    as_json: bool,
    speculative_config: dict[str, Any] | bool | None,
    engine: str | None,
) -> None:
    """Generate text from an artifact (greedy at temperature 0)."""
    # the runtime (onnxruntime, numpy, pydantic) loads when the command runs
    from ingot.artifacts import ArtifactError
    from ingot.runtime import LoadedModel, SamplingParams
    from ingot.runtime.engine_select import EngineUnavailable

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)
    try:
        model = LoadedModel.load(artifact, speculative_config=speculative_config, engine=engine)
    except ArtifactError as e:
        raise UserError(f"refusing to load {artifact}: {e}") from e
    except EngineUnavailable as e:
        raise UserError(f"--engine: {e}") from e
    except ValueError as e:  # the speculative config (the artifact verified)
        raise UserError(f"--speculative-config: {e}") from e
    generator = model.generator()
    if as_json:
        [completion] = generator.generate([prompt], params)
        click.echo(
            json.dumps(
                {
                    "prompt_token_ids": completion.prompt_token_ids,
                    "token_ids": completion.token_ids,
                    "text": completion.text,
                    "finish_reason": completion.finish_reason,
                }
            )
        )
        return
    click.echo(prompt, nl=False)
    for delta in generator.stream(prompt, params):
        click.echo(delta, nl=False)
    click.echo()


# Commands that live in their own modules register themselves here (one line each), so the
# CLI's file stays short: ingot/cli_<topic>.py defines `register(main)`.
from ingot.cli_serve import register as _register_serve  # noqa: E402

_register_serve(main)
from ingot.cli_registry import register as _register_registry  # noqa: E402

_register_registry(main)
from ingot.cli_plan import register as _register_plan  # noqa: E402

_register_plan(main)
from ingot.cli_sweep import register as _register_sweep  # noqa: E402

_register_sweep(main)
