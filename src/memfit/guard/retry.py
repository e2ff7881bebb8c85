"""Survive CUDA OOM at run time: `oom_guard` retries a step with a smaller micro-batch, and
`find_batch_size` (memfit.guard.batch_search) searches the largest batch that runs.

Both catch `torch.OutOfMemoryError` (never message text), then free memory before going on:
they drop their references, set gradients to None, run `gc.collect()` (an exception's traceback
keeps the failed step's tensors alive through reference cycles) and empty the allocator's cache
(`torch.cuda.empty_cache()` when CUDA is initialised; the simulated GPU's when the code runs
under `memfit.simulate`). An OOM once `optimizer.step()` has started (in it, or after it in
the same attempt; or once a GradScaler's `step()` ran) is never retried: the update may
already be applied, and a smaller micro-batch does not shrink optimizer memory.

The guard's own work (watching `optimizer.step()`, deciding, freeing memory) never breaks the
step: when it fails, the guard stops (`failed` says why, a warning says it once) and the step
runs, or its OOM propagates, as without the guard (memfit.errors.Failsafe).

Limitations: an OOM that CUDA libraries report as a plain RuntimeError ("CUBLAS_STATUS_ALLOC_
FAILED", "CUDA error: out of memory") is not caught; with DDP/FSDP an OOM on one rank leaves the
others waiting in a collective, so guard the step on every rank or search before wrapping.
"""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import Callable
from typing import Any, Protocol, cast, runtime_checkable

import torch
from torch.utils import _pytree as pytree

from memfit.errors import BadInputError, Failsafe
from memfit.optimizers import lighter_specs
from memfit.simulation.simulated_gpu import active

__all__ = ["GuardedStep", "TrainStep", "oom_guard"]

log = logging.getLogger("memfit.guard.retry")

#: The largest batch `find_batch_size` tries unless told otherwise.
MAX_BATCH = 4096


