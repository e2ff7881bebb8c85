"""`TrainSetup`: the training step `memfit.apply_` returns, with the habits that keep memory flat.

`setup.step(batch)` runs one optimizer step: the batch is split into `grad_accum` micro-batches,
each runs forward under autocast (when the plan uses mixed precision) and backward (through the
GradScaler with fp16), with its loss weighted by its share of the samples; the optimizer steps
once, then `zero_grad(set_to_none=True)`. No autograd graph outlives its backward: the loss is
returned as a Python float, and outputs and losses are dropped before the next micro-batch.

This is the loop memfit's estimate traces (memfit.estimator.trace.step_runner), so the estimate is
of
this loop.

Users with their own loop take the pieces:

    for i, micro in enumerate(setup.split(batch)):
        with setup.accumulate(last=i == setup.grad_accum - 1), setup.autocast():
            loss = model(**micro.data).loss * micro.weight
        setup.backward(loss)
        del loss
    setup.optimizer_step()
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from memfit.errors import BadInputError
from memfit.techniques.parallel.data_parallel import unwrap
from memfit.techniques.weights_io import save_weights


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch and the weight of its loss (its share of the batch's samples)."""

    data: Any
    weight: float


@dataclass
class TrainSetup:
    """A model with its techniques applied, and the step that trains it.

    Attributes:
        model: the (changed in place) model.
        optimizer: built from the plan, or None when the plan has no optimizer config.
        scaler: a GradScaler with fp16 mixed precision, else None.
        autocast_dtype: the autocast dtype with mixed precision, else None.
        grad_accum: micro-batches per optimizer step.
        device: where the model runs (an embedding kept on the CPU aside).
        techniques: what apply_ did, as short labels.
        loss_fn: `loss_fn(output, micro_batch) -> loss` used by `step` when it is given none.
        notes: what the model does not carry and a trainer other than `step` must do itself
            (loss scaling, accumulation, the optimizer step), and defaults apply_ chose.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    scaler: Any
    autocast_dtype: torch.dtype | None
    grad_accum: int
    device: torch.device
    techniques: tuple[str, ...] = ()
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    notes: tuple[str, ...] = ()

    # -- pieces -----------------------------------------------------------------------------

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast with the plan's dtype, or nothing in fp32 / pure precision."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @contextlib.contextmanager
    def accumulate(self, *, last: bool) -> Iterator[None]:
        """Synchronise gradients across ranks only on the last micro-batch.

        DDP: `no_sync()` on the others; FSDP2: `set_requires_gradient_sync(last)`.
        """
        m: Any = self.model
        if hasattr(m, "set_requires_gradient_sync"):  # FSDP2
            m.set_requires_gradient_sync(last)
            try:
                yield
            finally:  # an exception must not leave the next backward unsynchronised
                m.set_requires_gradient_sync(True)
        elif not last and hasattr(m, "no_sync"):  # DDP, FSDP1
            with m.no_sync():
                yield
        else:
            yield

    def split(self, batch: Any) -> Iterator[MicroBatch]:
        """The batch as `grad_accum` micro-batches along dim 0, each moved to the device when
        it is reached (the device holds one micro-batch of inputs at a time).

        The batch size is the most common first dimension among the batch's tensors (a
        (1, S) `position_ids` is passed whole); tensors of that first dimension are split,
        others are passed whole. Sizes differ by at most one when the batch does not divide
        evenly; weights follow. The weights are shares of samples: with a loss averaged over
        tokens and padded labels (-100), micro-batches with more padding weigh a little more
        than in one big batch.
        """
        leaves, spec = pytree.tree_flatten(batch)
        dims = [t.shape[0] for t in leaves if isinstance(t, torch.Tensor) and t.dim() > 0]
        if not dims:
            raise BadInputError(
                f"Cannot split a batch of type {type(batch).__name__}: it holds no tensor with "
                "a batch dimension. Pass a tensor, or a dict/tuple of tensors."
            )
        n = max(set(dims), key=lambda d: (dims.count(d), d))
        k = self.grad_accum
        if k > n:
            raise BadInputError(
                f"The batch has {n} samples but grad_accum is {k}: each micro-batch needs at "
                f"least one. Use a batch of at least {k} samples or fewer accumulation steps."
            )
        pieces = [
            torch.tensor_split(t, k) if isinstance(t, torch.Tensor) and t.dim() > 0
            and t.shape[0] == n else None
            for t in leaves
        ]  # fmt: skip
        for i in range(k):
            parts = [
                (p[i] if p is not None else t).to(self.device)
                if isinstance(t, torch.Tensor) else t
                for t, p in zip(leaves, pieces, strict=True)
            ]  # fmt: skip
            size = next(p[i].shape[0] for p in pieces if p is not None)
            yield MicroBatch(data=pytree.tree_unflatten(parts, spec), weight=size / n)

    def backward(self, loss: torch.Tensor) -> None:
        """loss.backward(), through the GradScaler when there is one."""
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def optimizer_step(self) -> None:
        """Step (unscaling and skipping on inf with the GradScaler), then free the gradients."""
        if self.optimizer is None:
            raise BadInputError(
                "This setup has no optimizer: give apply_ an OptimizerConfig (or a plan)."
            )
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    # -- the step ---------------------------------------------------------------------------

    def step(self, batch: Any, loss_fn: Callable[[Any, Any], torch.Tensor] | None = None) -> float:
        """One optimizer step over `batch`; returns the batch's mean loss as a float.

        Args:
            batch: a tensor, or a dict / tuple of tensors (a dict is passed as keyword
                arguments, `(inputs, targets)` passes inputs), split into micro-batches.
            loss_fn: `loss_fn(output, micro_batch) -> loss`; by default `self.loss_fn`, else
                the output's `.loss` (HF models given labels) or the output itself when it is
                a scalar.
        """
        loss_fn = loss_fn or self.loss_fn
        total = 0.0
        k = self.grad_accum
        for i, mb in enumerate(self.split(batch)):
            with self.accumulate(last=i == k - 1):
                with self.autocast():
                    out = call_model(self.model, mb.data)
                    loss = _loss(out, mb.data, loss_fn)
                    del out
                weighted = loss * mb.weight if k > 1 else loss
                self.backward(weighted)
                total += float(loss.detach()) * mb.weight
                del loss, weighted
        if self.optimizer is not None:
            self.optimizer_step()
        return total

    def save(self, path: str) -> None:
        """Save the weights as safetensors, loadable into the unmodified model
        (`memfit.load_weights`): LoRA merged, tied tensors stored once."""

        save_weights(unwrap(self.model), path)


def call_model(model: torch.nn.Module, batch: Any) -> Any:
    """The model on a batch: a dict as keyword arguments, `(inputs, targets)` passes inputs,
    another tuple is unpacked, anything else is the one argument."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(batch[0]) if len(batch) == 2 else model(*batch)
    return model(batch)


def _loss(out: Any, batch: Any, loss_fn: Callable[[Any, Any], torch.Tensor] | None) -> Any:
    if loss_fn is not None:
        return loss_fn(out, batch)
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is None and isinstance(out, torch.Tensor) and out.dim() == 0:
        loss = out
    if loss is None and isinstance(out, (tuple, list)) and out:  # HF return_dict=False
        first = out[0]
        if isinstance(first, torch.Tensor) and first.dim() == 0:
            loss = first
    if not isinstance(loss, torch.Tensor):
        raise BadInputError(
            f"The model returned {type(out).__name__} with no loss. Pass labels in the batch "
            "(HF models) or loss_fn=lambda output, batch: F.cross_entropy(output, batch[1])."
        )
    return loss
