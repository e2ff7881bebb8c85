"""The collector around traces (memfit.estimator.collector): no full collections within a
plan's search, and nothing frozen that a collection would free."""

from __future__ import annotations

import gc
import weakref

from memfit.estimator import collector
from memfit.planner import search as search_module
from memfit.planner.search import Goal, plan


def test_a_plans_search_is_freed_after_the_plan(monkeypatch):
    # The search is a reference cycle (its composer's lines refer back to it): frozen alive by
    # a trace, it would never be collected.
    made = []
    init = search_module._Search.__init__

    def remembered(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(search_module._Search, "__init__", remembered)
    p = plan("gpt2", gpu="t4", goal=Goal(global_batch=2, seq_len=64), forbid=("adafactor",))
    assert p.best is not None and made
    gc.collect()
    assert all(ref() is None for ref in made)


def test_no_full_collections_within_the_block():
    before = gc.get_threshold()
    with collector.without_full_collections():
        young, middle, old = gc.get_threshold()
        assert (young, middle) == before[:2]
        assert old > 10**9
        with collector.without_full_collections():  # nested: the same
            assert gc.get_threshold()[2] == old
        assert gc.get_threshold()[2] == old
        assert gc.get_freeze_count() > 0  # the imported modules, once
    assert gc.get_threshold() == before
