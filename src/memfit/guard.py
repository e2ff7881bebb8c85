"""Survive CUDA OOM at run time: `oom_guard` retries a step with a smaller micro-batch, and
`find_batch_size` (memfit.batch_search) searches the largest batch that runs.

Both catch `torch.OutOfMemoryError` (never message text), then free memory before going on:
they drop their references, set gradients to None, run `gc.collect()` (an exception's traceback
keeps the failed step's tensors alive through reference cycles) and empty the allocator's cache
(`torch.cuda.empty_cache()` when CUDA is initialised; the simulated GPU's when the code runs
under `memfit.simulate`). An OOM once `optimizer.step()` has started (in it, or after it in
the same attempt) is never retried: the update may already be applied, and a smaller
micro-batch does not shrink optimizer memory.

Limitations: an OOM that CUDA libraries report as a plain RuntimeError ("CUBLAS_STATUS_ALLOC_
FAILED", "CUDA error: out of memory") is not caught; with DDP/FSDP an OOM on one rank leaves the
others waiting in a collective, so guard the step on every rank or search before wrapping.
"""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils import _pytree as pytree

from memfit.errors import BadInputError

__all__ = ["GuardedStep", "TrainStep", "oom_guard"]

log = logging.getLogger("memfit.guard")

#: The largest batch `find_batch_size` tries unless told otherwise.
MAX_BATCH = 4096


@runtime_checkable
class TrainStep(Protocol):
    """What `oom_guard` needs from a training setup (memfit.apply_ returns one).

    `step(batch)` splits the batch (a tensor, or a dict/tuple of tensors, along dim 0) into
    `grad_accum` equal micro-batches, runs forward and backward on each with the loss divided
    by `grad_accum`, and only after all of them calls `optimizer.step()` and
    `optimizer.zero_grad(set_to_none=True)`; it returns the loss.
    """

    model: torch.nn.Module
    optimizer: Any
    grad_accum: int

    def step(self, batch: Any) -> float: ...


def batch_size_of(batch: Any) -> int:
    """Size of dim 0 of the first tensor in `batch` (a tensor, dict, tuple or list)."""
    for t in pytree.tree_leaves(batch):
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    raise BadInputError(f"Cannot find a batch dimension in {type(batch).__name__}: no tensor.")


def free_memory(
    model: torch.nn.Module | None = None, optimizer: Any = None, *, collect: bool = True
) -> None:
    """Set gradients to None, collect garbage (`collect`), and empty the (real or simulated)
    allocator cache."""
    from memfit.gpu_simulation import active

    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    if model is not None:
        for p in model.parameters():
            p.grad = None
    if collect:
        gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    sim = active()
    if sim is not None:
        sim.empty_cache()


class _OptimizerWatch:
    """Whether `optimizer.step()` has started in this attempt (a step pre-hook): after that,
    redoing the step could apply an update twice."""

    def __init__(self, optimizer: Any) -> None:
        self.started = False
        self._optimizer = optimizer
        self._handle: Any = None

    def __enter__(self) -> _OptimizerWatch:
        if isinstance(self._optimizer, torch.optim.Optimizer):
            self._handle = self._optimizer.register_step_pre_hook(self._pre)
        return self

    def _pre(self, *_: Any) -> None:
        self.started = True

    def __exit__(self, *exc: Any) -> None:
        if self._handle is not None:
            self._handle.remove()


def _optimizer_oom(e: torch.OutOfMemoryError) -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError(
        "Out of memory in or after optimizer.step(): not retried, because (part of) the update "
        "may already be applied. A smaller micro-batch does not shrink optimizer memory: use an "
        f"8-bit optimizer or Adafactor, or shard the optimizer state. ({e})"
    )


class GuardedStep:
    """A `TrainStep` whose `step` survives OOM; see `oom_guard`. Other attributes pass through."""

    def __init__(self, setup: TrainStep, *, min_micro_batch: int = 1) -> None:
        self.setup = setup
        self.min_micro_batch = min_micro_batch
        self.retries = 0

    def __getattr__(self, name: str) -> Any:
        if name == "setup":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.setup, name)

    def step(self, batch: Any, *args: Any, **kwargs: Any) -> float:
        """`setup.step(batch, ...)`, redone with more accumulation after an OOM."""
        s = self.setup
        size = batch_size_of(batch)
        while True:
            with _OptimizerWatch(s.optimizer) as watch:
                try:
                    return s.step(batch, *args, **kwargs)
                except torch.OutOfMemoryError as e:
                    if watch.started:
                        raise _optimizer_oom(e) from e
                    new = _next_grad_accum(size, s.grad_accum, self.min_micro_batch)
                    if new is None:
                        raise torch.OutOfMemoryError(
                            f"Out of memory with micro-batch {size // s.grad_accum} "
                            f"(batch {size} in {s.grad_accum} micro-batches), and it cannot be "
                            f"halved (min_micro_batch={self.min_micro_batch}). ({e})"
                        ) from e
            # The exception and its frames are gone here; the step's tensors can be freed.
            free_memory(s.model, s.optimizer)
            log.warning(
                "CUDA out of memory at micro-batch %d: retrying the step with micro-batch %d "
                "and gradient accumulation %d (effective batch %d unchanged).",
                size // s.grad_accum, size // new, new, size,
            )  # fmt: skip
            s.grad_accum = new
            self.retries += 1


