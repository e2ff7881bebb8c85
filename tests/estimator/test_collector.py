"""The collector around traces (memfit.estimator.collector): a plan freezes what is alive
before each of its traces, and leaves nothing frozen that a collection would free."""

from __future__ import annotations

import gc
import weakref

from memfit.estimator import collector
from memfit.planner import search as search_module
from memfit.planner.search import Goal, plan


def test_a_plans_search_is_freed_after_the_plan(monkeypatch):
    # The search is a reference cycle (its composer's lines refer back to it), frozen alive by
    # its own traces: leaving the plan thaws and collects it.
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


def test_freezes_before_every_trace_inside_the_block_and_thaws_after_it():
    with collector.freezing_between_traces():
        collector.freeze_before_trace()
        first = gc.get_freeze_count()
        kept = [[] for _ in range(1000)]  # made after that freeze
        collector.freeze_before_trace()
        assert gc.get_freeze_count() >= first + len(kept)
    assert gc.get_freeze_count() == 0  # thawed
    collector.freeze_before_trace()  # outside the block: the next trace freezes, once
    frozen = gc.get_freeze_count()
    more = [[] for _ in range(1000)]
    collector.freeze_before_trace()
    assert frozen > 0 and gc.get_freeze_count() == frozen
    assert more
