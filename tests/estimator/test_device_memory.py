"""How `memfit.estimate` turns the traced stream into device memory
(memfit.estimator.device_memory).

Hand numbers follow CUDACachingAllocator.cpp: requests round up to 512 B; a request of
10 MiB or more gets a segment of its size rounded up to 2 MiB, and the block is split only
if more than 1 MiB would be left; a 1-10 MiB request gets a 20 MiB segment; one cuBLAS
workspace of 8,519,680 B per thread that runs matmuls (before Hopper).
"""

from __future__ import annotations

import torch
from torch import nn

import memfit
from memfit.cuda.overhead import device_overhead
from memfit.cuda.target import get_gpu
from tests.conftest import module_spec

MiB = 1 << 20


class Wide(nn.Module):
    """One 4096 -> 1248 fp32 weight: 19.5 MiB, so its block is a whole 20 MiB segment."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4096, 1248, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Spiky(nn.Module):
    """A 12 MiB scratch buffer, freed, then a 30 MiB one: the cache holds the first."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(128))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.empty(12 * MiB // 4)
        del scratch
        big = torch.empty(30 * MiB // 4)
        return big.sum() + self.w.sum() + x.sum()


def test_allocated_counts_whole_blocks():
    # 4096 x 1248 x 4 = 20,447,232 B (19.5 MiB) asks for a 20 MiB segment; the 0.5 MiB left
    # is not split off, so max_memory_allocated counts 20 MiB for the weight.
    spec = module_spec(Wide(), lambda b: torch.randn(b, 4096))
    est = memfit.estimate(spec, memfit.Workload(mode="inference", optimizer="none"))
    assert est.profile.breakdown["parameters"] == 20 * MiB
    top = est.profile.top_tensors[0]
    assert (top["category"], top["bytes"]) == ("parameters", 20 * MiB)
    # The peak: the weight, the input (16 KiB), the output (4992 B -> 5120) and one workspace.
    assert est.profile.peak_allocated_bytes == 20 * MiB + 16384 + 5120 + 8_519_680


def test_inference_has_one_cublas_workspace_training_two():
    spec = module_spec(Wide(), lambda b: torch.randn(b, 4096))
    inf = memfit.estimate(spec, memfit.Workload(mode="inference", optimizer="none"))
    train = memfit.estimate(spec, memfit.Workload(optimizer="sgd"))
    assert inf.profile.breakdown["workspaces"] == 8_519_680
    assert train.profile.device_breakdown["workspaces"] == 2 * 8_519_680
    ws = [r for r in train.profile.records.values() if r.category == "workspaces"]
    assert sorted(r.phase for r in ws) == ["backward", "forward"]


def test_a_step_that_runs_after_emptying_the_cache_reports_what_it_reserves():
    # Without a GPU: 2 MiB (small segment) + 20 MiB (workspace) + 12 MiB (scratch, cached
    # after its free) + 30 MiB (the big buffer cannot use the 12 MiB block) = 64 MiB.
    spec = module_spec(Spiky(), lambda b: torch.zeros(b))
    w = memfit.Workload(mode="inference", optimizer="none")
    free = memfit.estimate(spec, w)
    assert free.profile.peak_reserved_bytes == 64 * MiB
    # On a GPU whose allocator can get 54 MiB, cudaMalloc of the 30 MiB fails; PyTorch frees
    # the cached 12 MiB segment and retries: the step runs, with 52 MiB reserved at most.
    outside = device_overhead(get_gpu("t4")).outside_allocator_bytes()
    est = memfit.estimate(spec, w, gpu=f"t4@{outside + 54 * MiB}B")
    assert est.oom is None
    assert est.profile.peak_reserved_bytes == 52 * MiB
    assert est.profile.device_total_bytes == 52 * MiB + outside
    # 2 MiB under capacity is inside the 5 % margin: it runs, but memfit does not call it a fit.
    assert est.fits is False
    # With 1 MiB less even the retry fails: the OOM is reported at the big buffer.
    tight = memfit.estimate(spec, w, gpu=f"t4@{outside + 51 * MiB}B")
    assert tight.oom is not None and "Tried to allocate 30.00 MiB" in tight.oom
    assert tight.fits is False


def test_memory_fraction_in_an_estimate():
    spec = module_spec(Spiky(), lambda b: torch.zeros(b))
    w = memfit.Workload(mode="inference", optimizer="none")
    total = get_gpu("t4").total_memory_bytes
    roomy = memfit.estimate(spec, w, gpu="t4", alloc_conf="per_process_memory_fraction:0.5")
    assert roomy.oom is None and roomy.fits
    # allowed = fraction x the device total: 40 MiB of a T4 is less than the 34 + 30 needed.
    frac = 40 * MiB / total
    capped = memfit.estimate(spec, w, gpu="t4", alloc_conf=f"per_process_memory_fraction:{frac}")
    assert capped.oom is not None and "allowed" in capped.oom
    assert capped.fits is False
    # No GPU named: the default GPU's total; the estimate still runs.
    assert memfit.estimate(spec, w, alloc_conf="per_process_memory_fraction:0.9").oom is None
