"""`memfit.doctor`: memory anti-patterns found at run time in a real training loop.

    with doctor() as dr:
        for x, y in loader:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    for f in dr.findings:
        print(f.filename, f.lineno, f.kind, f.bytes, f.message, f.fix)

Step boundaries are the `step()` calls of the first optimizer that steps (or of `optimizer`);
loops without an optimizer call `dr.step()` once per step (after the first `dr.step()`,
optimizer steps are not boundaries). What is found (each `Finding` names the line, what keeps
the memory, the bytes and the fix):

* ``graph-kept-alive``: a tensor with an autograd graph made before the previous boundary is
  still alive at a boundary, i.e. it outlived a whole step: a loss kept in a variable
  (`last_loss = loss`), outputs kept in a list without `.detach()`; or a tensor whose graph
  chains steps (`total_loss += loss`, a hidden state not detached), which keeps the graph of
  every step: it reaches nodes of at least two steps before the previous boundary (so from
  the third boundary on). A graph that reaches one earlier step only is not a chain: a GAN's
  generator loss uses the generator's output made before the discriminator's step, the
  boundary. Bytes: the held tensors plus what their old graph nodes saved for backward
  (nothing once backward ran, everything if it never did), each storage once, parameters
  excluded (see Note [Old autograd nodes] in `doctor_graph`). The `loss` of the standard loop,
  alive until the next step reassigns it, is not reported: after `backward()` its graph holds
  no saved tensors.
* ``growth``: what outlives steps sets a new high at `GROWTH_MIN_STEPS` consecutive boundaries
  (new highs, not mere rises, so that varying batch shapes are not growth). Counted: the live
  storages made inside the block before the current step, and those made from their own
  line's value of an earlier step (`history = torch.cat([history, out])`); not the current
  step's working set (so a curriculum's growing batches are not growth), not optimizer state
  (made lazily: a multi-task head's first step, LBFGS history), not what graph-kept-alive
  findings explain. Measured as `torch.cuda.memory_allocated` less those when the model (or
  optimizer) is on CUDA, else as bytes of storages. Boundaries 0 and 1 are warm-up (gradients
  and optimizer state appear at 0; whether a storage outlives its step shows one step later)
  and are not compared. The line is where the growing storages were made.
* ``eval-without-no-grad``: a forward pass run with grad enabled whose graph was freed (or was
  still alive at exit) without any backward using it. Bytes: what the death of one pass's
  graph freed, i.e. what only the graph kept alive (hidden activations, an input batch no
  variable holds any more); for graphs still alive at exit, what they saved that no Python
  tensor holds.
* ``retain-graph-in-loop``: `backward(retain_graph=True)` called at least `RETAIN_MIN_CALLS`
  times from one line while no later backward used the retained graph. Bytes: what the death
  of one retained graph freed (for one still alive at exit, what only it holds).

Overhead: a TorchFunctionMode, a TorchDispatchMode and saved-tensor hooks run for the whole
block: a few Python calls and, for new tensors, a walk of the Python stack per op, about 10 µs
per op on a laptop CPU. Measured: an MLP of 24 small modules with AdamW (about 600 ops per
step) goes from 3.3 to 16 ms per step; 8 layers of width 1024 at batch 256 show no difference.
Each boundary walks the live autograd graphs (bounded by `WALK_BUDGET_NODES`) and the live
storages; the first time a finding appears, the garbage collector is asked who holds the
tensor (a heap scan).

Limitations: single-threaded forward passes (autograd sequence numbers are per thread); code
compiled by `torch.compile` is not seen op by op, and tensors saved inside another
saved-tensor-hooks context (non-reentrant checkpointing) are not seen by the hooks; tensor
subclasses (DTensor, wrapper tensors) are not measured; a tensor computed from parameters once
before the loop and reused in every step is reported as kept alive; growth smaller than the
CUDA allocator's 512-byte rounding per step is not seen on CUDA; a step's working set that
grows because it is rebuilt from an earlier step's value at the same line is growth; one doctor
at a time.
"""

from __future__ import annotations

import sys
import weakref
from contextlib import ExitStack
from types import TracebackType
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from memfit.diagnosis.findings import (
    EVAL_WITHOUT_NO_GRAD,
    GRAPH_KEPT_ALIVE,
    GROWTH,
    GROWTH_MIN_STEPS,
    KINDS,
    RETAIN_GRAPH_IN_LOOP,
    RETAIN_MIN_CALLS,
    Finding,
    Findings,
)
from memfit.diagnosis.saved_tensors import SavedBook
from memfit.diagnosis.sites import Clock
from memfit.diagnosis.tracking import GradTracker, StorageTracker
from memfit.errors import Failsafe, MemfitError

__all__ = [
    "EVAL_WITHOUT_NO_GRAD",
    "GRAPH_KEPT_ALIVE",
    "GROWTH",
    "GROWTH_MIN_STEPS",
    "KINDS",
    "RETAIN_GRAPH_IN_LOOP",
    "RETAIN_MIN_CALLS",
    "Doctor",
    "Finding",
    "doctor",
]


