"""Device memory outside the traced tensors: context, workspaces, NCCL."""

from __future__ import annotations

import pytest

from memfit.cuda.gpus import GPU
from memfit.cuda.overhead import (
    CUBLAS_WORKSPACE_DEFAULT_BYTES,
    CUBLAS_WORKSPACE_HOPPER_PLUS_BYTES,
    CUDA_CONTEXT_EAGER_BYTES,
    DeviceOverhead,
    OverheadItem,
    cublas_workspace_bytes,
    cuda_local_memory_bytes,
    device_overhead,
    nccl_connection_bytes,
)
from memfit.cuda.target import get_gpu, list_gpus
from memfit.errors import BadInputError

MiB = 1 << 20


def _names(overhead: DeviceOverhead) -> list[str]:
    return [i.name for i in overhead.items]


def test_cublas_workspace_matches_pytorch_defaults() -> None:
    # ":4096:2:16:8" = 2 x 4096 KiB + 8 x 16 KiB
    assert CUBLAS_WORKSPACE_DEFAULT_BYTES == 8_519_680
    assert CUBLAS_WORKSPACE_HOPPER_PLUS_BYTES == 33_554_432  # 32 MiB


def test_hopper_workspace_differs_from_ampere() -> None:
    assert cublas_workspace_bytes(get_gpu("h100-sxm")) == 32 * MiB
    assert cublas_workspace_bytes(get_gpu("h200")) == 32 * MiB
    assert cublas_workspace_bytes(get_gpu("a100-80gb")) == 8_519_680
    assert cublas_workspace_bytes(get_gpu("rtx-4090")) == 8_519_680  # sm89 is not sm90
    assert cublas_workspace_bytes(get_gpu("t4")) == 8_519_680
    hopper = device_overhead(get_gpu("h100-sxm")).item("cublas_workspace")
    ampere = device_overhead(get_gpu("a100-80gb")).item("cublas_workspace")
    assert hopper is not None and ampere is not None
    assert hopper.bytes == 2 * 32 * MiB
    assert ampere.bytes == 2 * 8_519_680
    assert hopper.through_allocator and ampere.through_allocator


@pytest.mark.parametrize("gpu", [g for g in list_gpus() if not g.rocm], ids=lambda g: g.name)
def test_items_sum_correctly(gpu: GPU) -> None:
    overhead = device_overhead(gpu, n_gpus=4, uses_conv=True)
    outside = sum(i.bytes for i in overhead.items if not i.through_allocator)
    inside = sum(i.bytes for i in overhead.items if i.through_allocator)
    assert overhead.outside_allocator_bytes() == outside
    assert overhead.through_allocator_bytes() == inside
    assert overhead.total_bytes() == outside + inside
    low, high = overhead.range_bytes()
    assert low == sum(i.low_bytes for i in overhead.items)
    assert high == sum(i.high_bytes for i in overhead.items)
    assert low <= overhead.total_bytes() <= high
    o_low, o_high = overhead.outside_allocator_range_bytes()
    assert o_low <= outside <= o_high
    for item in overhead.items:
        assert isinstance(item, OverheadItem)
        assert 0 <= item.low_bytes <= item.bytes <= item.high_bytes, item.name
        assert item.source


def test_single_gpu_has_no_nccl_item() -> None:
    overhead = device_overhead(get_gpu("a100-80gb"), n_gpus=1)
    assert "nccl_communicator" not in _names(overhead)
    assert overhead.item("nccl_communicator") is None


def test_multi_gpu_adds_nccl_outside_the_allocator() -> None:
    overhead = device_overhead(get_gpu("a100-80gb"), n_gpus=8)
    nccl = overhead.item("nccl_communicator")
    assert nccl is not None
    assert nccl.through_allocator is False
    single = device_overhead(get_gpu("a100-80gb"), n_gpus=1)
    assert overhead.outside_allocator_bytes() == single.outside_allocator_bytes() + nccl.bytes


