"""The allocator capacity of a GPU simulated by `memfit.simulate` (see its module docstring)."""

from __future__ import annotations

from memfit.cuda.overhead import cublas_workspace_bytes, device_overhead
from memfit.cuda.target import DEFAULT_GPU, get_gpu
from memfit.errors import BadInputError
from memfit.units import format_bytes


def simulated_capacity(gpu: str | None, budget: int | None) -> tuple[int | None, int, int]:
    """(allocator capacity or None, total for the OOM message, bytes of one cuBLAS workspace)."""

    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0
    ):
        raise BadInputError(
            f"budget_bytes must be a positive whole number of bytes, got {budget!r}."
        )
    g = get_gpu(gpu) if gpu is not None else None
    overhead = device_overhead(g or get_gpu(DEFAULT_GPU))
    ws = cublas_workspace_bytes(g or get_gpu(DEFAULT_GPU))
    if g is None:
        return budget, budget or 0, ws
    total = g.total_memory_bytes
    outside = overhead.outside_allocator_bytes()
    if budget is None:
        return total - outside, total, ws
    if budget > total:
        raise BadInputError(
            f"budget_bytes={budget} ({format_bytes(budget)}) is more than {g.name} has "
            f"({total} bytes, {format_bytes(total)}). Give a smaller budget or a bigger GPU."
        )
    if budget <= outside:
        raise BadInputError(
            f"budget_bytes={budget} ({format_bytes(budget)}) is smaller than the CUDA context of "
            f"{g.name}: {outside} bytes ({format_bytes(outside)}) outside PyTorch's allocator "
            "(context and kernels, memfit.cuda.overhead). Give a budget larger than that, or "
            "leave out the GPU name to make budget_bytes the allocator's capacity."
        )
    return budget - outside, budget, ws
