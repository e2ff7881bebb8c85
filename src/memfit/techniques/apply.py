"""`memfit.apply_`: turn a plan (or technique configs) into a memory-lean training setup.

Each technique config (in its module of memfit.techniques) has one handler, chosen by the
config's type. They run in a fixed order whatever the order given, because some depend on
others: freezing, tying and LoRA change which parameters exist and train; the precision cast and
device placement come next; checkpointing and FSDP wrap the final modules; the optimizer is
built last, over the parameters that remain trainable.

The model is changed in place (LoRA through peft's `inject_adapter_in_model`, which adapts the
module tree in place). Applying the same configs twice changes nothing more: every handler is
idempotent.

Example:
    >>> import memfit
    >>> plan = memfit.plan("gpt2", gpu="t4", goal=memfit.Goal(global_batch=32, seq_len=1024))
    >>> setup = memfit.apply_(model, plan)
    >>> for batch in loader:
    ...     loss = setup.step(batch)          # a float; no graph kept
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch

from memfit.errors import BadInputError
from memfit.techniques.composition import TechniqueConfig, configs_from_workload
from memfit.techniques.distillation.config import DistillationConfig
from memfit.techniques.offload.embedding_on_cpu import EmbeddingOnCpuConfig, move_model
from memfit.techniques.optimizer import DEFAULT_LR, OptimizerConfig
from memfit.techniques.parallel.fsdp import FSDPConfig
from memfit.techniques.precision import PrecisionConfig
from memfit.techniques.registry import Build, apply_one
from memfit.techniques.table import ORDER
from memfit.techniques.train_setup import TrainSetup
from memfit.workload import Workload

#: The technique table's order (memfit.techniques.table: the reasons are beside its rows).
_ORDER = ORDER


def apply_(
    model: torch.nn.Module,
    plan_or_configs: Any,
    *,
    device: str | torch.device | None = None,
    lr: float | None = None,
    loss_fn: Any = None,
    teacher: torch.nn.Module | None = None,
) -> TrainSetup:
    """Apply a plan's techniques to `model` in place and return the training setup.

    Args:
        model: the user's model (an HF PreTrainedModel or any nn.Module).
        plan_or_configs: a `memfit.Plan` (its recommendation), an `Estimate` or `Workload`
            (their techniques), one technique config, or a list of them (memfit.techniques).
        device: where the model runs; None keeps it where it is. With an embedding on the
            CPU, everything else goes to `device`.
        lr: learning rate of the optimizer built from a plan or workload. None uses
            memfit's default (1e-3) and says so in `setup.notes`; with explicit configs it is
            an error (set `OptimizerConfig(lr=...)` instead).
        loss_fn: `loss_fn(output, micro_batch) -> loss` for models whose output is not a loss
            (HF models given labels return one).
        teacher: the teacher of a plan's distillation (DistillationConfig), changed in place:
            cast, quantized, moved to `device`, frozen, in eval mode.
    """
    explicit = isinstance(plan_or_configs, _ORDER) or (
        isinstance(plan_or_configs, Iterable) and not isinstance(plan_or_configs, (str, bytes))
    )
    if explicit and lr is not None:
        raise BadInputError(
            f"apply_(lr={lr!r}) sets the learning rate of an optimizer built from a plan or "
            "workload; with technique configs, set it on the config: OptimizerConfig(lr=...)."
        )
    configs = _configs(plan_or_configs, DEFAULT_LR if lr is None else lr)
    defaulted_lr = (
        not explicit and lr is None and any(isinstance(c, OptimizerConfig) for c in configs)
    )
    seen: dict[type, TechniqueConfig] = {}
    for c in configs:
        if type(c) in seen and seen[type(c)] != c:
            raise BadInputError(
                f"Two different {type(c).__name__}s given: {seen[type(c)]!r} and {c!r}. "
                "Give one config per technique."
            )
        seen[type(c)] = c
    if not isinstance(model, torch.nn.Module):
        raise BadInputError(f"apply_ needs an nn.Module, got {type(model).__name__}.")
    target = torch.device(device) if device is not None else _model_device(model)
    if teacher is not None and DistillationConfig not in seen:
        raise BadInputError(
            "apply_(teacher=...) given, and the plan has no distillation. Drop teacher=, or "
            "plan with a teacher (Workload(teacher=...), --teacher)."
        )
    build = Build(model=model, device=target, teacher=teacher)
    ordered = sorted(seen.values(), key=lambda c: _ORDER.index(type(c)))
    # The model is placed on its device once its parameters are final (after the precision
    # cast) and before anything wraps its modules.
    cut = _ORDER.index(PrecisionConfig) + 1
    for c in ordered:
        if _ORDER.index(type(c)) < cut:
            apply_one(c, build)
    fsdp = seen.get(FSDPConfig)
    if not (isinstance(fsdp, FSDPConfig) and fsdp.cpu_offload):  # fully_shard moves each unit
        _place(build, seen.get(EmbeddingOnCpuConfig))  # type: ignore[arg-type]
    for c in ordered:
        if _ORDER.index(type(c)) >= cut:
            apply_one(c, build)
    notes = list(build.left_to_caller)
    if defaulted_lr:
        notes.insert(0, f"learning rate: memfit's default {DEFAULT_LR:g} (pass apply_(..., lr=)).")
    return TrainSetup(
        model=build.step_model if build.step_model is not None else model,
        optimizer=build.optimizer,
        scaler=build.scaler,
        autocast_dtype=build.autocast_dtype,
        grad_accum=build.grad_accum,
        device=target,
        techniques=tuple(build.applied),
        loss_fn=loss_fn if loss_fn is not None else build.loss_fn,
        notes=tuple(notes),
    )


def _configs(obj: Any, lr: float) -> list[TechniqueConfig]:
    if isinstance(obj, _ORDER):
        return [cast(TechniqueConfig, obj)]
    if isinstance(obj, Workload):
        return configs_from_workload(obj, lr=lr)
    workload = getattr(obj, "workload", None)
    if isinstance(workload, Workload):  # an Estimate, or a plan Candidate
        return _configs(workload, lr)
    if hasattr(obj, "best") and hasattr(obj, "closest_miss"):  # a Plan
        if obj.best is None:
            raise BadInputError(
                f"The plan for {obj.model!r} found nothing that fits; there is nothing to "
                "apply. Apply its closest miss explicitly (plan.closest_miss.workload) or allow "
                "more techniques (--allow lora, --allow pure-precision)."
            )
        return configs_from_workload(obj.best.workload, lr=lr)
    if isinstance(obj, Iterable) and not isinstance(obj, (str, bytes)):
        out = list(obj)
        bad = [c for c in out if not isinstance(c, _ORDER)]
        if bad:
            raise BadInputError(
                f"apply_ got {bad[0]!r}, which is not a technique config. Use the configs in "
                "memfit.techniques (CheckpointConfig, PrecisionConfig, ...), a Plan or a "
                "Workload."
            )
        return out
    raise BadInputError(
        f"apply_ cannot apply a {type(obj).__name__}. Pass a memfit.Plan, an Estimate, a "
        "Workload, or technique configs from memfit.techniques."
    )


def _model_device(model: torch.nn.Module) -> torch.device:
    placed = getattr(model, _DEVICE_MARK, None)
    if placed is not None:  # an earlier apply_ placed it (maybe with an embedding on the CPU)
        return placed
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")


def _place(build: Build, emb: EmbeddingOnCpuConfig | None) -> None:
    move_model(build.model, build.device, embedding=emb)
    setattr(build.model, _DEVICE_MARK, build.device)


#: Where apply_ put the model, remembered for a later apply_ without `device=`.
_DEVICE_MARK = "_memfit_device"
