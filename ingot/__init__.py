"""ingot: an ahead-of-time compiler for LLMs.

    from ingot import build
    result = build("recipes/demo.yaml")

    from ingot import LLM, SamplingParams
    outputs = LLM("out/demo").generate(["The os module"], SamplingParams(max_tokens=32))

This directory is the top layer: the CLI (cli*.py) and the offline `LLM` (llm.py), which may
import every other package (common <- artifacts <- runtime <- calibration <- pipeline <-
ingot); nothing imports them back. Names resolve lazily so that the runtime install (no
torch) can ``import ingot``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LLM", "SamplingParams", "build"]


def __getattr__(name: str) -> Any:
    if name == "build":
        from ingot.pipeline.build import build  # torch: only a build install has it

        return build
    if name == "LLM":
        # the runtime (onnxruntime) loads when asked for: `import ingot` and the CLI stay light
        from ingot.llm import LLM

        return LLM
    if name == "SamplingParams":
        from ingot.runtime.sampling import SamplingParams  # the runtime, as for LLM

        return SamplingParams
    raise AttributeError(f"module 'ingot' has no attribute {name!r}")
