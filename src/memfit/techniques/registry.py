"""The handler registry of `memfit.apply_`: one handler per technique config type, registered
beside its config (`@handler` in each technique's module), and what the handlers build.

The torchao pattern (`quantize_(model, config)` dispatching on the config's type): a technique
is one module holding its config, its apply handler and its trace-time preparation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from memfit.errors import BadInputError


@dataclass
class Build:
    """What the handlers decide, turned into a TrainSetup at the end."""

    model: torch.nn.Module
    device: torch.device
    precision: str = "fp32"
    autocast_dtype: torch.dtype | None = None
    scaler: Any = None
    grad_accum: int = 1
    optimizer: torch.optim.Optimizer | None = None
    #: The OptimizerConfig the optimizer was built from (OptimizerInBackwardConfig reads it).
    optimizer_config: Any = None
    #: The teacher module of a distillation (`apply_(..., teacher=)`), and the step's loss
    #: function a technique sets (DistillationConfig: the KD loss, running the teacher).
    teacher: torch.nn.Module | None = None
    loss_fn: Any = None
    #: The module the step calls when a technique wraps the model (DDPConfig), else None.
    step_model: torch.nn.Module | None = None
    applied: list[str] = field(default_factory=list)
    #: What the model does not carry and the training loop must do (TrainSetup does it).
    left_to_caller: list[str] = field(default_factory=list)


_HANDLERS: dict[type, Callable[[Any, Build], None]] = {}

C = TypeVar("C")


def handler(fn: Callable[[C, Build], None]) -> Callable[[C, Build], None]:
    """Register `fn` as the handler of the config type its first parameter is annotated with."""
    import typing

    config_type = next(iter(typing.get_type_hints(fn).values()))
    if config_type in _HANDLERS:
        raise AssertionError(f"Two handlers for {config_type.__name__}.")
    _HANDLERS[config_type] = fn
    return fn


def apply_one(config: Any, build: Build) -> None:
    """Run the handler registered for `config`'s type."""
    fn = _HANDLERS.get(type(config))
    if fn is None:
        raise BadInputError(f"No handler for {type(config).__name__}.")
    fn(config, build)


def wrap_forward_once(
    module: torch.nn.Module, marker: str, config: Any, wrap: Callable[[Any], Any]
) -> None:
    """Set `module.forward` to `wrap(current)` (`current`: the instance's own forward, or None),
    marked with `config` under the attribute `marker`. Once: the same config again changes
    nothing; another config of the same technique is an error, since the wrappers would stack.
    """
    current = module.__dict__.get("forward")
    marked = getattr(current, marker, None)
    if marked is not None:
        if marked != config:
            raise BadInputError(
                f"The model already applies {marked.label}; start from the unwrapped model to "
                f"apply {config.label}."
            )
        return
    wrapped = wrap(current)
    setattr(wrapped, marker, config)
    module.forward = wrapped
