"""The sweep's errors the user can fix: a bad axes file, a base recipe the sweep cannot
measure, a `--pick` that names no field or that no variant meets."""

from __future__ import annotations

from ingot.common.errors import IngotError

__all__ = ["SweepError"]


class SweepError(IngotError, ValueError):
    """One line naming the file or option, the field and what was expected."""
