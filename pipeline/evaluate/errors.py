"""The evaluation's errors the user can fix."""

from __future__ import annotations

from ingot.common.errors import IngotError

__all__ = ["EvalDataError"]


class EvalDataError(IngotError, ValueError):
    """The recipe's evaluation data is missing, unreadable or too short."""
