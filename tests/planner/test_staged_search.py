"""The order of the planner's stages (memfit.planner.search._staged_search): pure precision,
which changes the numerics, is widened only when no stage fits without it (issue: the RTX 4080
plan of llama-3.2-1b recommended bf16-true and said nothing fitted without it, while a
bf16-mixed paged-AdamW configuration fitted)."""

from __future__ import annotations

import os
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


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MEMFIT_SLOW_TESTS"), reason="MEMFIT_SLOW_TESTS=1")
def test_the_rtx_4080_plan_of_the_issue_keeps_mixed_precision():
    # The plan of issue 29 (two real plans, about 3 minutes on 2 cores): without --forbid it
    # recommended bf16-true; the same bf16-mixed configuration as with --forbid now wins.
    import memfit

    goal = memfit.Goal(global_batch=16, seq_len=2048)
    free = memfit.plan("llama-3.2-1b", gpu="rtx-4080", goal=goal)
    forbidden = memfit.plan("llama-3.2-1b", gpu="rtx-4080", goal=goal, forbid=("pure-precision",))
    assert free.best is not None and forbidden.best is not None
    assert free.best.workload.precision == "bf16-mixed"
    assert free.widened == ()
    assert free.best.workload == forbidden.best.workload
