"""`memfit gpus --for` as table cells and JSON (memfit.planner.gpus.ranking's GpuChoice)."""

from __future__ import annotations

from typing import Any

from memfit.planner.plan_text import _candidate_json, _describe


def describe_choice(c: Any) -> tuple[str, str, str, str]:
    """A `memfit.planner.gpus.ranking.GpuChoice` as table cells: fits, tokens/s, $ per million
    tokens, and the plan (or why the GPU was not planned)."""
    if c.fits is None:
        return ("-", "-", "-", c.note)
    if not c.fits:
        return ("no", "-", "-", "nothing fits")
    cost = "-" if c.usd_per_million_tokens is None else f"{c.usd_per_million_tokens:.4f}"
    return ("yes", f"{c.tokens_per_second:,.0f}", cost, _describe(c.plan.best))


def gpu_choices_to_json(choices: list[Any]) -> list[dict[str, Any]]:
    """`memfit gpus --for --json`: one object per GPU and count, in the sorted order."""
    return [
        {
            "gpu": c.gpu.name,
            "n_gpus": c.n_gpus,
            "total_memory_bytes": c.gpu.total_memory_bytes,
            "fits": c.fits,
            "tokens_per_second": c.tokens_per_second,
            "usd_per_hour": c.usd_per_hour,
            "usd_per_million_tokens": c.usd_per_million_tokens,
            "plan": _candidate_json(c.plan.best) if c.fits else None,
            "note": c.note,
        }
        for c in choices
    ]
