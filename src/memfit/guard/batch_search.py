"""`find_batch_size`: the largest batch that runs, searched empirically (see memfit.guard.retry for
how memory is freed between tries)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from memfit.errors import BadInputError, Failsafe
from memfit.guard.retry import MAX_BATCH, free_memory
from memfit.simulation.simulated_gpu import active

__all__ = ["BatchSearch", "find_batch_size"]


@dataclass(frozen=True, kw_only=True)
class BatchSearch:
    """The result of `find_batch_size`."""

    batch_size: int  # the largest batch that ran (the minimum over ranks when distributed)
    micro_batch_size: int  # what to run: batch_size, or the largest divisor of target_batch
    grad_accum: int  # micro-batches per optimizer step
    effective_batch_size: int  # micro_batch_size * grad_accum
    tries: tuple[tuple[int, bool], ...]  # (batch size, ran) in the order tried, on this rank
    world_size: int = 1
    seconds: float = 0.0


def find_batch_size(
    trial: Callable[[Any], Any],
    *,
    make_batch: Callable[[int], Any] | None = None,
    start: int = 1,
    max_batch: int = MAX_BATCH,
    target_batch: int | None = None,
    model: torch.nn.Module | None = None,
    optimizer: Any = None,
    progress: bool = True,
) -> BatchSearch:
    """The largest batch for which `trial` runs without OOM: doubling, then binary search.

    `trial(make_batch(b))` (or `trial(b)` without `make_batch`) should run one full training
    step. Probe the worst case: `make_batch(b)` should give the longest sequence or the largest
    image the data holds, or a later batch will still OOM. The trial steps the optimizer, so
    the weights change: search on a copy, reload a checkpoint afterwards, or set lr=0 (memory
    is the same). Memory is freed between tries (`model=`/`optimizer=` let gradients be set to
    None). With `target_batch`, the search stops there and the result gives the micro-batch
    (the largest divisor of `target_batch` that ran) and the gradient accumulation that keep
    the effective batch. On a fake simulated GPU (`memfit.simulate(..., fake=True)`) each try
    is a fresh start, as a training run of that batch size is: the simulated allocator restarts
    with the model loaded and no optimizer state, and the trial runs twice (the warm-up step
    that creates the optimizer state, then a steady one), which is what memfit's estimate
    traces. A search in a warm process (on a real GPU) can report more: the earlier, smaller
    tries left the optimizer state packed at the bottom of memory, which a fresh run does not
    have. When torch.distributed is initialised every rank searches on its own
    (no collective runs inside the search) and the ranks then agree on the smallest result.

    Example:
        >>> r = find_batch_size(step, make_batch=lambda b: longest_batch(b), target_batch=256)
        >>> r.micro_batch_size, r.grad_accum
    """
    for name, v in (("start", start), ("max_batch", max_batch), ("target_batch", target_batch)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise BadInputError(f"{name} must be a whole number >= 1, got {v!r}.")
    upper = min(max_batch, target_batch) if target_batch is not None else max_batch
    if start > upper:
        raise BadInputError(f"start ({start}) is larger than the largest batch to try ({upper}).")
    t0 = time.perf_counter()
    tries: list[tuple[int, bool]] = []
    bar = Failsafe("find_batch_size's progress bar")
    with _progress(progress) as report:
        sim = active()
        fresh = sim is not None and sim.fake

        def runs(b: int) -> bool:
            if fresh:
                assert sim is not None
                sim.restart()
            ok = _try(trial, make_batch, b, steps=2 if fresh else 1)
            # A failed try leaves reference cycles (exception, traceback, frames); a good one
            # frees its tensors by reference counting.
            free_memory(model, optimizer, collect=not ok)
            tries.append((b, ok))
            bar.call("drawing the progress bar", report, b, ok, default=None)  # a side figure
            return ok

        good = largest_passing(runs, start=start, upper=upper)
    world = 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        good, world = _agree_min(good), torch.distributed.get_world_size()
    if good == 0:
        raise torch.OutOfMemoryError(
            f"Even a batch of 1 runs out of memory (tried {[b for b, _ in tries]}). Use memfit "
            "plan to find techniques (checkpointing, mixed precision, a lighter optimizer)."
        )
    micro = good
    if target_batch is not None:
        micro = max(d for d in range(1, good + 1) if target_batch % d == 0)
    accum = target_batch // micro if target_batch is not None else 1
    return BatchSearch(
        batch_size=good, micro_batch_size=micro, grad_accum=accum,
        effective_batch_size=micro * accum, tries=tuple(tries), world_size=world,
        seconds=time.perf_counter() - t0,
    )  # fmt: skip


def _try(
    trial: Callable[[Any], Any], make_batch: Callable[[int], Any] | None, b: int, *, steps: int
) -> bool:
    try:
        for _ in range(steps):
            trial(make_batch(b) if make_batch is not None else b)
    except torch.OutOfMemoryError:
        return False
    except Exception as e:  # not an OOM: the caller's error, raised as it is, with the batch
        e.add_note(f"(raised by the trial at batch size {b}, in memfit's find_batch_size)")
        raise
    return True


def largest_passing(runs: Callable[[int], bool], *, start: int, upper: int) -> int:
    """Largest b in [1, upper] with runs(b), assuming monotonicity; 0 if none.

    Doubles from `start` until a value fails (or `upper` is reached), then bisects between the
    last value that ran and the first that did not."""
    good, bad = 0, upper + 1
    b = start
    while b <= upper:
        if not runs(b):
            bad = b
            break
        good, b = b, b * 2
    if bad == upper + 1 and good < upper:
        if runs(upper):
            return upper
        bad = upper
    lo, hi = good + 1, bad - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if runs(mid):
            good, lo = mid, mid + 1
        else:
            hi = mid - 1
    return good


def _agree_min(value: int) -> int:
    dist = torch.distributed
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[int, bool], None]]:
    """A rich progress line on stderr when `enabled`; yields the function reporting a try."""
    if not enabled:
        yield lambda b, ok: None
        return
    try:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn
    except ImportError as e:  # rich is a dependency of memfit; say so if it is missing
        raise ImportError("find_batch_size(progress=True) needs rich: pip install rich") from e
    best = 0
    with Progress(SpinnerColumn(), TextColumn("{task.description}"),
                  console=Console(stderr=True)) as bar:  # fmt: skip
        task = bar.add_task("finding the largest batch", total=None)

        def report(b: int, ok: bool) -> None:
            nonlocal best
            best = max(best, b) if ok else best
            verdict = "runs" if ok else "out of memory"
            bar.update(task, description=f"batch {b}: {verdict} (largest so far {best})")

        yield report
