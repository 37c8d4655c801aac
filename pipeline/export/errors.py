"""The one error the export stage raises."""

from __future__ import annotations

from ingot.common.errors import IngotError

__all__ = ["ExportError"]


class ExportError(IngotError, ValueError):
    """The model cannot be exported as asked, or the exported graph disagrees with the IR."""
