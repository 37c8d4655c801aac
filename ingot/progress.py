"""Build progress on a terminal (rich), silent otherwise so --json and CI logs stay clean."""

from __future__ import annotations

import sys
import time

__all__ = ["StageProgress"]


class StageProgress:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._status = None
        self._started: dict[str, float] = {}

    def __enter__(self) -> StageProgress:
        if self.enabled:
            # rich (a build extra) loads only on a terminal: --json and CI logs skip it
            from rich.console import Console

            self._console = Console(stderr=True)
            self._status = self._console.status("building")
            self._status.start()
        return self

    def update(self, stage: str, event: str) -> None:
        if not self.enabled:
            return
        if event == "start":
            self._started[stage] = time.perf_counter()
            self._status.update(f"[bold]{stage}[/] …")
            return
        seconds = time.perf_counter() - self._started.get(stage, time.perf_counter())
        mark = "[dim]cached[/]" if event == "cached" else "[green]done[/]"
        self._console.print(f"  {stage:<24} {mark} {seconds:6.2f}s")

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __exit__(self, *exc) -> None:
        self.stop()
