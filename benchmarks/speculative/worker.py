"""The speculative benchmark's worker: one case (ingot's methods, or transformers') in a fresh
process, as harness.launch.run_worker runs it.

    python -m benchmarks.speculative.worker SPEC.json RESULT.json
"""

from __future__ import annotations

import traceback
from typing import Any

from benchmarks.harness.launch import worker_main
from benchmarks.harness.machine import memory_status
from benchmarks.speculative.ingot_runs import run_ingot
from benchmarks.speculative.peer import run_transformers

__all__ = ["run_spec"]

_KINDS = {"ingot": run_ingot, "transformers": run_transformers}


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    try:
        result = _KINDS[spec["kind"]](spec)
        result["ok"] = True
    except Exception as e:  # recorded in the report, never dropped
        text = "".join(traceback.format_exception(e)).strip()
        tail = "\n".join(text.splitlines()[-12:])
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": tail}
    return result | memory_status()


if __name__ == "__main__":
    worker_main(run_spec)
