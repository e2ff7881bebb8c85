"""`max_batch` and `max_seq`: the largest micro-batch or sequence that fits a GPU, searched over
the estimator (doubling, then bisection), with the memory curve of the values tried.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from memfit.cuda.target import get_gpu
from memfit.estimator.estimate import estimate_from_trace, trace_spec
from memfit.guard.batch_search import largest_passing
from memfit.models.sources import resolve_model
from memfit.workload import Workload


@dataclass(kw_only=True)
class Limit:
    """The largest micro-batch (or sequence) that fits, and the memory curve on the way."""

    model: str
    gpu: Any
    what: str  # "batch_size" or "seq_len"
    largest: int | None
    curve: list[tuple[int, int, bool]]  # (value, device total bytes, fits), by value
    seconds: float = 0.0


def _limit(model: Any, w: Workload, gpu: str, what: str, upper: int, task: str | None) -> Limit:
    """Exponential growth, then binary search, over the estimator (not an extrapolation)."""

    t0 = time.perf_counter()
    gpu_obj = get_gpu(gpu)
    spec = resolve_model(model, task=task)
    seen: dict[int, tuple[int, bool]] = {}

    def fits(value: int) -> bool:
        if value not in seen:
            wv = w.with_(gpu=gpu_obj.name, **{what: value})
            tr, n, rep = trace_spec(spec, wv, gpu_obj.compute_capability, verify=False)
            est = estimate_from_trace(spec, wv, tr, n_blocks=n, replayed=rep, gpu=gpu_obj)
            seen[value] = (est.profile.device_total_bytes or 0, bool(est.fits))
        return seen[value][1]

    good = largest_passing(fits, start=1, upper=upper)
    curve = sorted((v, b, f) for v, (b, f) in seen.items())
    return Limit(
        model=spec.name, gpu=gpu_obj, what=what, largest=good or None, curve=curve,
        seconds=time.perf_counter() - t0,
    )  # fmt: skip


#: The largest micro-batch `max_batch` tries.
MAX_BATCH_UPPER = 4096


def max_batch(model: Any, w: Workload, *, gpu: str, task: str | None = None) -> Limit:
    """The largest micro-batch of `w` that fits `gpu`, by search over the estimator."""
    return _limit(model, w, gpu, "batch_size", MAX_BATCH_UPPER, task)


def max_seq(model: Any, w: Workload, *, gpu: str, task: str | None = None) -> Limit:
    """The longest sequence (up to the model's positions) for `w` that fits `gpu`."""
    spec = resolve_model(model, task=task)
    upper = spec.max_positions or 131072
    return _limit(spec, w, gpu, "seq_len", upper, task)