def _next_grad_accum(size: int, accum: int, min_micro: int) -> int | None:
    """The smallest accumulation >= 2x `accum` that divides `size` into micro-batches of at
    least `min_micro` samples (the micro-batch at least halves), or None."""
    for k in range(2 * accum, size + 1):
        if size % k == 0:
            return k if size // k >= min_micro else None
    return None


class _GuardedFunction:
    def __init__(self, fn: Callable[..., Any], *, model: Any, optimizer: Any,
                 min_micro_batch: int) -> None:  # fmt: skip
        functools.update_wrapper(self, fn)
        self.fn, self.model, self.optimizer = fn, model, optimizer
        self.min_micro_batch = min_micro_batch
        self.micro_batch_size: int | None = None  # the last size that ran (kept for next calls)
        self.retries = 0

    def __call__(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        size = batch_size_of(batch)
        mbs = min(self.micro_batch_size or size, size)
        while True:
            with _OptimizerWatch(self.optimizer) as watch:
                try:
                    out = self.fn(batch, *args, micro_batch_size=mbs, **kwargs)
                    self.micro_batch_size = mbs
                    return out
                except torch.OutOfMemoryError as e:
                    if watch.started:
                        raise _optimizer_oom(e) from e
                    if mbs // 2 < self.min_micro_batch:
                        raise torch.OutOfMemoryError(
                            f"Out of memory with micro_batch_size={mbs}, which cannot be halved "
                            f"(min_micro_batch={self.min_micro_batch}). ({e})"
                        ) from e
            free_memory(self.model, self.optimizer)
            log.warning(
                "CUDA out of memory at micro_batch_size=%d: retrying with %d.", mbs, mbs // 2
            )
            mbs //= 2
            self.retries += 1


def oom_guard(setup_or_fn: Any = None, *, model: torch.nn.Module | None = None,
              optimizer: Any = None, min_micro_batch: int = 1) -> Any:  # fmt: skip
    """Retry a training step that runs out of memory with half the micro-batch.

    Two forms:

    - `oom_guard(setup)` with a `TrainStep` (e.g. what `memfit.apply_` returns) gives a
      `GuardedStep`: on OOM it doubles `setup.grad_accum` (the next divisor of the batch if
      doubling does not divide it), frees memory and redoes the whole step. The effective batch
      is unchanged and the optimizer steps once: `TrainStep.step` only steps after every
      micro-batch succeeded, and the guard sets gradients to None before the retry. The new
      `grad_accum` is kept for later steps.
    - `@oom_guard` (or `@oom_guard(model=..., optimizer=...)`) on
      `def train_step(batch, micro_batch_size)`: the function runs forward/backward over
      micro-batches of `micro_batch_size` samples, weighting each loss by its share of the
      batch, then steps. It is first called with the whole batch, and on OOM again with half
      the micro-batch; the size that ran is kept (`train_step.micro_batch_size`). Pass
      `model=`/`optimizer=` so the guard sets gradients to None before a retry, or start the
      function with `optimizer.zero_grad(set_to_none=True)`.

    Example:
        >>> @oom_guard(optimizer=opt)
        ... def train_step(batch, micro_batch_size):
        ...     for x, y in zip(batch[0].split(micro_batch_size), batch[1].split(micro_batch_size)):
        ...         (loss_fn(model(x), y) * len(x) / len(batch[0])).backward()
        ...     opt.step()
        ...     opt.zero_grad(set_to_none=True)
    """
    if isinstance(min_micro_batch, bool) or not isinstance(min_micro_batch, int):
        raise BadInputError(f"min_micro_batch must be a whole number, got {min_micro_batch!r}.")
    if min_micro_batch < 1:
        raise BadInputError(f"min_micro_batch must be >= 1, got {min_micro_batch}.")
    if setup_or_fn is None:
        return functools.partial(
            oom_guard, model=model, optimizer=optimizer, min_micro_batch=min_micro_batch
        )
    if isinstance(setup_or_fn, TrainStep):
        return GuardedStep(setup_or_fn, min_micro_batch=min_micro_batch)
    if callable(setup_or_fn):
        return _GuardedFunction(
            setup_or_fn, model=model, optimizer=optimizer, min_micro_batch=min_micro_batch
        )
    raise BadInputError(
        f"oom_guard needs a training setup (model, optimizer, grad_accum, step(batch)) or a "
        f"function train_step(batch, micro_batch_size), got {type(setup_or_fn).__name__}."
    )
