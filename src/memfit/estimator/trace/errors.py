"""The TraceError of a trace that failed: the op, the module, the phase, and why.

A fake tensor cannot do everything a real one does (read a value, make a shape from values,
run a custom CUDA extension); other errors come from the model's own code on the config it was
given, and a real run of that config would raise them too. The message says which it is.
"""

from __future__ import annotations

from typing import Any

from memfit.errors import TraceError

__all__ = ["trace_error"]


def _fake_tensor_errors() -> tuple[type[BaseException], ...]:
    """The exceptions FakeTensorMode raises where a real tensor would have run."""
    from torch._subclasses import fake_tensor as ft
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    names = (
        "UnsupportedFakeTensorException",
        "DynamicOutputShapeException",
        "DataDependentOutputException",
        "UnsupportedOperatorException",
        "FakeTensorDeviceMismatchError",  # from torch 2.9
    )
    found = tuple(getattr(ft, n) for n in names if hasattr(ft, n))
    return (*found, GuardOnDataDependentSymNode)


def trace_error(e: Exception, tracker: Any) -> TraceError:
    """The TraceError for `e`, raised while `tracker` (memfit.estimator.trace.tracker.Tracker)
    ran."""
    module, _ = tracker.context()
    op = tracker._op
    hint = (
        "The model's code could not run on fake tensors (a data-dependent shape such as "
        "nonzero() or .item(), or a custom CUDA extension). Try attention='eager', pass an "
        "input factory that avoids the data-dependent path, or estimate a model of the same "
        "shape from the catalog."
    )
    if not isinstance(e, _fake_tensor_errors()):
        hint = (
            "This is not an error of fake tensors (a data-dependent shape or an op they lack): "
            "the model's own code raised it, most often because the config leaves a field "
            "its layers read unset or of another type, and a real run of this config would "
            "likely raise it too. Check that field of the config."
        )
    detail = str(e)
    if len(detail) > 600:  # DTensor sharding errors print every placement
        detail = detail[:600] + " ..."
    return TraceError(
        f"Tracing failed at op {op!r} in module {module or '<top>'!r} during "
        f"{tracker.phase}: {type(e).__name__}: {detail}\n{hint}"
    )