class Doctor:
    """Watches a training loop for memory anti-patterns; use it through `doctor()`.

    `findings` can be read at any time; it is final after the block exits. `steps` is the
    number of step boundaries seen.
    """

    def __init__(
        self,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        model: torch.nn.Module | None = None,
    ) -> None:
        self._optimizer = optimizer
        self._model = model
        self._clock = Clock()
        # Everything the doctor runs inside the loop is guarded: its own failure stops it
        # (the recorders pass everything through) and the loop runs on (memfit.errors.Failsafe).
        self._failsafe = Failsafe("memfit.doctor")
        self._failsafe.on_trip(self._stop)
        self._found_before_failure: list[Finding] = []
        self._book = SavedBook(self._clock, self._failsafe)
        self._grad = GradTracker(self._clock, self._book, self._failsafe)
        self._storages = StorageTracker(self._clock, self._failsafe)
        self._checks = Findings(self._clock, self._grad, self._storages, self._book)
        self._stack: ExitStack | None = None
        self._used = False
        self._manual = False
        self._primary: torch.optim.Optimizer | None = optimizer
        self._optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        if optimizer is not None:
            self._optimizers.add(optimizer)

    @property
    def steps(self) -> int:
        return self._clock.step

    @property
    def findings(self) -> list[Finding]:
        """What was found; after a failure of the doctor's own (`failed`), what was found
        before it."""
        if self.failed is None:
            return self._checks.findings(final=not self._book.active)
        return self._found_before_failure

    @property
    def failed(self) -> str | None:
        """Where and why the doctor's own bookkeeping failed inside the block, or None. It
        then stopped watching (said once in a warning) and the block ran on without it."""
        return self._failsafe.failed

    def step(self) -> None:
        """Mark a step boundary by hand (for loops without an optimizer)."""
        if self._stack is None or not self._book.active:
            raise MemfitError("dr.step() marks a step inside the `with doctor() as dr:` block.")
        self._manual = True
        self._failsafe.call("analysing a step boundary", self._boundary, default=None)

    def _stop(self) -> None:
        """Stop for good after a failure of the doctor's own: keep what was found so far."""
        self._clock.stopped = True
        self._found_before_failure = self._checks.findings(final=False)

    def __enter__(self) -> Doctor:
        if self._used:
            raise MemfitError("A Doctor watches one block; call memfit.doctor() again.")
        self._used = True
        self._clock.root = sys._getframe(1)
        stack = ExitStack()
        self._stack = stack
        with self._failsafe.guard("starting the doctor"):
            # Every optimizer's step is seen (their state is left out of growth); the
            # boundaries are those of `self._primary`.
            on_step = self._failsafe.hook(self._on_step, "the doctor's optimizer step hook")
            stack.callback(register_optimizer_step_post_hook(on_step).remove)
            stack.enter_context(self._grad)
            stack.enter_context(self._storages)
            stack.enter_context(
                torch.autograd.graph.saved_tensors_hooks(self._book.pack, self._book.unpack)
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._stack is not None
        self._clock.paused = True
        try:
            if not self._clock.stopped:
                with self._failsafe.guard("ending the doctor"), torch._C.DisableTorchFunction():
                    self._book.close()
        finally:
            self._clock.root = None  # a finished frame would keep its variables alive
            with self._failsafe.guard("removing the doctor's hooks"):
                self._stack.close()

    def _on_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._optimizers.add(optimizer)
        if self._manual:
            return
        if self._primary is None:
            self._primary = optimizer
        if optimizer is self._primary:
            self._boundary()

    def _boundary(self) -> None:
        if self._clock.stopped:
            return
        self._clock.paused = True
        try:
            with torch._C.DisableTorchFunction():  # the analysis's own tensor accesses
                self._checks.boundary(self._cuda_device(), list(self._optimizers))
            self._book.new_burst()
            self._clock.step += 1
        finally:
            self._clock.paused = False

    def _cuda_device(self) -> torch.device | None:
        params: list[torch.nn.Parameter] = []
        if self._model is not None:
            params = list(self._model.parameters())[:1]
        elif self._primary is not None:
            params = [p for g in self._primary.param_groups for p in g["params"]][:1]
        return params[0].device if params and params[0].is_cuda else None


def doctor(
    *, optimizer: torch.optim.Optimizer | None = None, model: torch.nn.Module | None = None
) -> Doctor:
    """Watch the training loop run inside `with doctor() as dr:` for memory anti-patterns.

    Args:
        optimizer: the optimizer whose `step()` marks step boundaries (default: the first
            optimizer that steps inside the block).
        model: the model; on CUDA its device selects `torch.cuda.memory_allocated` for growth.

    Example:
        >>> with doctor() as dr:
        ...     for _ in range(4):
        ...         loss = model(x).sum(); loss.backward(); opt.step(); opt.zero_grad()
        >>> dr.findings
        []
    """
    return Doctor(optimizer=optimizer, model=model)
