"""Python's garbage collector around traces: kept off what lives long (issue 17).

Python's full collections walk every object it tracks. A process that traces holds some 300k
long-lived ones (torch's and transformers' modules) and, during a plan, the traces the plan
keeps (a record per storage): walking them in every full collection cost a plan seconds. So
what is alive before a trace is moved out of the collector's sight (`gc.freeze`) and the
collections Python runs by itself while tracing walk only what the trace makes.

- Outside a plan (`memfit.estimate`, a callback's estimate): once per process, before the
  first trace, after one collection (what was imported).
- Within `freezing_between_traces()` (a plan's search): before each trace, after a collection
  that walks only what was made since the last freeze (the previous trace's garbage and what
  the search kept). The llama-3.2-1B plan spent 2.1 s in collections with the freeze once
  per process; 1.3 s so, and about 0.4 s more for the one full collection after the thaw
  below (each figure one run of `memfit plan llama-3.2-1b --gpu rtx-4090 --global-batch 16
  --seq 2048` on 2 cores, collections timed with `gc.callbacks`).

Frozen objects are still freed when nothing refers to them; a reference cycle frozen alive and
dropped later is not. The search holds such a cycle (its composer's lines refer back to it),
so leaving the block thaws everything: a plan leaves nothing behind that a collection would
not free. The collection is left to Python, and the next trace, if any, freezes again.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_depth = 0  # nesting of freezing_between_traces blocks
_frozen_once = False


def freeze_before_trace() -> None:
    """Called before each trace (see the module docstring)."""
    global _frozen_once
    if _depth or not _frozen_once:
        gc.collect()
        gc.freeze()
        _frozen_once = True


@contextlib.contextmanager
def freezing_between_traces() -> Iterator[None]:
    """Within the block, freeze before every trace; on leaving the outermost block, thaw
    (see the module docstring)."""
    global _depth, _frozen_once
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            gc.unfreeze()
            _frozen_once = False  # the next trace collects and freezes again