@runtime_checkable
class TrainStep(Protocol):
    """What `oom_guard` needs from a training setup (memfit.apply_ returns one).

    `step(batch)` splits the batch (a tensor, or a dict/tuple of tensors, along dim 0) into
    `grad_accum` micro-batches whose sizes differ by at most one (`torch.tensor_split`), runs
    forward and backward on each with the loss weighted by its share of the samples, and only
    after all of them calls `optimizer.step()` and `optimizer.zero_grad(set_to_none=True)`; it
    returns the loss. `grad_accum` may be anything from 1 to the batch size.
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
    """Whether `optimizer.step()` has started in this attempt (a step pre-hook), or the
    GradScaler has stepped an optimizer (`scaler.step` skips `optimizer.step()` on inf/NaN
    gradients): after that, redoing the step could apply an update twice."""

    def __init__(self, optimizer: Any, scaler: Any = None) -> None:
        self._stepped = False
        self._optimizer = optimizer
        self._scaler = scaler
        self._handle: Any = None

    @property
    def started(self) -> bool:
        from torch.amp.grad_scaler import OptState

        states = _scaler_states(self._scaler).values()
        return self._stepped or any(st["stage"] is OptState.STEPPED for st in states)

    def __enter__(self) -> _OptimizerWatch:
        if isinstance(self._optimizer, torch.optim.Optimizer):
            self._handle = self._optimizer.register_step_pre_hook(self._pre)
        return self

    def _pre(self, *_: Any) -> None:
        self._stepped = True

    def __exit__(self, *exc: Any) -> None:
        if self._handle is not None:
            self._handle.remove()


def _scaler_states(scaler: Any) -> dict[int, Any]:
    """A GradScaler's per-optimizer record of this iteration (`_per_optimizer_states`, keyed by
    `id(optimizer)`: stage READY/UNSCALED/STEPPED and the inf checks), or {} (no scaler, or a
    disabled one). Private to torch.amp.GradScaler: only `update()` resets it publicly, and
    update() also changes the scale."""
    states = getattr(scaler, "_per_optimizer_states", None) if scaler is not None else None
    return states if isinstance(states, dict) else {}


def reset_scaler(scaler: Any) -> None:
    """Forget that `scaler.unscale_(optimizer)` ran in the failed attempt, so that the retry may
    call it again (else "unscale_() has already been called on this optimizer since the last
    update()"): what `update()` does to this record, without changing the scale or its growth
    tracker. The retry recomputes the gradients from None, as if the attempt had never run."""
    _scaler_states(scaler).clear()


#: What a guard decides after an OOM: the retry's accumulation (or micro-batch), or the error to
#: raise (the OOM itself when the guard's own work failed).
_Decision = int | torch.OutOfMemoryError


def _optimizer_oom(e: torch.OutOfMemoryError) -> torch.OutOfMemoryError:
    # The lighter optimizers the planner may switch to (their OptimizerSpec rows).
    lighter = " or ".join(s.title for s in lighter_specs())
    return torch.OutOfMemoryError(
        "Out of memory in or after optimizer.step(): not retried, because (part of) the update "
        f"may already be applied. A smaller micro-batch does not shrink optimizer memory: use "
        f"a lighter optimizer ({lighter}), or shard the optimizer state. ({e})"
    )


class GuardedStep:
    """A `TrainStep` whose `step` survives OOM; see `oom_guard`. Other attributes pass through.

    `micro_batch_size` is the largest micro-batch that ran after an OOM (None before any):
    each later step sets `setup.grad_accum = ceil(batch size / micro_batch_size)`. `failed`
    says where and why the guard's own work failed, if it did: it then stopped guarding (said
    once in a warning) and steps run as they would without it.
    """

    def __init__(self, setup: TrainStep, *, min_micro_batch: int = 1, scaler: Any = None) -> None:
        self.setup = setup
        self.min_micro_batch = min_micro_batch
        self.scaler = scaler if scaler is not None else getattr(setup, "scaler", None)
        self.micro_batch_size: int | None = None
        self.retries = 0
        self.failsafe = Failsafe("memfit's oom_guard")

    def __getattr__(self, name: str) -> Any:
        if name in ("setup", "failsafe"):  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.setup, name)

    @property
    def failed(self) -> str | None:
        return self.failsafe.failed

    def step(self, batch: Any, *args: Any, **kwargs: Any) -> float:
        """`setup.step(batch, ...)`, redone with more accumulation after an OOM."""
        s = self.setup
        size = batch_size_of(batch)
        if self.micro_batch_size is not None:
            s.grad_accum = accumulation_for(size, self.micro_batch_size)
        fs = self.failsafe
        while True:
            watch = _OptimizerWatch(s.optimizer, self.scaler)
            if fs.call("watching optimizer.step()", watch.__enter__, default=None) is None:
                return s.step(batch, *args, **kwargs)  # unguarded, as without memfit
            try:
                return s.step(batch, *args, **kwargs)
            except torch.OutOfMemoryError as e:
                # No name may keep `e` past this block: its frames hold the step's tensors.
                decision = fs.call("deciding on a retry", self._decide, e, watch, size,
                                   default=cast(_Decision, e))  # fmt: skip
                if isinstance(decision, torch.OutOfMemoryError):
                    if decision is e:  # the guard failed: the error, as without memfit
                        raise
                    raise decision from e
                new, message = decision, str(e)
            finally:
                with fs.guard("watching optimizer.step()"):  # removed also after a failure
                    watch.__exit__(None, None, None)
            # The exception and its frames are gone here; the step's tensors can be freed.
            if not fs.call("freeing memory for the retry", self._prepare_retry, size, new,
                           default=False):  # fmt: skip
                raise torch.OutOfMemoryError(f"{message} (not retried: {fs.failed})")

    def _decide(self, e: torch.OutOfMemoryError, watch: _OptimizerWatch, size: int) -> _Decision:
        """The accumulation to retry with, or the error to raise instead."""
        s = self.setup
        if watch.started:
            return _optimizer_oom(e)
        new = _more_accumulation(size, s.grad_accum, self.min_micro_batch)
        if new is None:
            return torch.OutOfMemoryError(
                f"Out of memory with micro-batch {_ceil_div(size, s.grad_accum)} "
                f"(batch {size} in {s.grad_accum} micro-batches), and it cannot be "
                f"halved (min_micro_batch={self.min_micro_batch}). ({e})"
            )
        return new

    def _prepare_retry(self, size: int, new: int) -> bool:
        s = self.setup
        free_memory(s.model, s.optimizer)
        reset_scaler(self.scaler)
        self.micro_batch_size = _ceil_div(size, new)
        log.warning(
            "CUDA out of memory at micro-batch %d: retrying the step with micro-batch %d "
            "and gradient accumulation %d (effective batch %d unchanged).",
            _ceil_div(size, s.grad_accum), self.micro_batch_size, new, size,
        )  # fmt: skip
        s.grad_accum = new
        self.retries += 1
        return True


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def accumulation_for(size: int, micro_batch_size: int) -> int:
    """Micro-batches for a batch of `size` samples so that none has more than
    `micro_batch_size` (TrainSetup.split makes sizes that differ by at most one)."""
    return min(max(_ceil_div(size, micro_batch_size), 1), size)


def _more_accumulation(size: int, accum: int, min_micro: int) -> int | None:
    """The accumulation whose largest micro-batch is half the current one (rounded up), or None
    when the micro-batch is one sample or its smallest would fall below `min_micro`."""
    new = accumulation_for(size, _ceil_div(_ceil_div(size, accum), 2))
    return new if new > accum and size // new >= min_micro else None


class _GuardedFunction:
    def __init__(self, fn: Callable[..., Any], *, model: Any, optimizer: Any, scaler: Any,
                 min_micro_batch: int) -> None:  # fmt: skip
        functools.update_wrapper(self, fn)
        self.fn, self.model, self.optimizer, self.scaler = fn, model, optimizer, scaler
        self.min_micro_batch = min_micro_batch
        self.micro_batch_size: int | None = None  # the last size that ran (kept for next calls)
        self.retries = 0
        self.failsafe = Failsafe("memfit's oom_guard")

    @property
    def failed(self) -> str | None:
        """Where and why the guard's own work failed (it then stopped guarding), or None."""
        return self.failsafe.failed

    def __call__(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        size = batch_size_of(batch)
        mbs = min(self.micro_batch_size or size, size)
        fs = self.failsafe
        while True:
            watch = _OptimizerWatch(self.optimizer, self.scaler)
            if fs.call("watching optimizer.step()", watch.__enter__, default=None) is None:
                return self.fn(batch, *args, micro_batch_size=mbs, **kwargs)  # unguarded
            try:
                out = self.fn(batch, *args, micro_batch_size=mbs, **kwargs)
                self.micro_batch_size = mbs
                return out
            except torch.OutOfMemoryError as e:
                # No name may keep `e` past this block: its frames hold the step's tensors.
                decision = fs.call("deciding on a retry", self._decide, e, watch, mbs,
                                   default=cast(_Decision, e))  # fmt: skip
                if isinstance(decision, torch.OutOfMemoryError):
                    if decision is e:  # the guard failed: the error, as without memfit
                        raise
                    raise decision from e
                new, message = decision, str(e)
            finally:
                with fs.guard("watching optimizer.step()"):  # removed also after a failure
                    watch.__exit__(None, None, None)
            if not fs.call("freeing memory for the retry", self._prepare_retry, mbs, new,
                           default=False):  # fmt: skip
                raise torch.OutOfMemoryError(f"{message} (not retried: {fs.failed})")
            mbs = new

    def _decide(self, e: torch.OutOfMemoryError, watch: _OptimizerWatch, mbs: int) -> _Decision:
        """The micro-batch size to retry with, or the error to raise instead."""
        if watch.started:
            return _optimizer_oom(e)
        if mbs // 2 < self.min_micro_batch:
            return torch.OutOfMemoryError(
                f"Out of memory with micro_batch_size={mbs}, which cannot be halved "
                f"(min_micro_batch={self.min_micro_batch}). ({e})"
            )
        return mbs // 2

    def _prepare_retry(self, mbs: int, new: int) -> bool:
        free_memory(self.model, self.optimizer)
        reset_scaler(self.scaler)
        log.warning("CUDA out of memory at micro_batch_size=%d: retrying with %d.", mbs, new)
        self.retries += 1
        return True


def oom_guard(setup_or_fn: Any = None, *, model: torch.nn.Module | None = None,
              optimizer: Any = None, scaler: Any = None,
              min_micro_batch: int = 1) -> Any:  # fmt: skip
    """Retry a training step that runs out of memory with half the micro-batch.

    Two forms:

    - `oom_guard(setup)` with a `TrainStep` (e.g. what `memfit.apply_` returns) gives a
      `GuardedStep`: on OOM it raises `setup.grad_accum` until the largest micro-batch is half
      the one that failed (sizes may differ by one sample: 62 samples go 31+31, then 4 x 16,
      then 8 x 8), frees memory and redoes the whole step. The effective batch is unchanged
      and the optimizer steps once: `TrainStep.step` only steps after every micro-batch
      succeeded, and the guard sets gradients to None before the retry. The micro-batch that
      ran is kept (`guarded.micro_batch_size`): each later step sets `setup.grad_accum =
      ceil(batch size / micro_batch_size)`, so a smaller last batch takes fewer micro-batches.
    - `@oom_guard` (or `@oom_guard(model=..., optimizer=...)`) on
      `def train_step(batch, micro_batch_size)`: the function runs forward/backward over
      micro-batches of `micro_batch_size` samples, weighting each loss by its share of the
      batch, then steps. It is first called with the whole batch, and on OOM again with half
      the micro-batch; the size that ran is kept (`train_step.micro_batch_size`). Pass
      `model=`/`optimizer=` so the guard sets gradients to None before a retry, or start the
      function with `optimizer.zero_grad(set_to_none=True)`.

    With a GradScaler (`scaler=`, or the setup's `scaler` attribute), an OOM after
    `scaler.unscale_(optimizer)` (in gradient clipping, say) is retried: the guard makes the
    scaler forget this iteration's unscale, keeping its scale. An OOM once `scaler.step()` has
    stepped is not retried, as after `optimizer.step()`.

    Limitation: the scaler's record of an iteration is private to torch.amp.GradScaler
    (`_per_optimizer_states`); after `scaler.update()` it is gone, so an OOM after update() in
    a step whose `optimizer.step()` the scaler skipped (inf/NaN gradients) is retried, with
    the reduced scale.

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
            oom_guard, model=model, optimizer=optimizer, scaler=scaler,
            min_micro_batch=min_micro_batch,
        )  # fmt: skip
    if isinstance(setup_or_fn, TrainStep):
        return GuardedStep(setup_or_fn, min_micro_batch=min_micro_batch, scaler=scaler)
    if callable(setup_or_fn):
        return _GuardedFunction(
            setup_or_fn, model=model, optimizer=optimizer, scaler=scaler,
            min_micro_batch=min_micro_batch,
        )  # fmt: skip
    raise BadInputError(
        f"oom_guard needs a training setup (model, optimizer, grad_accum, step(batch)) or a "
        f"function train_step(batch, micro_batch_size), got {type(setup_or_fn).__name__}."
    )
