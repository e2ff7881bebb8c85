"""The Lightning callback's logic, for either namespace (`lightning.pytorch` and
`pytorch_lightning` have distinct Callback classes): memfit.integrations.lightning and
memfit.integrations.pytorch_lightning subclass their namespace's Callback with `LightningHooks`.

What it reads at the first `on_train_batch_start` (the batch is at hand, the optimizer built):
the LightningModule as the trainer set it up (its precision plugin's cast, frozen parameters,
LoRA, transformers' activation checkpointing inside it), the trainer's precision, gradient
accumulation and strategy, the optimizer, and the batch's shapes. The traced step is the
module's own `training_step(batch, 0)` on a meta copy of the module (detached from the
trainer, so `self.log` does nothing there), its loss the step's returned loss.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from memfit._compat import checkpointing_enable_method
from memfit.errors import BadInputError, TraceError
from memfit.estimator import Tracker, traced_micro_batches
from memfit.events import Category
from memfit.integrations._reading import (
    BatchTemplate,
    checkpointing_of,
    ddp_setting_note,
    meta_copy,
    model_notes,
    optimizer_layout,
    precision_of,
    spec_of_run,
    strip_hf_checkpointing,
)
from memfit.integrations._session import RunReading, SessionResults, callback_hook
from memfit.workload import Workload

#: Lightning precision -> the autocast dtype it runs ("-true" precisions cast the module; the
#: trace keeps the dtypes the module has, and `precision_of` reads them).
_AUTOCAST = {
    "32-true": None, "32": None, "bf16-mixed": "bfloat16", "16-mixed": "float16",
    "bf16-true": None, "16-true": None,
}  # fmt: skip


class _Batch:
    """One batch handed to the traced step as one argument (memfit's step would unpack a tuple
    batch as (inputs, targets))."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _TrainingStep(torch.nn.Module):
    """A LightningModule's `training_step(batch, 0)` as a module's forward (its loss out).

    Note: [Lightning zeroes gradients after the next forward]
        Lightning's automatic optimization runs `training_step`, *then* `zero_grad` (in its
        Closure, on the first micro-batch of each accumulation window), then backward: the
        previous step's gradients are alive through the next forward. memfit's traced loop
        zeroes them right after the optimizer step. To trace what Lightning runs, the forward
        of each step after the first (first micro-batch only) holds gradient-sized tensors,
        marked as gradients, freed when the forward returns, as Lightning's `zero_grad` frees
        the real ones.
    """

    def __init__(self, module: torch.nn.Module, micro_batches: int) -> None:
        super().__init__()
        self.module = module
        self.micro_batches = micro_batches
        self.calls = 0

    def forward(self, batch: _Batch) -> Any:
        step, micro = divmod(self.calls, self.micro_batches)
        self.calls += 1
        held = self._previous_gradients() if self.training and step > 0 and micro == 0 else []
        with warnings.catch_warnings():  # self.log without a trainer: a warning per call
            warnings.simplefilter("ignore")
            out = self.module.training_step(batch.value, 0)  # type: ignore[operator]
        del held  # Lightning's zero_grad, before backward
        return out

    def _previous_gradients(self) -> list[torch.Tensor]:
        tracker = next((m for m in _get_current_dispatch_mode_stack() if isinstance(m, Tracker)),
                       None)  # fmt: skip
        held = []
        for p in dict.fromkeys(self.parameters()):
            if p.requires_grad:
                g = torch.empty_like(p)
                if tracker is not None:
                    tracker.mark(g, Category.GRADIENTS)
                held.append(g)
        return held


def _ddp_notes(strategy: Any) -> list[str]:
    """What a DDPStrategy's DistributedDataParallel arguments change of memfit.estimator.ddp's
    buckets: said in a note, or refused where the estimate would be wrong."""
    kwargs = dict(getattr(strategy, "_ddp_kwargs", None) or {})
    if kwargs.get("gradient_as_bucket_view"):
        raise BadInputError(
            "DDPStrategy(gradient_as_bucket_view=True): the gradients are views into DDP's "
            "buckets, one copy instead of two, which memfit does not model. Drop it for the "
            "estimate (memfit.estimate(model, Workload(gpus=N, ddp=True)) is then an upper "
            "bound by the gradients' bytes)."
        )
    return [ddp_setting_note(f"DDPStrategy({key}={kwargs[key]!r})")
            for key in ("bucket_cap_mb", "find_unused_parameters")
            if kwargs.get(key) not in (None, False)]  # fmt: skip


