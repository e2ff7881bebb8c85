"""Precision recipes as values: what "bf16-mixed" or "fp16-true" means, asked by attribute
instead of by testing the name's text.

"fp32" trains in float32. "-mixed" keeps fp32 weights and runs matmuls under autocast to the
16-bit dtype (CUDA's policy); with fp16 a GradScaler scales the loss. "-true" casts the whole
model (weights, gradients, optimizer state) to the 16-bit dtype.

Example:
    >>> precision_of("fp16-mixed").scaler
    True
    >>> precision_of("bf16-true").dtype_name
    'bfloat16'
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memfit.errors import BadInputError, closest


def _closest(name: str) -> str:
    hint = closest(name, list(_BY_NAME))
    return f" ({hint})" if hint else ""


__all__ = ["PRECISIONS", "PURE_BF16", "Precision", "precision_of", "pure_precision_of_dtype"]


@dataclass(frozen=True)
class Precision:
    """One recipe. `kind` is "fp32", "mixed" or "true"; `dtype_name` is the dtype matmuls run
    in ("float32", "float16" or "bfloat16")."""

    name: str
    kind: str
    dtype_name: str

    @property
    def mixed(self) -> bool:
        """fp32 weights, matmuls under autocast."""
        return self.kind == "mixed"

    @property
    def pure(self) -> bool:
        """The whole model in the 16-bit dtype."""
        return self.kind == "true"

    @property
    def bf16(self) -> bool:
        return self.dtype_name == "bfloat16"

    @property
    def fp16(self) -> bool:
        return self.dtype_name == "float16"

    @property
    def scaler(self) -> bool:
        """Whether the step needs a GradScaler (fp16 under autocast): it unscales and checks all
        gradients together before the step."""
        return self.mixed and self.fp16

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype_name)

    @property
    def width(self) -> int:
        """Rank for the planner's order: 0 pure 16-bit, 1 mixed, 2 fp32 (more memory)."""
        return {"true": 0, "mixed": 1, "fp32": 2}[self.kind]


_ALL = (
    Precision("fp32", "fp32", "float32"),
    Precision("fp16-mixed", "mixed", "float16"),
    Precision("bf16-mixed", "mixed", "bfloat16"),
    Precision("fp16-true", "true", "float16"),
    Precision("bf16-true", "true", "bfloat16"),
)
_BY_NAME = {p.name: p for p in _ALL}

#: The names `Workload.precision` takes (besides "auto").
PRECISIONS: tuple[str, ...] = tuple(_BY_NAME)
#: Pure bfloat16: the planner's lightest precision, and serving's default.
PURE_BF16 = "bf16-true"


def precision_of(name: str) -> Precision:
    """The recipe called `name`; an unknown name raises BadInputError naming the closest."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise BadInputError(
            f"Unknown precision {name!r}{_closest(name)}. Choose one of {', '.join(PRECISIONS)}."
        ) from None


def pure_precision_of_dtype(dtype_name: str) -> Precision:
    """The recipe that keeps a model in `dtype_name` ("float32" is fp32)."""
    for p in _ALL:
        if p.dtype_name == dtype_name and p.kind in ("true", "fp32"):
            return p
    raise BadInputError(f"No precision keeps a model in {dtype_name!r}.")
