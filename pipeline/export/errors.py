"""The one error the export stage raises."""

from __future__ import annotations

__all__ = ["ExportError"]


class ExportError(ValueError):
    """The model cannot be exported as asked, or the exported graph disagrees with the IR."""
