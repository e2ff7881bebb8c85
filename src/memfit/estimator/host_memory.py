"""Host memory: the RAM a step needs for what techniques keep on the CPU, checked against a budget.

Offloading moves the out-of-memory from the GPU to the CPU: optimizer state on the CPU, an
embedding on the CPU, activations saved to pinned memory, FSDP2's CPU offload. Each storage
the trace keeps on the host (`StorageRecord.host`) is counted here, in one of two kinds:

- **pinned** (page-locked) memory, which PyTorch allocates through its caching host allocator
  (aten/src/ATen/core/CachingHostAllocator.h: each request is rounded up to a power of two,
  `c10::llvm::PowerOf2Ceil`, and a freed block is cached for a later request of the same
  rounded size, never returned to the OS during the run). Pinned: storages on the host made in
  the forward or backward (saved activations copied down, gradients copied down), parameters on
  the host (FSDP2's `CPUOffloadPolicy(pin_memory=True)`), and the parameter and gradient copies
  `CpuOffloadOptimizer` keeps (pinned when CUDA is there, `.to("cpu", non_blocking=True)`),
  and the KV layers an offloaded cache keeps on the host (transformers copies them down the
  same way).
- **pageable** memory: optimizer state and update temporaries made on the CPU (`zeros_like` of
  a CPU parameter is not pinned), an embedding table kept on the CPU.

A paged optimizer's state (`StorageRecord.paged`, CUDA unified memory) is neither: it stays on
the device while the device has room and is evicted to host RAM under pressure; the planner's
cost model prices the eviction, and it is not counted here.

The budget is `Workload.host_memory`, else this machine's RAM (`os.sysconf`). Not counted: the
process's own footprint (the Python interpreter, torch's libraries, the data loader, a model
loaded on the CPU before it is moved), which the report names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from memfit.events import ALLOC, FREE, Event, StorageRecord
from memfit.units import parse_bytes
from memfit.workload import Workload

#: Host bytes below which nothing is reported (the CPU step counters of torch.optim's Adam
#: are a few bytes each and always live on the host).
REPORT_THRESHOLD_BYTES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class HostMemory:
    """Host RAM the step's CPU-resident storages need at their peak.

    Attributes:
        peak_bytes: pageable bytes live plus pinned bytes reserved, at the peak.
        pinned_bytes: pinned bytes reserved by the caching host allocator (power-of-two
            blocks, cached), at the end of the step (it never shrinks).
        pageable_bytes: pageable bytes live at the peak.
        by_category: bytes at the peak by category (pinned rounded to its blocks).
        budget_bytes: the RAM it must fit in, or None when it could not be read.
        budget_source: "host_memory" (given) or "this machine".
    """

    peak_bytes: int
    pinned_bytes: int
    pageable_bytes: int
    by_category: dict[str, int] = field(default_factory=dict)
    budget_bytes: int | None = None
    budget_source: str = "this machine"

    @property
    def fits(self) -> bool | None:
        """Whether the peak fits the budget; None without a budget."""
        if self.budget_bytes is None:
            return None
        return self.peak_bytes <= self.budget_bytes

    @property
    def worth_reporting(self) -> bool:
        return self.peak_bytes >= REPORT_THRESHOLD_BYTES


def machine_ram_bytes() -> int | None:
    """Physical RAM of this machine, or None where the OS does not say (no sysconf)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def power_of_two_ceil(n: int) -> int:
    """The caching host allocator's block for a request of `n` bytes (PowerOf2Ceil)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def is_pinned(r: StorageRecord, embedding_path: str | None) -> bool:
    """Whether a host storage is pinned (see the module docstring for the rule)."""
    if embedding_path is not None and (
        r.module == embedding_path or r.module.startswith(embedding_path + ".")
    ):
        return False
    if r.category in ("parameters", "kv_cache"):  # an offloaded KV layer: .to("cpu", non_blocking)
        return True
    return r.phase in ("inputs", "forward", "backward")


def host_memory(
    records: dict[int, StorageRecord],
    events: list[Event],
    w: Workload,
    *,
    embedding_path: str | None = None,
) -> HostMemory:
    """The host memory of a stream whose host storages are marked (after `place_on_host`)."""
    pinned_free: dict[int, int] = {}  # rounded size -> cached free blocks
    pinned_reserved = 0
    pinned_live: dict[int, int] = {}  # sid -> rounded size
    pageable_live = 0
    live_by_cat: dict[str, int] = {}
    peak, peak_pageable, peak_cats = 0, 0, {}
    cpu_update = _cpu_update_temporaries(records, w)
    for ev in events:
        r = records.get(ev.sid)
        if r is None or not r.host or ev.kind not in (ALLOC, FREE) or ev.sid in cpu_update:
            continue
        if r.paged:  # unified memory: on the device while it fits (see the cost model)
            continue
        pinned = is_pinned(r, embedding_path)
        size = power_of_two_ceil(r.nbytes) if pinned else r.nbytes
        sign = 1 if ev.kind == ALLOC else -1
        if pinned and ev.kind == ALLOC:
            if pinned_free.get(size):
                pinned_free[size] -= 1
            else:
                pinned_reserved += size
            pinned_live[ev.sid] = size
        elif pinned:
            size = pinned_live.pop(ev.sid, size)
            pinned_free[size] = pinned_free.get(size, 0) + 1
        else:
            pageable_live += sign * size
        live_by_cat[r.category] = live_by_cat.get(r.category, 0) + sign * size
        if pageable_live + pinned_reserved > peak:
            peak, peak_pageable = pageable_live + pinned_reserved, pageable_live
            peak_cats = dict(live_by_cat)
    copies = _offload_copies(records, w)
    if cpu_update:  # one parameter's temporaries at a time, at the end of the step
        largest = max(records[sid].nbytes for sid in cpu_update)
        peak_cats["temporaries"] = peak_cats.get("temporaries", 0) + largest
        peak += largest
        peak_pageable += largest
    if copies:
        peak_cats["cpu_copies"] = copies
    budget, source = _budget(w)
    return HostMemory(
        peak_bytes=peak + copies,
        pinned_bytes=pinned_reserved + copies,
        pageable_bytes=peak_pageable,
        by_category={k: v for k, v in peak_cats.items() if v > 0},
        budget_bytes=budget,
        budget_source=source,
    )


def _cpu_update_temporaries(records: dict[int, StorageRecord], w: Workload) -> set[int]:
    """The optimizer update's temporaries when it runs on the CPU (offload_optimizer, FSDP2's
    CPU offload).

    The trace lays the update out as CUDA runs it (foreach: temporaries for all parameters at
    once); on the CPU torch.optim picks the per-parameter loop (`_default_to_fused_or_foreach`
    gives foreach only when every tensor is on CUDA), so one parameter's temporaries are alive
    at a time. The caller counts the largest of them instead of their sum.
    """
    if not w.optimizer_on_cpu:
        return set()
    return {
        sid
        for sid, r in records.items()
        if r.host and r.phase == "optimizer" and r.category == "temporaries"
    }


def _offload_copies(records: dict[int, StorageRecord], w: Workload) -> int:
    """Pinned blocks `CpuOffloadOptimizer` holds outside the traced stream: a CPU copy of each
    trainable parameter and of its gradient (memfit.techniques.offload.cpu_optimizer), each its own
    block."""
    if not w.offload_optimizer:
        return 0
    last = max((r.step for r in records.values()), default=0)
    grads = [r.nbytes for r in records.values() if r.category == "gradients" and r.step == last]
    return 2 * sum(power_of_two_ceil(n) for n in grads)


def _budget(w: Workload) -> tuple[int | None, str]:
    if w.host_memory is not None:
        return parse_bytes(w.host_memory), "host_memory"
    return machine_ram_bytes(), "this machine"