def test_nccl_connection_is_10_mib() -> None:
    # LL 512 KiB + LL128 4,915,200 B + Simple 4 MiB = 9,633,792 B -> 2 MiB granularity
    assert nccl_connection_bytes() == 10 * MiB


def test_nccl_reproduces_the_a100_two_rank_measurement() -> None:
    # NVIDIA/nccl #964: 544 MB per GPU for a 2-GPU communicator on NVLink A100s
    nccl = device_overhead(get_gpu("a100-80gb"), n_gpus=2).item("nccl_communicator")
    assert nccl is not None and nccl.bytes == 544 * MiB


def test_nvlink_boards_use_more_nccl_memory_than_pcie() -> None:
    nvlink = device_overhead(get_gpu("h100-sxm"), n_gpus=8).item("nccl_communicator")
    pcie = device_overhead(get_gpu("rtx-4090"), n_gpus=8).item("nccl_communicator")
    assert nvlink is not None and pcie is not None
    assert nvlink.bytes > pcie.bytes


def test_matmul_and_conv_flags() -> None:
    gpu = get_gpu("rtx-3090")
    assert "cublas_workspace" not in _names(device_overhead(gpu, uses_matmul=False))
    assert "cudnn_conv_workspace" not in _names(device_overhead(gpu))
    conv = device_overhead(gpu, uses_conv=True).item("cudnn_conv_workspace")
    assert conv is not None and conv.through_allocator is True
    assert conv.low_bytes == 0


def test_context_is_outside_allocator_and_scales_with_sms() -> None:
    t4 = device_overhead(get_gpu("t4")).item("cuda_context")
    h100 = device_overhead(get_gpu("h100-sxm")).item("cuda_context")
    assert t4 is not None and h100 is not None
    assert not t4.through_allocator and not h100.through_allocator
    assert h100.bytes > t4.bytes
    assert cuda_local_memory_bytes(get_gpu("h100-sxm")) == 132 * 2048 * 1024
    assert cuda_local_memory_bytes(get_gpu("t4")) == 40 * 1024 * 1024
    # every lazy-loading context lands in the measured 250-500 MiB band
    for gpu in list_gpus():
        if gpu.rocm:
            continue  # not modelled: see test_rocm_overhead_is_refused
        ctx = device_overhead(gpu).item("cuda_context")
        assert ctx is not None
        assert 200 * MiB <= ctx.bytes <= 500 * MiB, gpu.name


def test_old_cuda_loads_kernels_eagerly() -> None:
    eager = device_overhead(get_gpu("v100-16gb"), cuda_version=(11, 3))
    lazy = device_overhead(get_gpu("v100-16gb"), cuda_version=(12, 8))
    assert eager.item("cuda_context").bytes == CUDA_CONTEXT_EAGER_BYTES  # type: ignore[union-attr]
    assert eager.item("lazy_kernel_images") is None
    assert lazy.item("lazy_kernel_images") is not None
    assert eager.outside_allocator_bytes() > lazy.outside_allocator_bytes()
    # 11.7 is the first lazy version
    assert device_overhead(get_gpu("t4"), cuda_version=(11, 7)).item("lazy_kernel_images")


@pytest.mark.parametrize("n_gpus", [0, -1, 1.5, True])
def test_bad_n_gpus(n_gpus: object) -> None:
    with pytest.raises(BadInputError):
        device_overhead(get_gpu("t4"), n_gpus=n_gpus)  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [(12,), "12.8", (12, "8")])
def test_bad_cuda_version(version: object) -> None:
    with pytest.raises(BadInputError):
        device_overhead(get_gpu("t4"), cuda_version=version)  # type: ignore[arg-type]


def test_overhead_is_frozen() -> None:
    overhead = device_overhead(get_gpu("l4"))
    with pytest.raises(AttributeError):
        overhead.items = ()  # type: ignore[misc]


def test_rocm_overhead_is_refused() -> None:
    with pytest.raises(BadInputError, match=r"ROCm build.*not available yet"):
        device_overhead(get_gpu("mi300x"))