def read_run(trainer: Any, pl_module: torch.nn.Module, batch: Any) -> RunReading:
    """The Workload and ModelSpec of a Lightning run; BadInputError for what memfit does not
    model (several processes but DDP's, manual optimization, several optimizers, other
    precisions)."""
    world = int(getattr(trainer, "world_size", 1) or 1)
    strategy = type(getattr(trainer, "strategy", None)).__name__
    if world > 1 and not strategy.startswith("DDP"):
        raise BadInputError(
            f"The trainer runs {world} processes ({strategy}); the callback reads one process "
            "or DDP. Estimate a sharded run with memfit.estimate(model, Workload(gpus=N)) "
            "(FSDP2)."
        )
    if not getattr(pl_module, "automatic_optimization", True):
        raise BadInputError(
            "The LightningModule uses manual optimization (automatic_optimization=False): "
            "memfit traces one training_step with the trainer's backward and step."
        )
    optimizers = list(getattr(trainer, "optimizers", []) or [])
    if len(optimizers) > 1:
        raise BadInputError(
            f"configure_optimizers returned {len(optimizers)} optimizers; memfit models one."
        )
    precision = str(trainer.precision)
    if precision not in _AUTOCAST:
        raise BadInputError(
            f"Trainer(precision={precision!r}) is not modelled; memfit models "
            f"{', '.join(repr(p) for p in _AUTOCAST)}."
        )
    template = BatchTemplate.of(batch)
    checkpointing, first, notes = checkpointing_of(pl_module)
    notes += model_notes(pl_module)
    if world > 1:
        notes += _ddp_notes(trainer.strategy)
    workload = Workload(
        batch_size=template.batch_size,
        seq_len=template.seq_len,
        precision=precision_of(
            pl_module, _AUTOCAST[precision], who=f"Trainer(precision={precision!r})"
        ),
        optimizer=optimizer_layout(optimizers[0] if optimizers else None),
        grad_accum=int(trainer.accumulate_grad_batches),
        checkpointing=checkpointing,
        checkpoint_first=first,
        gpus=world,
        ddp=world > 1,  # DDPStrategy: each process the whole model plus its buckets
    )

    def build() -> torch.nn.Module:
        copy = strip_hf_checkpointing(meta_copy(pl_module, detach=(trainer,)))
        return _TrainingStep(copy, traced_micro_batches(workload))

    spec = spec_of_run(pl_module, template, name=type(pl_module).__name__, build=build,
                       loss="sum", wrap_batch=_Batch)  # fmt: skip
    notes.append(
        "Lightning zeroes gradients after the next training_step, so the previous step's "
        "gradients are alive through each forward; the trace holds them there."
    )
    return RunReading(spec=spec, workload=workload, notes=tuple(notes))


class LightningHooks(SessionResults):
    """The callback's hooks (see the module docstring); mixed into a namespace's Callback.

    Args:
        gpu: the GPU to size for (a catalog name or a budget, "rtx-4090@12GiB"); None: the
            CUDA device the module is on (no verdict on a CPU run).
        measure_steps: optimizer steps measured (memfit.measure) and compared; 0: none.
        stop: raise WontFitError before the first step when the run will not fit.
        strict: raise when the run cannot be estimated, instead of printing why.
        print_fn: where reports go (print).

    An unexpected error in memfit's own work is printed once, stops the callback and lets
    training go on (unless `strict`); `failed` then says where and why.
    """

    _read = False  # the first batch has been read (set on the instance then)

    @callback_hook("estimating the run (on_train_batch_start)")
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:  # fmt: skip
        s = self.session
        if self._read:
            return
        self._read = True
        try:
            reading = read_run(trainer, pl_module, batch)
            s.run_estimate(reading, pl_module.device)
        except (BadInputError, TraceError) as e:
            if self.strict:
                raise
            s.print_fn(f"memfit: this run was not estimated: {e}")
        else:
            s.check_fit(
                lambda w: argument_changes(w, trainer, reading.workload),
                lambda: current_settings(trainer, reading.workload),
            )
        if s.measure_steps:
            self._measure_until = trainer.global_step + s.measure_steps
            optimizers = list(getattr(trainer, "optimizers", []) or [])
            s.start_measuring(pl_module, optimizers[0] if optimizers else None)

    @callback_hook("ending the measurement (on_train_batch_end)")
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:  # fmt: skip
        if self.session.measuring and trainer.global_step >= self._measure_until:
            self.session.stop_measuring()

    @callback_hook("ending the measurement (on_train_end)")
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.session.measuring:
            self.session.stop_measuring()

    @callback_hook("explaining the out-of-memory error (on_exception)")
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """An out-of-memory error in the measured steps: what held the memory is printed."""
        if self.session.measuring:
            self.session.stop_measuring(exception)


def current_settings(trainer: Any, now: Workload) -> dict[str, Any]:
    """The settings `argument_changes` may change, as they are now."""
    return {
        "batch_size": now.batch_size,
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        "precision": str(trainer.precision),
    }


_PRECISION_OF = {"fp32": "32-true", "bf16-mixed": "bf16-mixed", "fp16-mixed": "16-mixed",
                 "bf16-true": "bf16-true", "fp16-true": "16-true"}  # fmt: skip


def argument_changes(
    w: Workload, trainer: Any, now: Workload
) -> tuple[dict[str, Any], list[str], list[str]]:
    """(changes, notes, missing): the Trainer arguments (and the DataLoader's batch size) that
    turn the run `now` into workload `w`; what no Trainer argument expresses, in words."""
    changes: dict[str, Any] = {"batch_size": w.batch_size}
    notes = ["batch_size is the DataLoader's (or the LightningDataModule's)"]
    other: list[str] = []
    if w.grad_accum != trainer.accumulate_grad_batches:
        changes["accumulate_grad_batches"] = w.grad_accum
    if _PRECISION_OF[w.precision] != str(trainer.precision):
        changes["precision"] = _PRECISION_OF[w.precision]
    if w.optimizer != now.optimizer:
        other.append(f"the optimizer {w.optimizer} (memfit's name) in configure_optimizers")
    if w.checkpointing == "blocks" and now.checkpointing != "blocks":
        other.append(
            f"checkpoint the repeated blocks (model.{checkpointing_enable_method()}() for a "
            "transformers model, or torch.utils.checkpoint in the module)"
        )
    if w.gpus > 1:
        changes["devices"] = w.gpus
        if w.ddp and not type(getattr(trainer, "strategy", None)).__name__.startswith("DDP"):
            changes["strategy"] = "ddp"
        if w.fsdp:  # Lightning's strategy="fsdp" is FSDP1 (flat parameters): not memfit's
            other.append(
                f"shard with FSDP2 over {w.gpus} GPUs: strategy=ModelParallelStrategy() and "
                "torch.distributed.fsdp.fully_shard on each repeated block, then the module, "
                "in configure_model (Lightning's strategy='fsdp' is FSDP1, not modelled)"
            )
    return changes, notes, other
