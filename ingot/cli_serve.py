"""`ingot serve`: the OpenAI-compatible HTTP server (runtime install only, imports stay lazy)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from ingot.cli_errors import UserError
from ingot.cli_speculative import SPECULATIVE_HELP, SpeculativeConfigParam
from ingot.common.errors import IngotError

__all__ = ["register"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20}
_UNITS["gib"] = 2**30


class ByteSize(click.ParamType):
    """`256MiB`, `1GiB`, `500MB` or a plain number of bytes; with `auto=True` also `auto`
    (None: the runtime picks the size)."""

    name = "size"

    def __init__(self, auto: bool = False) -> None:
        self.auto = auto

    def convert(self, value, param, ctx) -> int | None:
        if isinstance(value, int) or value is None:
            return value
        if self.auto and str(value).strip().lower() == "auto":
            return None
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = match and match.group(2).lower()
        if not match or unit not in _UNITS:
            self.fail(f"{value!r} is not a size such as 256MiB, 1GiB or 500MB", param, ctx)
        return int(float(match.group(1)) * _UNITS[unit])


# The options of `ingot serve`, outermost first (applied in reverse, as decorators are).
_SERVE_OPTIONS = (
    click.argument("artifact"),  # a directory, or oci://… pulled into the local store first
    click.option("--host", default="127.0.0.1", show_default=True),
    click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535)),
    click.option(  # the default is runtime.generate.DEFAULT_MAX_NUM_SEQS (tested)
        "--max-num-seqs",
        default=64,
        show_default=True,
        type=click.IntRange(min=1),
        help="Requests running at once.",
    ),  # fmt: skip
    click.option(
        "--max-queue",
        default=64,
        show_default=True,
        type=click.IntRange(min=0),
        help="Requests waiting beyond those; more get 503 + Retry-After.",
    ),  # fmt: skip
    click.option(
        "--kv-cache-memory",
        "kv_cache_bytes",
        default="auto",
        show_default=True,
        type=ByteSize(auto=True),
        help="KV cache budget, e.g. 256MiB; auto: half the memory available once the weights "
        "are loaded, at most --max-num-seqs sequences of the model's max_seq_len.",
    ),  # fmt: skip
    click.option(
        "--max-num-batched-tokens",
        default=2048,
        show_default=True,
        type=click.IntRange(min=1),
        help="Tokens per scheduler step (decodes + the padded prefill chunk).",
    ),  # fmt: skip
    click.option(
        "--enable-prefix-caching/--no-enable-prefix-caching", default=True, show_default=True
    ),
    click.option(
        "--scheduling-policy",
        default="fcfs",
        show_default=True,
        type=click.Choice(["fcfs", "priority"]),
        help="fcfs: first come, first served. priority: by each request's `priority` (lower "
        "first, ties by arrival); preemption takes the highest value, latest arrival.",
    ),  # fmt: skip
    click.option("--served-model-name", default=None, help="Model id in the API (artifact name)."),
    click.option(
        "--request-timeout",
        default=None,
        type=click.FloatRange(min=0, min_open=True),
        help="Seconds after which a request is aborted (408).",
    ),  # fmt: skip
    click.option(
        "--shutdown-grace",
        default=30.0,
        show_default=True,
        type=click.FloatRange(min=0),
        help="Seconds in-flight requests get to finish after SIGTERM.",
    ),  # fmt: skip
    click.option(
        "--log-level",
        default="info",
        show_default=True,
        type=click.Choice(["debug", "info", "warning", "error"]),
    ),  # fmt: skip
    click.option(
        "--verify-key",
        type=click.Path(exists=True, dir_okay=False),
        default=None,
        help="PEM public key: refuse an artifact without a valid signature (model.sig) by it.",
    ),  # fmt: skip
    click.option(
        "--max-request-bytes",
        default="16MiB",
        show_default=True,
        type=ByteSize(),
        help="Larger request bodies get 413, before they are parsed.",
    ),  # fmt: skip
    click.option(
        "--chat-template",
        type=click.Path(exists=True, dir_okay=False),
        default=None,
        help="Jinja chat template file, used instead of the artifact's (or where it has none).",
    ),  # fmt: skip
    click.option(
        "--speculative-config",
        type=SpeculativeConfigParam(),
        default=None,
        help=SPECULATIVE_HELP,
    ),  # fmt: skip
    click.option(
        "--engine",
        default=None,
        help="The artifact's engine to run, by name (openvino-cpu) or kind (openvino). "
        "[default: the first one this host runs, in the recipe's targets order]",
    ),  # fmt: skip
    click.option(
        "--max-tokenize-tokens",
        default=None,
        type=click.IntRange(min=1),
        help="/tokenize refuses longer prompts (400). [default: the model's max_seq_len]",
    ),  # fmt: skip
    click.option(
        "--keep-alive-timeout",
        default=5.0,
        show_default=True,
        type=click.FloatRange(min=0, min_open=True),
        help="Seconds an idle connection stays open, before its first request or after one.",
    ),  # fmt: skip
    click.option(
        "--request-read-timeout",
        default=20.0,
        show_default=True,
        type=click.FloatRange(min=0, min_open=True),
        help="Seconds a request's headers and body have to arrive, plus one per 500 bytes "
        "received; slower uploads get 408 and are closed.",
    ),  # fmt: skip
)


def _with_serve_options(command: Any) -> Any:
    for option in reversed(_SERVE_OPTIONS):
        command = option(command)
    return command


def register(main: click.Group) -> None:
    main.command(name="serve")(serve)


@_with_serve_options
def serve(
    artifact: str,
    served_model_name: str | None,
    verify_key: str | None,
    chat_template: str | None,
    **options: Any,
) -> None:
    """Serve an artifact over HTTP with OpenAI's API (/v1/completions, /v1/chat/completions,
    /v1/models, /health, /metrics) and vLLM's /tokenize, /detokenize, /version."""
    # The runtime (onnxruntime, numpy, pydantic) loads when the server starts, not for
    # `ingot --help` or another command.
    from ingot.artifacts import ArtifactError, read_manifest
    from ingot.artifacts.resolve import resolve_artifact
    from ingot.artifacts.signing import check_signature
    from ingot.runtime.engine_select import EngineUnavailable, select_engine
    from ingot.runtime.kv_pool import KVCacheAllocationFailed, KVCacheTooSmall
    from ingot.runtime.memory import format_bytes
    from ingot.runtime.server.launch import ForcedShutdown, ServeOptions, run_server
    from ingot.runtime.speculative.load import resolve_config

    template = _read_chat_template(Path(chat_template)) if chat_template else None

    try:
        artifact = str(resolve_artifact(artifact))  # oci://…: pull, or reuse the store
        check_signature(artifact, verify_key=verify_key)  # before anything is loaded
        manifest = read_manifest(Path(artifact))
        name = served_model_name or manifest.name
    except IngotError as e:  # a bad artifact, reference or registry
        raise UserError(f"refusing to serve {artifact}: {e}") from e
    try:  # before the server starts: a bad config is the user's flag, not a load failure
        resolve_config(manifest, options["speculative_config"])
    except ValueError as e:
        raise UserError(f"--speculative-config: {e}") from e
    if options["engine"] is not None:
        try:  # before the server starts, as the speculative config
            select_engine(manifest, requested=options["engine"])
        except EngineUnavailable as e:
            raise UserError(f"--engine: {e}") from e
    # The other options carry ServeOptions' field names; click has checked their values.
    verify_key_file = Path(verify_key) if verify_key else None  # checked again at load
    serve_options = ServeOptions(**options, verify_key=verify_key_file, chat_template=template)
    # A load failure stops the server; say it in the user's words (their flags).
    try:
        run_server(artifact, name, serve_options)
    except (KVCacheTooSmall, KVCacheAllocationFailed) as e:
        kv = serve_options.kv_cache_bytes
        given = "--kv-cache-memory " + ("auto" if kv is None else format_bytes(kv, sep=""))
        raise UserError(e.explain("--kv-cache-memory", given)) from e
    except ArtifactError as e:  # the files do not verify
        raise UserError(f"refusing to serve {artifact}: {e}") from e
    except ForcedShutdown as e:  # 128 + the signal: what a shell reports for a killed process
        click.secho(f"ingot serve: {e}", fg="red", err=True)
        raise SystemExit(128 + e.signal) from e


def _read_chat_template(path: Path) -> str:
    """The template in `path`, checked to compile in the sandbox the server renders it in."""
    # the runtime loads when the command runs, as in `serve`
    from ingot.runtime.tokenizer import ChatTemplateError, check_chat_template

    try:
        source = path.read_text(encoding="utf-8")
        check_chat_template(source)
    except UnicodeDecodeError as e:
        raise UserError(f"--chat-template {path}: not UTF-8 text ({e.reason})") from e
    except ChatTemplateError as e:
        raise UserError(f"--chat-template {path}: {e}") from e
    return source
