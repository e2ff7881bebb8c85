"""cuBLAS operand copies: a matrix whose strides cuBLAS cannot take is cloned for the call.

Mechanism (aten/src/ATen/native/cuda/Blas.cpp, torch 2.x): ``mm`` and ``addmm`` prepare each
matrix operand with ``prepare_matrix_for_cublas``. A non-overlapping and dense matrix is passed
as it is (row- or column-major, or a transpose); so is one with a unit stride in one dimension
and a leading dimension at least the other size. Any other layout is cloned contiguous
(``tensor.clone(at::MemoryFormat::Contiguous)``) for the gemm and freed when the op returns.
Both operands are prepared before the kernel runs, so two copies are alive together.

The common case is a gradient that reaches a Linear as an expanded tensor: `loss = x.sum()`
hands every element the same stride-0 gradient (SumBackward is `grad.expand(...)`), and the
Linear's backward multiplies it twice (input gradient, weight gradient), each time cloning a
full (tokens x features) copy. For a language model's `logits.sum()` that is a logits-sized
block at the start of backward (facebook/opt-350m, 1 x 512 tokens in fp16: 51 MB).

A trace on fake tensors sees only the op's output; these copies are added to its stream
(memfit.estimator.trace.op_transients) and to a simulated GPU's allocator.
"""

from __future__ import annotations

from typing import Any

import torch

from memfit.estimator.trace.op_transients import after_alloc_of, insert_events, new_records
from memfit.events import Category

#: The matrix arguments of each op, by position.
_MATRICES = {"mm.default": (0, 1), "addmm.default": (1, 2)}


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """c10's ``compute_non_overlapping_and_dense``: the strides of the dimensions longer than
    one, sorted, are those of some contiguous order of their sizes."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride(), strict=True)
                               if sz != 1):  # fmt: skip
        if stride != expected:
            return False
        expected *= size
    return True


def needs_copy(m: torch.Tensor) -> bool:
    """Whether ``prepare_matrix_for_cublas`` clones the 2-d matrix ``m``."""
    if m.dim() != 2 or _non_overlapping_and_dense(m):
        return False
    (s0, s1), (n0, n1) = m.stride(), m.shape
    if s0 == 1 and s1 >= max(1, n0):
        return False
    return not (s1 == 1 and s0 >= max(1, n1))


def operand_copies(name: str, args: Any) -> list[int]:
    """The bytes of each operand copy cuBLAS makes for aten op ``name`` on CUDA (in the order
    Blas.cpp prepares them: first matrix, then second); empty for any other op."""
    sizes = []
    for i in _MATRICES.get(name, ()):
        m = args[i] if i < len(args) else None
        if isinstance(m, torch.Tensor) and m.is_floating_point() and needs_copy(m):
            sizes.append(m.numel() * m.element_size())
    return sizes


def record_operand_copies(tracker: Any, name: str, args: Any, out: Any) -> None:
    """Add the copies of ``operand_copies`` to the tracker's stream, category temporaries:
    allocated after the op's output (a structured kernel allocates it first), together, and
    freed before the op returns."""
    sizes = operand_copies(name, args)
    if sizes:
        sids = new_records(tracker, name, sizes, Category.TEMPORARIES)
        insert_events(tracker, after_alloc_of(tracker, out), sids, together=True)
