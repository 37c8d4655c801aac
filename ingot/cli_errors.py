"""How the CLI reports a failure: a user error is one line, anything else is a bug.

A user error is an `IngotError` (the root of every error whose message says what the user
should change: a bad recipe, artifact, request or host; `UserError` is the CLI's own, e.g.
"refusing to load ARTIFACT: ...") or an `OSError` (a missing file, a permission, a full disk,
an unreachable hub or registry: the user's to fix). It prints ``error: <message>`` and exits 1;
click's usage errors keep click's own report and exit 2. Any other exception is an internal
error: ``internal error, please report it: <Type>: <message>`` and the traceback, exit 70
(EX_SOFTWARE).

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
    "USER_ERRORS",
    "UserError",
    "report",
]

USER_ERROR_EXIT = 1
INTERNAL_ERROR_EXIT = 70  # sysexits.h EX_SOFTWARE; 2 is click's usage error
USER_ERRORS = (IngotError, OSError)


class UserError(IngotError):
    """A failure the user can fix, in the command's words; raise it ``from`` the cause."""


def report(error: Exception, *, debug: bool) -> int:
    """Print `error` to stderr as a user or an internal error; returns the exit code."""
    if isinstance(error, USER_ERRORS):
        if debug:
            traceback.print_exception(error, file=sys.stderr)
        click.secho(f"error: {error}", fg="red", err=True)
        return USER_ERROR_EXIT
    headline = f"internal error, please report it: {type(error).__name__}: {error}"
    click.secho(headline, fg="red", err=True)
    traceback.print_exception(error, file=sys.stderr)
    return INTERNAL_ERROR_EXIT
