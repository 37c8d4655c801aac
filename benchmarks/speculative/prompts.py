"""The speculative benchmark's prompts: windows of the held-out text, "code" (the windows
richest in Python code lines) and "text" (evenly spaced windows with none)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

__all__ = ["prompt_summary", "select_prompts"]

# Python code lines of the reStructuredText: doctest lines and statements at a line's start.
CODE_LINE = re.compile(
    r"^\s*(>>>|\.\.\.(\s|$)|def |class |import |from \S+ import |return |print\()", re.M
)
MIN_CODE_LINES = 2  # a "code" window holds at least this many


def select_prompts(
    model_dir: Path, eval_text: Path, length: int, count: int, concurrency: list[int]
) -> dict[str, Any]:
    """The "code" windows (the most code lines first, at least as many as the largest
    concurrency) and the "text" windows (no code line, evenly spaced), as token ids, BOS first;
    each with its offset in the text's tokens and its number of code lines."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    bos = json.loads((model_dir / "config.json").read_text())["bos_token_id"]
    text = eval_text.read_text()
    encoded = tokenizer.encode(text, add_special_tokens=False)
    ids, offsets = encoded.ids, encoded.offsets
    body = length - 1
    stride = 8  # candidate windows start every `stride` tokens
    candidates = []
    for start in range(0, len(ids) - body, stride):
        window = text[offsets[start][0] : offsets[start + body - 1][1]]
        candidates.append((len(CODE_LINE.findall(window)), start))
    need = max(count, *concurrency)
    code: list[tuple[int, int]] = []
    for lines, start in sorted(candidates, key=lambda c: (-c[0], c[1])):
        if lines < MIN_CODE_LINES or len(code) == need:
            break
        if all(abs(start - s) >= body for _, s in code):
            code.append((lines, start))
    if len(code) < need:
        raise ValueError(
            f"{eval_text} has {len(code)} non-overlapping windows of {body} tokens with "
            f">= {MIN_CODE_LINES} code lines; {need} are needed"
        )
    plain = [(0, s) for lines, s in candidates if lines == 0 and s % body == 0]
    step = len(plain) / count
    prose = [plain[int(i * step)] for i in range(count)]

    def windows(chosen: list[tuple[int, int]]) -> list[dict[str, Any]]:
        return [{"offset": s, "code_lines": n, "ids": [bos, *ids[s : s + body]]} for n, s in chosen]

    return {"code": windows(code), "text": windows(prose)}


def prompt_summary(prompts: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    return {
        name: {
            "windows": len(windows),
            "batch1_prompts": min(args.prompts, len(windows)),
            "token_offsets": [w["offset"] for w in windows],
            "code_lines": [w["code_lines"] for w in windows],
        }
        for name, windows in prompts.items()
    }
