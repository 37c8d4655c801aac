"""The root of every error a user can fix (bad recipe, artifact, request, host)."""

from __future__ import annotations

__all__ = ["IngotError"]


class IngotError(Exception):
    """A failure caused by input the user controls, whose message says what to change.

    The CLI prints it as one line (``error: <message>``) and exits 1; anything that is not an
    IngotError (or an OSError) is a bug. Subclasses usually also derive from the builtin that
    describes them (``ValueError``, ``RuntimeError``), so ``except ValueError`` keeps working.
    """
