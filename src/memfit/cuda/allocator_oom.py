"""The simulated allocator running out of memory: the state at the failing allocation and the
message PyTorch's CUDACachingAllocator would print (`OutOfMemory`), and the exception the
simulator raises with it (named apart from `torch.OutOfMemoryError`, which `memfit.simulate`
raises to user code).
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.cuda.allocator_config import format_size

_DOCS_URL = (
    "https://docs.pytorch.org/docs/stable/notes/cuda.html"
    "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"
)


@dataclass(frozen=True, kw_only=True)
class OutOfMemory:
    """The first allocation that could not be served.

    ``requested_bytes`` is the size asked for; ``alloc_bytes`` the amount PyTorch's
    message says it "tried to allocate" (``get_allocation_size`` of the rounded size:
    2 MiB for small requests, 20 MiB for 1-10 MiB, else rounded up to 2 MiB).
    ``allocated_bytes``/``reserved_bytes`` are the allocator's totals after it released
    its cache; ``free_bytes`` is capacity - reserved. ``allowed_bytes`` is set when a
    per-process memory fraction applies.
    """

    event_index: int
    requested_bytes: int
    alloc_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    capacity_bytes: int
    free_bytes: int
    allowed_bytes: int | None = None

    def message(
        self,
        *,
        op: str | None = None,
        module: str | None = None,
        total_capacity_bytes: int | None = None,
    ) -> str:
        """PyTorch's OOM text (CUDACachingAllocator.cpp: malloc, the TORCH_CHECK_WITH
        (OutOfMemoryError, ...) after the retries), plus where it happened.

        ``total_capacity_bytes`` is the GPU's total memory for the "total capacity" part
        (default: ``capacity_bytes``). The "Including non-PyTorch memory, this process
        has ..." part that PyTorch gets from NVML is left out.
        """
        total = self.capacity_bytes if total_capacity_bytes is None else total_capacity_bytes
        allowed = (
            f"{format_size(self.allowed_bytes)} allowed; " if self.allowed_bytes is not None else ""
        )
        text = (
            f"CUDA out of memory. Tried to allocate {format_size(self.alloc_bytes)}. "
            f"GPU 0 has a total capacity of {format_size(total)} of which "
            f"{format_size(self.free_bytes)} is free. {allowed}"
            f"Of the allocated memory {format_size(self.allocated_bytes)} is allocated by "
            f"PyTorch, and {format_size(self.reserved_bytes - self.allocated_bytes)} is "
            "reserved by PyTorch but unallocated. If reserved but unallocated memory is "
            "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
            f"fragmentation.  See documentation for Memory Management  ({_DOCS_URL})"
        )
        if op and module:
            text += f" (at op {op} in module {module})"
        elif op:
            text += f" (at op {op})"
        elif module:
            text += f" (in module {module})"
        return text


class AllocatorOutOfMemoryError(Exception):
    """Raised by :meth:`CachingAllocator.malloc` when the simulated device is full."""

    def __init__(self, oom: OutOfMemory) -> None:
        super().__init__(oom.message())
        self.oom = oom
