"""A model traced *as loaded*: every parameter and buffer keeps the dtype it has, instead of the
one dtype a Workload's precision casts the whole model to.

memfit's precision recipes cast every floating tensor to one dtype: fp32 master weights for
"fp32" and "-mixed", the 16-bit dtype for "-true" (memfit.estimator.trace.step_runner.
materialize_fake). A real run may hold several at once, and then no recipe describes it. The
most common case is LoRA through peft on a 16-bit base: peft keeps the adapters in float32
(`get_peft_model(..., autocast_adapter_dtype=True)`, its default), so the frozen base is bf16
(2 bytes a parameter) and the trainable adapters, their gradients and AdamW's two moments are
fp32; a model with some layers upcast to fp32 is another. Cast to fp32 by "bf16-mixed", such a
base would be estimated at twice its bytes.

A model marked with `mark_as_loaded` is traced with its own dtypes, and the Workload's precision
then says only how the step runs: "-mixed" under autocast to its 16-bit dtype (the dtype of
the matmuls), "-true" and "fp32" without autocast. The trainer callbacks
(memfit.integrations) mark the copy of the model they read, since the run's dtypes are what
the trainer loaded; nothing else does, so a catalog name or a config, which have no dtypes of
their own, are cast by the precision as always.

Example:
    >>> model = peft.get_peft_model(llama_in_bf16, peft.LoraConfig(r=16))  # adapters fp32
    >>> memfit.estimate(mark_as_loaded(model), Workload(precision="bf16-mixed"))
"""

from __future__ import annotations

import torch

__all__ = ["AS_LOADED", "dtype_counts", "is_as_loaded", "mark_as_loaded"]

#: The flag in a root module's `__dict__` that asks the estimator for the model as loaded.
AS_LOADED = "_memfit_as_loaded"


def mark_as_loaded(model: torch.nn.Module) -> torch.nn.Module:
    """Mark `model` (in place; returned) to be traced with its own dtypes (see the module
    docstring). Only the flag is set: no tensor of the model is touched."""
    model.__dict__[AS_LOADED] = True
    return model


def is_as_loaded(model: torch.nn.Module) -> bool:
    """Whether `model` is marked to be traced with its own dtypes."""
    return model.__dict__.get(AS_LOADED) is True


def dtype_counts(model: torch.nn.Module, *, trainable: bool | None = None) -> dict[str, int]:
    """Parameter elements by dtype name ("bfloat16": 29056, ...), each shared tensor once;
    with `trainable` True (False), only the parameters that require (do not require) grad."""
    out: dict[str, int] = {}
    for p in dict.fromkeys(model.parameters()):
        if trainable is None or p.requires_grad == trainable:
            name = str(p.dtype).removeprefix("torch.")
            out[name] = out.get(name, 0) + p.numel()
    return out
