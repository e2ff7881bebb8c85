"""The collector around traces (memfit.estimator.trace.collector): no full collections within a
plan's search, and nothing frozen that a collection would free."""

from __future__ import annotations

import gc

from memfit.estimator.trace import collector
from memfit.planner import search as search_module
from memfit.planner.search import Goal, plan
from tests.conftest import record_instances


def test_a_plans_search_is_freed_after_the_plan(monkeypatch):
    # A search caught in a reference cycle and frozen alive by a trace would never be
    # collected (the first version of the collector froze before every trace).
    made = record_instances(monkeypatch, search_module._Search, weak=True)
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
