"""How a speculative run's outputs compare with plain decoding's: how many are equal token for
token, and where one differs, whether plain decoding's two best tokens were a near-tie there."""

from __future__ import annotations

from typing import Any

from ingot.runtime import SamplingParams

__all__ = ["explain_differences", "matches"]


def matches(plain: list[list[int]], ours: list[list[int]]) -> dict[str, Any]:
    """How many outputs equal plain decoding's token for token; where the others diverge."""
    diverge = []
    for a, b in zip(plain, ours, strict=True):
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        diverge.append(first)
    return {
        "equal": sum(d is None for d in diverge),
        "of": len(diverge),
        "first_difference_at": diverge,
    }


def explain_differences(plain: Any, spec: dict[str, Any], batch1: dict[str, Any]) -> None:
    """For each batch-1 output that differs from plain decoding's: plain decoding's top two
    log-probabilities where they part (a near-tie flipped by rounding has a gap near 0, and
    the speculative token is plain's second choice), under the method's `differences`."""
    params = SamplingParams(max_tokens=spec["tokens"], temperature=0.0, ignore_eos=True, logprobs=2)
    tops: dict[tuple[str, int], list[dict[int, float]]] = {}
    for set_name, rows in batch1.items():
        prompts = spec["batch1"][set_name]
        plain_tokens = rows["plain"]["tokens"]
        for method, row in rows.items():
            match = row.get("matches_plain")
            if not match or method == "plain":
                continue
            differences = []
            for i, at in enumerate(match["first_difference_at"]):
                if at is None:
                    continue
                if (set_name, i) not in tops:
                    done = plain.generate([prompts[i]], params)[0]
                    same = list(done.token_ids) == plain_tokens[i]
                    tops[set_name, i] = done.top_logprobs if same else None
                if tops[set_name, i] is None:  # asking for logprobs changed plain's path
                    differences.append({"prompt": i, "at": at, "plain_rerun_differs": True})
                    continue
                top = tops[set_name, i][at]
                ranked = sorted(top.items(), key=lambda kv: -kv[1])
                ours = row["tokens"][i][at]
                differences.append(
                    {
                        "prompt": i,
                        "at": at,
                        "plain_token": plain_tokens[i][at],
                        "token": ours,
                        "token_is_plains_second": len(ranked) > 1 and ranked[1][0] == ours,
                        "plain_top2_logprob_gap": ranked[0][1] - ranked[1][1]
                        if len(ranked) > 1
                        else None,
                    }
                )
            match["differences"] = differences
