"""Plans kept on disk: a plan asked again with the same inputs is read back, not searched.

The key holds everything `memfit.plan` reads: the model (as the trace cache names it), the
GPU, the goal, the GPU count, the techniques allowed and forbidden, the host RAM the plan
checks against (this machine's when not given), and the code digest of the trace cache
(memfit's source and the traced packages' versions). It lives beside the traces
(memfit.estimator.trace.cache: same location, same `--no-cache` / MEMFIT_NO_CACHE switch).
A plan whose model memfit cannot name (an nn.Module passed in) is never cached.

A plan that differs in any input (another GPU, batch or sequence) is searched again, and
reuses whatever traces the trace cache holds for it.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from typing import Any

from memfit.estimator import dumps_compact, key_of, lookup, machine_ram_bytes, store
from memfit.models.sources import ModelSpec, resolve_model


def plan_key(spec: ModelSpec, *inputs: Any, host_memory: str | None,
             teacher: str | None = None) -> str | None:  # fmt: skip
    """The cache key of a plan of `spec` with `inputs`, or None (not cached); a distillation
    `teacher` is keyed by its config, as the trace cache keys it, not by its name alone."""
    if spec.cache_key is None or spec.make_batch is not None:
        return None
    teacher_key = None
    if teacher is not None:
        teacher_key = resolve_model(teacher).cache_key
        if teacher_key is None:
            return None
    host = host_memory if host_memory is not None else machine_ram_bytes()
    return key_of("plan", spec.cache_key, teacher_key, host, *inputs)


def cached_plan(key: str | None, search: Callable[[], Any]) -> Any:
    """The plan stored under `key` (its `from_cache` set, `seconds` the time to read it),
    else `search()`'s, stored."""
    t0 = time.perf_counter()
    hit = lookup("plan", key, pickle.loads)  # a fresh copy each time
    if hit is not None:
        hit.from_cache = True
        hit.search_seconds, hit.seconds = hit.seconds, time.perf_counter() - t0
        return hit
    plan = search()
    store("plan", key, dumps_compact(plan))
    return plan
