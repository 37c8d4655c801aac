"""How the CLI reports a failure: a user error is one line, anything else is a bug.

User errors are a deliberate set: `UserError` (a command's own message, e.g. "refusing to load
ARTIFACT: ..."), the project's error types for bad input listed in `USER_ERROR_TYPES`, and
`OSError` (a missing file, a permission, a full disk, an unreachable hub or registry: the
user's to fix). They print ``error: <message>`` and exit 1; click's usage errors keep
click's own report and exit 2. Any other exception is an internal error: ``internal error,
please report it: <Type>: <message>`` and the traceback, exit 70 (EX_SOFTWARE).

``ingot --debug <command>`` prints the traceback of user errors too.
"""

from __future__ import annotations

import sys
import traceback

import click

from ingot.common.errors import IngotError

__all__ = [
    "INTERNAL_ERROR_EXIT",
    "USER_ERROR_EXIT",
    "USER_ERROR_TYPES",
    "UserError",
    "report",
    "user_error_types",
]

USER_ERROR_EXIT = 1
INTERNAL_ERROR_EXIT = 70  # sysexits.h EX_SOFTWARE; 2 is click's usage error

# (module, class): the project's exceptions for input the user can fix. Looked up in
# sys.modules, not imported: an exception can only have been raised by a loaded module, and
# the runtime install has no torch for pipeline modules to import.
USER_ERROR_TYPES: tuple[tuple[str, str], ...] = (
    ("ingot.artifacts.errors", "ArtifactError"),
    ("ingot.artifacts.reference", "InvalidReference"),
    ("ingot.artifacts.registry_client", "RegistryError"),
    ("ingot.calibration.dataset", "CalibrationError"),
    ("ingot.pipeline.evaluate.errors", "EvalDataError"),
    ("ingot.pipeline.evaluate.report", "EvalGateError"),
    ("ingot.pipeline.export.errors", "ExportError"),
    ("ingot.pipeline.interop.errors", "InteropError"),
    ("ingot.pipeline.model.config", "ConfigError"),
    ("ingot.pipeline.model.load", "CheckpointError"),
    ("ingot.pipeline.quantize.gptq", "GptqError"),
    ("ingot.pipeline.recipe.errors", "RecipeError"),
    ("ingot.pipeline.resources", "ResourceError"),
    ("ingot.pipeline.source", "SourceError"),
    ("ingot.runtime.engine_select", "NoCompatibleEngine"),
    ("ingot.runtime.generate", "RequestError"),
    ("ingot.runtime.kv_pool", "KVCacheTooSmall"),
    ("ingot.runtime.engines.base", "SessionError"),
    ("ingot.runtime.tokenizer", "ChatTemplateError"),
    ("ingot.runtime.tokenizer", "InvalidText"),
)


class UserError(IngotError):
    """A failure the user can fix, in the command's words; raise it ``from`` the cause."""


def user_error_types() -> tuple[type[BaseException], ...]:
    """The user error classes of the modules loaded so far."""
    found: list[type[BaseException]] = [UserError, OSError]
    for module, name in USER_ERROR_TYPES:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None:
            found.append(cls)
    return tuple(found)


def report(error: Exception, *, debug: bool) -> int:
    """Print `error` to stderr as a user or an internal error; returns the exit code."""
    if isinstance(error, user_error_types()):
        if debug:
            traceback.print_exception(error, file=sys.stderr)
        click.secho(f"error: {error}", fg="red", err=True)
        return USER_ERROR_EXIT
    headline = f"internal error, please report it: {type(error).__name__}: {error}"
    click.secho(headline, fg="red", err=True)
    traceback.print_exception(error, file=sys.stderr)
    return INTERNAL_ERROR_EXIT
