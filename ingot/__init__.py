"""ingot: an ahead-of-time compiler for LLMs.

    from ingot import build
    result = build("recipes/demo.yaml")

Names resolve lazily so that the runtime install (no torch) can ``import ingot``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build"]


def __getattr__(name: str) -> Any:
    if name == "build":
        from ingot.pipeline.build import build

        return build
    raise AttributeError(f"module 'ingot' has no attribute {name!r}")
