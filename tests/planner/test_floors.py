"""The search's floors (memfit.planner.floors): shapes whose weights and gradients alone exceed
the GPU are not traced, and the plan is the one the search finds tracing them.

Qwen2.5-0.5B on budget cards: at 2.5 GiB its bf16-mixed shapes (fp32 weights and gradients,
2.67 GiB without the embedding) cannot fit, and the plan skips them; at 1 GiB nothing fits,
and the skipped shapes are traced after all, so the closest miss and the suggestions are the
same too (about 30 s a case: the second runs with MEMFIT_SLOW_TESTS=1).
"""

from __future__ import annotations

import os

import pytest

from memfit.planner import floors
from memfit.planner import search as search_module
from memfit.planner.plan_text import plan_to_json
from memfit.planner.search import Goal, plan

COUNTS = {"seconds", "trace_seconds", "search_seconds", "from_cache", "evaluated", "traces"}


def _results(doc):
    if isinstance(doc, dict):
        return {k: _results(v) for k, v in doc.items() if k not in COUNTS}
    if isinstance(doc, list):
        return [_results(v) for v in doc]
    return doc


SLOW = pytest.mark.skipif(not os.environ.get("MEMFIT_SLOW_TESTS"), reason="MEMFIT_SLOW_TESTS=1")


@pytest.mark.parametrize(
    ("gpu", "fits"),
    [("rtx-4090@2.5GiB", True), pytest.param("rtx-4090@1GiB", False, marks=SLOW)],
)
def test_floors_change_nothing_but_the_traces(monkeypatch, gpu, fits):
    goal = Goal(global_batch=2, seq_len=64)
    # As with traces made ahead side by side (MEMFIT_JOBS), here one after another: only
    # shapes no floor can skip are traced ahead (before the first trace the floor is the
    # weights alone; once a trace tells which parameters get a gradient, it may skip more).
    ahead, skipped = [], []
    monkeypatch.setattr(search_module, "workers", lambda: 2)
    monkeypatch.setattr(search_module, "run_all", lambda jobs, **kw: [job() for job in jobs])
    prefetch, skip = search_module._Search.prefetch, search_module._Search.skip
    monkeypatch.setattr(
        search_module._Search,
        "prefetch",
        lambda self, pairs: (ahead.extend(pairs), prefetch(self, pairs))[1],
    )
    monkeypatch.setattr(
        search_module._Search,
        "skip",
        lambda self, shape, *a: (skipped.append(shape), skip(self, shape, *a))[1],
    )
    with_floors = plan("qwen2.5-0.5b", gpu=gpu, goal=goal)
    assert ahead and skipped
    assert not {shape for shape, _ in ahead} & set(skipped)
    monkeypatch.undo()
    monkeypatch.setattr(floors.Floors, "above", lambda *args, **kwargs: False)
    without = plan("qwen2.5-0.5b", gpu=gpu, goal=goal)
    assert (with_floors.best is not None) is fits
    assert _results(plan_to_json(with_floors)) == _results(plan_to_json(without))
    if fits:
        assert with_floors.traces < without.traces
    else:  # traced after all, for the closest miss
        assert with_floors.closest_miss is not None
        assert with_floors.traces == without.traces
