"""Host RAM of what a step keeps on the CPU (memfit.estimator.host_memory).

Hand numbers follow PyTorch's caching host allocator (aten/src/ATen/core/CachingHostAllocator.h):
a pinned request is rounded up to a power of two and a freed block is cached for the next
request of the same rounded size; pageable CPU tensors are counted as their bytes.
"""

from __future__ import annotations

import torch
from torch import nn

import memfit
from memfit.estimator.host_memory import host_memory, power_of_two_ceil
from memfit.events import ALLOC, FREE, Category, Event, StorageRecord
from tests.conftest import module_spec

MiB = 1 << 20


def _record(sid: int, nbytes: int, category: str, phase: str, module: str = "m") -> StorageRecord:
    return StorageRecord(sid, nbytes, Category(category), phase, 0, "op", module, -1, 0, host=True)


def test_power_of_two_blocks() -> None:
    assert [power_of_two_ceil(n) for n in (1, 2, 3, 4096, 4097, 3 * MiB)] == [
        1, 2, 4, 4096, 8192, 4 * MiB,
    ]  # fmt: skip


def test_pinned_blocks_are_rounded_and_cached_pageable_bytes_are_exact() -> None:
    records = {
        0: _record(0, 3 * MiB, "activations", "forward"),  # pinned: a 4 MiB block
        1: _record(1, 3 * MiB + 1, "activations", "forward"),  # pinned: reuses the cached block
        2: _record(2, 1000, "optimizer_state", "optimizer"),  # pageable: 1000 B
        3: _record(3, 5 * MiB, "activations", "backward"),  # pinned: an 8 MiB block
    }
    events = [
        Event(ALLOC, 0, "forward", 0, "op", "m", -1),
        Event(FREE, 0, "forward", 0, "op", "m", -1),
        Event(ALLOC, 1, "forward", 0, "op", "m", -1),
        Event(ALLOC, 2, "optimizer", 0, "op", "m", -1),
        Event(ALLOC, 3, "backward", 0, "op", "m", -1),
    ]
    host = host_memory(records, events, memfit.Workload(host_memory="1GiB"))
    assert host.pinned_bytes == 4 * MiB + 8 * MiB  # the second 3 MiB request took the cache
    assert host.pageable_bytes == 1000
    assert host.peak_bytes == 12 * MiB + 1000
    assert host.budget_bytes == 1 << 30 and host.fits is True


class TwoLinear(nn.Module):
    """Weights of 1000 x 1000 and 1000 x 10 floats (4,000,000 B and 40,000 B)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(1000, 1000, bias=False)
        self.b = nn.Linear(1000, 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)).sum()


def _spec():
    return module_spec(TwoLinear(), lambda b: torch.zeros(b, 1000))


def test_offloaded_optimizer_state_and_pinned_copies() -> None:
    """AdamW on the CPU: two fp32 moments per parameter (pageable, exact bytes), one parameter's
    update temporaries at a time, and the optimizer's pinned CPU copies of every parameter and
    gradient (power-of-two blocks)."""
    w = memfit.Workload(batch_size=2, offload_optimizer=True, host_memory="1GiB")
    est = memfit.estimate(_spec(), w, gpu="a100-80gb")
    host = est.host
    assert host is not None
    params = (4_000_000, 40_000)
    assert host.by_category["cpu_copies"] == 2 * sum(power_of_two_ceil(n) for n in params)
    # Two fp32 moments per parameter, and AdamW's float32 step counter per parameter.
    assert host.by_category["optimizer_state"] == 2 * sum(params) + 2 * 4
    assert host.by_category["temporaries"] <= 4_000_000  # the largest parameter's, not all
    assert est.fits is True


def test_a_host_budget_too_small_does_not_fit_and_says_so() -> None:
    w = memfit.Workload(batch_size=2, offload_optimizer=True, host_memory="8MiB")
    est = memfit.estimate(_spec(), w, gpu="a100-80gb")
    assert est.host is not None and est.host.fits is False
    assert est.fits is False
    assert any("Host memory" in n and "host_memory (8.00 MiB)" in n for n in est.notes)


def test_nothing_on_the_host_reports_nothing() -> None:
    est = memfit.estimate(_spec(), memfit.Workload(batch_size=2), gpu="a100-80gb")
    assert est.host is not None and not est.host.worth_reporting


def test_paged_state_is_not_host_memory() -> None:
    """Unified memory stays on the device while it fits: the planner prices its eviction."""
    paged = StorageRecord(
        0, 64 * MiB, Category.OPTIMIZER_STATE, "optimizer", 0, "op", "m", -1, 0, host=True,
        paged=True,
    )  # fmt: skip
    host = host_memory({0: paged}, [Event(ALLOC, 0, "optimizer", 0, "op", "m", -1)],
                       memfit.Workload())  # fmt: skip
    assert host.peak_bytes == 0


def test_the_no_gpu_note_only_without_a_gpu() -> None:
    with_gpu = memfit.estimate(_spec(), memfit.Workload(batch_size=2), gpu="a100-80gb")
    assert not any(n.startswith("No GPU named") for n in with_gpu.notes)
    without = memfit.estimate(_spec(), memfit.Workload(batch_size=2))
    assert any(n.startswith("No GPU named") for n in without.notes)
