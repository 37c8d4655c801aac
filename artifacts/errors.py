"""The one exception the artifact package raises for a bad or unsafe artifact."""

from __future__ import annotations

from ingot.common.errors import IngotError

__all__ = ["ArtifactError"]


class ArtifactError(IngotError):
    """An artifact (or a path inside one) was refused.

    `problems` lists every individual finding, each naming the file it is about, so a caller
    (the CLI, the runtime loader) can show all of them at once instead of one per retry.
    """

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems: list[str] = list(problems) if problems is not None else [message]

    @classmethod
    def from_problems(cls, headline: str, problems: list[str]) -> ArtifactError:
        """One error whose message is `headline` followed by one problem per line."""
        lines = "\n".join(f"  - {p}" for p in problems)
        return cls(f"{headline}:\n{lines}", problems)
