"""A Hugging Face `Trainer` callback that estimates the run before its first step, stops it when
it will not fit (naming the `TrainingArguments` to change), then measures the first steps.

Example:
    >>> from memfit.integrations.transformers import MemfitCallback
    >>> trainer = Trainer(model, args, train_dataset=ds, callbacks=[MemfitCallback(gpu="rtx-4090")])
    >>> trainer.train()   # prints the estimate; raises WontFitError before step 1 if it won't fit

What it reads at `on_train_begin`: the model as the Trainer prepared it (LoRA adapters, frozen
parameters, bitsandbytes-quantized layers, activation checkpointing), `TrainingArguments`
(gradient accumulation, bf16/fp16), the optimizer the Trainer built, and the shapes of the
first batch of the train dataloader (read from a fresh iterator over the underlying DataLoader,
with every random generator's state saved and restored, so training draws the same batches).
The callback changes nothing of the model, the arguments or the data; it only raises when the
run will not fit.

A model quantized by bitsandbytes (QLoRA) is read from its layers. Several processes are DDP,
or FSDP2 with `fsdp` (the model is copied at `on_init_end`, before the Trainer shards it).
Limits: DeepSpeed and FSDP1 runs are not read (a message says so and training goes on, unless
`strict=True`); see docs/integrations.md.
An out-of-memory error inside the measured steps leaves the Trainer before any callback runs:
call `callback.explain_oom(error)` in an `except torch.OutOfMemoryError` around `train()`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import transformers

from memfit.errors import BadInputError, TraceError
from memfit.integrations._hf_args import (
    OPTIM_LAYOUTS,
    argument_changes,
    current_arguments,
    read_run,
    training_arguments_for,
)
from memfit.integrations._reading import meta_copy
from memfit.integrations._session import (
    Comparison,
    SessionResults,
    WontFitError,
    callback_hook,
)

__all__ = [
    "OPTIM_LAYOUTS",
    "Comparison",
    "MemfitCallback",
    "WontFitError",
    "first_batch",
    "training_arguments_for",
]


class MemfitCallback(SessionResults, transformers.TrainerCallback):
    """Estimate the Trainer's run before its first step; stop it if it will not fit; measure
    the first steps and compare.

    Args:
        gpu: the GPU to size for (a catalog name or a budget, "rtx-4090@12GiB"); None: the
            CUDA device the Trainer uses (no verdict on a CPU run).
        measure_steps: optimizer steps measured (memfit.measure) and compared with the
            estimate; 0 measures nothing.
        stop: raise WontFitError before the first step when the run will not fit (else only
            print the plan).
        strict: raise when the run cannot be estimated (an optimizer or setup memfit does not
            model) instead of printing why and training on.
        print_fn: where reports go (print).

    After training: `estimate`, `plan` (when it did not fit), `comparison`, and `failed`:
    an unexpected error in memfit's own work is printed once, stops the callback and lets
    training go on (unless `strict`); `failed` then says where and why.
    """

    _unsharded: Any = None
    _unsharded_error: BadInputError | None = None

    @callback_hook("copying the model before sharding (on_init_end)")
    def on_init_end(self, args, state, control, model=None, **kwargs):
        # With FSDP the Trainer shards the model as training begins (accelerate's prepare, in
        # place): the estimate reads a meta copy made now, before it is sharded.
        if getattr(args, "fsdp", None) and model is not None:
            try:
                self._unsharded = meta_copy(model)
            except BadInputError as e:
                self._unsharded_error = e

    @callback_hook("estimating the run (on_train_begin)")
    def on_train_begin(self, args, state, control, model=None, optimizer=None,
                       train_dataloader=None, **kwargs):  # fmt: skip
        s = self.session
        try:
            if model is None or train_dataloader is None:
                raise BadInputError("The Trainer passed no model or train dataloader.")
            if self._unsharded_error is not None:
                raise self._unsharded_error
            reading = read_run(args, model, optimizer, first_batch(train_dataloader),
                               unsharded=self._unsharded)  # fmt: skip
            s.run_estimate(reading, args.device)
        except (BadInputError, TraceError) as e:
            if self.strict:
                raise
            s.print_fn(f"memfit: this run was not estimated: {e}")
            return
        s.check_fit(lambda w: argument_changes(w, args), lambda: current_arguments(args),
                    fsdp_mixed="accelerate")  # fmt: skip

    @callback_hook("starting the measurement (on_step_begin)")
    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        s = self.session
        if s.measure_steps and not s.measuring and s.comparison is None and model is not None:
            self._measure_until = state.global_step + s.measure_steps
            s.start_measuring(model, optimizer)

    @callback_hook("ending the measurement (on_step_end)")
    def on_step_end(self, args, state, control, **kwargs):
        if self.session.measuring and state.global_step >= self._measure_until:
            self.session.stop_measuring()

    @callback_hook("ending the measurement (on_train_end)")
    def on_train_end(self, args, state, control, **kwargs):
        if self.session.measuring:  # fewer steps than measure_steps
            self.session.stop_measuring()

    @callback_hook("explaining the out-of-memory error")
    def explain_oom(self, error: BaseException) -> None:
        """After `torch.OutOfMemoryError` escaped `trainer.train()` during the measured steps:
        end the measurement and print what held the memory."""
        self.session.stop_measuring(error)


@contextmanager
def _rng_kept() -> Iterator[None]:
    """Every random generator's state, restored after the block (torch CPU and CUDA, Python's,
    NumPy's when imported)."""
    import sys

    np = sys.modules.get("numpy")
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    py = random.getstate()
    npstate = np.random.get_state() if np is not None else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(py)
        if np is not None:
            np.random.set_state(npstate)


def first_batch(dataloader: Any) -> Any:
    """The first batch of `dataloader`, read from a fresh iterator of the DataLoader under
    accelerate's wrapper (whose own iteration would move its epoch and state), with the random
    generators restored, so the training run draws the same batches."""
    base = getattr(dataloader, "base_dataloader", dataloader)
    with _rng_kept():
        iterator = iter(base)
        try:
            batch = next(iterator)
        except StopIteration:
            raise BadInputError("The train dataloader yields no batch.") from None
        finally:
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if callable(shutdown):
                shutdown()
    return batch
