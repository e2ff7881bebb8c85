"""Mixed precision ("-mixed": fp32 weights, autocast, a GradScaler with fp16) or pure precision
("-true": the model cast to the 16-bit dtype).

Autocast is put on the model's own forward (`autocast_forward`), as accelerate does, so that any
trainer that calls the model gets it, not only `TrainSetup.step`. Loss scaling with fp16 stays
with the loop (`TrainSetup.backward`, or the trainer's own fp16 option): `apply_` says so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from memfit.precision import precision_of
from memfit.techniques.registry import Build, handler
from memfit.workload import PRECISIONS, check_choice


@dataclass(frozen=True, kw_only=True)
class PrecisionConfig:
    """Mixed ("-mixed": fp32 weights, autocast; GradScaler with fp16) or pure ("-true": the
    model cast to the 16-bit dtype) precision. One of workload.PRECISIONS."""

    precision: str = "bf16-mixed"

    def __post_init__(self) -> None:
        check_choice("precision", self.precision, PRECISIONS)

    @property
    def label(self) -> str:
        """How reports name the technique: nothing, as reports show the precision on its own."""
        return ""


@handler
def _precision(config: PrecisionConfig, build: Build) -> None:
    p = config.precision
    build.precision = p
    if p == "fp32":
        return
    recipe = precision_of(p)
    dtype = recipe.dtype
    if recipe.pure:
        build.model.to(dtype)  # floating parameters and buffers only
    else:
        build.autocast_dtype = dtype
        autocast_forward(build.model, build.device.type, dtype)
        if dtype == torch.float16:
            build.scaler = torch.amp.GradScaler(build.device.type)
            build.left_to_caller.append(
                "fp16 loss scaling: setup.step and setup.backward use setup.scaler; another "
                "trainer must scale the loss itself (HF Trainer: fp16=True)."
            )
    build.applied.append(p)


def autocast_forward(model: torch.nn.Module, device_type: str, dtype: torch.dtype) -> None:
    """Run `model`'s forward under `torch.autocast(device_type, dtype)` whoever calls it (in
    place; a second call with the same dtype does nothing, another dtype replaces it).

    A partial over the module (not a closure over its bound forward), so that deep copies and
    pickles of the model keep working, as checkpointing's wrapper does.
    """
    current = model.__dict__.get("forward")
    inner = getattr(current, "_memfit_autocast_inner", current)
    if getattr(current, "_memfit_autocast", None) == (device_type, dtype):
        return
    wrapped = functools.partial(_autocast_forward, model, inner, device_type, dtype)
    wrapped._memfit_autocast = (device_type, dtype)  # type: ignore[attr-defined]
    wrapped._memfit_autocast_inner = inner  # type: ignore[attr-defined]
    model.forward = wrapped


def remove_autocast_forward(model: torch.nn.Module) -> None:
    """Undo `autocast_forward` (FSDP2's MixedPrecisionPolicy casts instead)."""
    current = model.__dict__.get("forward")
    if getattr(current, "_memfit_autocast", None) is None:
        return
    inner = current._memfit_autocast_inner  # type: ignore[union-attr]
    if inner is None:
        del model.forward
    else:
        model.forward = inner


def _autocast_forward(
    model: torch.nn.Module,
    inner: Callable[..., Any] | None,
    device_type: str,
    dtype: torch.dtype,
    *args: Any,
    **kwargs: Any,
) -> Any:
    fwd = inner if inner is not None else functools.partial(type(model).forward, model)
    with torch.autocast(device_type, dtype=dtype):
        return fwd(*args, **kwargs)
