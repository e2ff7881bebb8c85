"""The optimizers memfit models: one `OptimizerSpec` row each (memfit.optimizers.table), read by
the workload's checks, the trace, `apply_`, the planner, the OOM advice, the vocabulary
pricing and the trainer integrations alike.

Example:
    >>> from memfit.optimizers import spec_of
    >>> spec_of("adamw-8bit").state_bytes((4096, 4096), torch.bfloat16)
    34078720
"""

from __future__ import annotations

from typing import Any

import torch

from memfit.errors import BadInputError, closest
from memfit.optimizers.layouts import DEFAULT_LR, Lion, ScheduleFreeAdamW, StateLayout
from memfit.optimizers.table import (
    BNB_BLOCK_SIZE,
    BNB_MIN_8BIT_SIZE,
    SPECS,
    OptimizerSpec,
    StateTensor,
)

__all__ = [
    "BNB_BLOCK_SIZE",
    "BNB_MIN_8BIT_SIZE",
    "DEFAULT_LR",
    "DEFAULT_OPTIMIZER",
    "NO_OPTIMIZER",
    "OPTIMIZERS",
    "SPECS",
    "Lion",
    "OptimizerSpec",
    "ScheduleFreeAdamW",
    "StateLayout",
    "StateTensor",
    "build",
    "hf_optim_of",
    "host_state_keys",
    "is_paged",
    "is_paged_state",
    "name_of_instance",
    "paged_variant",
    "plan_choices",
    "spec_of",
    "spec_of_hf_optim",
]

#: The optimizer users start from: training without one named trains with it.
DEFAULT_OPTIMIZER = "adamw"
#: `Workload.optimizer` for a step without an optimizer (inference, or forward + backward).
NO_OPTIMIZER = "none"
#: Every name `Workload.optimizer` takes: the table's, then "none".
OPTIMIZERS: tuple[str, ...] = (*SPECS, NO_OPTIMIZER)


def spec_of(name: str) -> OptimizerSpec:
    """The row of optimizer `name`; a name memfit does not model raises BadInputError."""
    try:
        return SPECS[name]
    except KeyError:
        near = closest(name, list(SPECS))
        raise BadInputError(
            f"Unknown optimizer {name!r}{f' ({near})' if near else ''}. memfit models: "
            f"{', '.join(SPECS)}."
        ) from None


def build(name: str, params: list[Any], *, lr: float, weight_decay: float, for_trace: bool):
    """Optimizer `name` over `params`: laid out as CUDA runs it (`for_trace`), else the real
    one `apply_` gives the user."""
    spec = spec_of(name)
    make = spec.trace if for_trace else spec.real
    optimizer = make(params, lr, weight_decay)
    if not for_trace and spec.train_mode:
        optimizer.train()  # type: ignore[attr-defined]  # schedulefree steps only in train mode
    return optimizer


def is_paged(name: str) -> bool:
    """Whether optimizer `name` keeps its large states paged ("none" is not)."""
    return name != NO_OPTIMIZER and spec_of(name).paged


def host_state_keys(optimizer: torch.optim.Optimizer) -> frozenset[str]:
    """State entries that CUDA keeps in host memory for this optimizer.

    torch.optim keeps `step` as a CPU scalar tensor unless fused or capturable
    (Adam._init_group, Adafactor._init_group, RMSprop._init_group, Adagrad.__init__); torchao's
    low-bit AdamW makes it with `torch.tensor(0.0)`, on the CPU too.
    """
    defaults = optimizer.defaults
    if defaults.get("fused") or defaults.get("capturable"):
        return frozenset()
    return frozenset({"step"})


def is_paged_state(optimizer: torch.optim.Optimizer, t: torch.Tensor) -> bool:
    """Whether `optimizer` (a trace layout, or optimizers behind one such as
    OptimizerInBackward) keeps state tensor `t` in paged memory."""
    is_paged = getattr(optimizer, "is_paged", None)
    return callable(is_paged) and bool(is_paged(t))


def name_of_instance(optimizer: Any) -> str:
    """memfit's name for a real optimizer instance (an accelerate or Lightning wrapper is looked
    through); one memfit has no row for raises BadInputError naming it."""
    if optimizer is None:
        return NO_OPTIMIZER
    inner = optimizer
    while isinstance(getattr(inner, "optimizer", None), torch.optim.Optimizer):
        inner = inner.optimizer
    for spec in SPECS.values():
        if spec.matches(inner):
            return spec.name
    cls = type(inner)
    raise BadInputError(
        f"memfit has no memory layout for the optimizer {cls.__module__}.{cls.__name__} with "
        f"these settings. It models: {'; '.join(s.title for s in SPECS.values())} "
        "(docs/integrations.md lists every `optim` name)."
    )


def paged_variant(name: str) -> str | None:
    """The paged row with `name`'s update rule (bitsandbytes' paged optimizers), if any."""
    rule = spec_of(name).rule
    return next((s.name for s in SPECS.values() if s.paged and s.rule == rule), None)


def plan_choices(allowed: set[str]) -> list[str]:
    """The unpaged rows the planner may try with these `--allow` techniques, in table order."""
    return [s.name for s in SPECS.values() if s.allow in allowed and not s.paged]


def lighter_specs() -> list[OptimizerSpec]:
    """The unpaged rows the planner may switch to when the user's optimizer does not fit (those
    with an `allow` technique), in table order: what the OOM advice prices and names."""
    return [s for s in SPECS.values() if s.allow is not None and not s.paged]


def spec_of_hf_optim(optim: str) -> OptimizerSpec | None:
    """The row `TrainingArguments(optim=...)` builds (without optim_args), or None."""
    for spec in SPECS.values():
        if optim in spec.hf_optim and spec.hf_optim_args is None:
            return spec
    return None


def hf_optim_of(name: str) -> tuple[str, str | None]:
    """The `TrainingArguments.optim` name (and `optim_args`) that builds optimizer `name`."""
    spec = spec_of(name)
    if not spec.hf_optim:
        raise BadInputError(f"No TrainingArguments.optim builds optimizer {name!r}.")
    return spec.hf_optim[0], spec.hf_optim_args
