"""The order of the planner's stages (memfit.planner.search._staged_search): pure precision,
which changes the numerics, is widened only when no stage fits without it (issue: the RTX 4080
plan of llama-3.2-1b recommended bf16-true and said nothing fitted without it, while a
bf16-mixed paged-AdamW configuration fitted)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from memfit.planner import search as search_mod
from memfit.planner.shapes import lean_shapes, offload_shapes, shapes

STAGES = {shapes: "usual", lean_shapes: "lean", offload_shapes: "offload"}


def _run(monkeypatch: pytest.MonkeyPatch, fits_at: tuple[str, bool] | None) -> tuple[Any, list]:
    """Run the staged search with an `_explore` that records (stage, pure allowed) and makes a
    fitting candidate at `fits_at`."""
    calls: list[tuple[str, bool]] = []
    search = SimpleNamespace(candidates=[])

    def explore(search_: Any, spec, goal, gpu, allowed, n_gpus, *, stage=shapes, skip=()):
        call = (STAGES[stage], "pure-precision" in allowed)
        calls.append(call)
        if call == fits_at:
            search_.candidates.append(SimpleNamespace(fits=True))
        return {call}

    monkeypatch.setattr(search_mod, "_explore", explore)
    widened = search_mod._staged_search(
        search, None, None, None, {"mixed-precision", "paged-optimizer"}, set(), 1
    )  # type: ignore[arg-type]
    return widened, calls


def test_a_lean_mixed_precision_fit_comes_before_pure_precision(monkeypatch):
    widened, calls = _run(monkeypatch, ("lean", False))
    assert calls == [("usual", False), ("lean", False)]
    assert widened == ()


def test_pure_precision_is_widened_only_after_every_stage_without_it(monkeypatch):
    widened, calls = _run(monkeypatch, ("usual", True))
    assert calls == [("usual", False), ("lean", False), ("offload", False), ("usual", True)]
    assert widened == ("pure-precision",)


def test_nothing_fits_at_all(monkeypatch):
    widened, calls = _run(monkeypatch, None)
    assert calls == [("usual", False), ("lean", False), ("offload", False),
                     ("usual", True), ("lean", True), ("offload", True)]  # fmt: skip
    assert widened == ()
