"""Device memory a PyTorch training process uses beyond the tensors a trace sees.

Two kinds of item:

* ``through_allocator=False``: memory the CUDA caching allocator never sees. nvidia-smi (and
  ``torch.cuda.mem_get_info``) count it; ``torch.cuda.memory_reserved()`` does not. It comes
  off the top of ``GPU.total_memory_bytes`` before the allocator gets anything:
  the CUDA context, kernel images loaded into it, NCCL communicator buffers.
* ``through_allocator=True``: memory that IS allocated through the caching allocator (so it
  shows in ``memory_allocated()``/``memory_reserved()``) but by C++ code a Python-level trace
  of the model does not see: the cuBLAS workspace and cuDNN convolution workspaces.

Numbers are per GPU / per process. Every constant below names its source; where a figure is
an estimate the comment says so and gives the range used for ``low_bytes``/``high_bytes``.
Nothing here is measured on this machine: memfit runs without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.cuda.gpus import GPU
from memfit.errors import BadInputError
from memfit.units import GIB, KIB, MIB

__all__ = ["DeviceOverhead", "OverheadItem", "device_overhead"]


# ------------------------------------------------------------------ CUDA context
#
# Lazy module loading: CUDA 11.7 introduced it (off by default); PyTorch >= 1.13 sets
# CUDA_MODULE_LOADING=LAZY when the user has not set it (pytorch/pytorch PR #86509), and
# CUDA 12.2 made LAZY the driver default on Linux (NVIDIA CUDA Programming Guide, "Lazy
# Loading", change history: 11.7 introduced, 12.2 default on Linux, 12.3 on Windows). It
# needs driver >= 515.
LAZY_LOADING_MIN_CUDA = (11, 7)

# The driver reserves local memory (the per-thread stack) for every thread that can be
# resident, context-wide: MAX_THREADS_PER_SM x SMs x LOCAL_MEM_PER_THREAD (NVIDIA developer
# forum, "Local memory management", reply on cuCtxCreate / CU_CTX_LMEM_RESIZE_TO_MAX). The
# default per-thread stack is 1 KiB (CUDA Runtime API, cudaDeviceSetLimit /
# cudaLimitStackSize). A kernel needing more grows the reservation for the rest of the
# process, hence the high end of the context range. This term is what makes the context
# bigger on H100 (132 SMs x 2048 threads = 264 MiB) than on a T4 (40 x 1024 = 40 MiB).
CUDA_DEFAULT_STACK_BYTES_PER_THREAD = 1 * KIB

# Maximum resident threads per SM, CUDA C++ Programming Guide, "Compute Capabilities" table.
MAX_THREADS_PER_SM = {
    (7, 0): 2048,  # Volta
    (7, 5): 1024,  # Turing
    (8, 0): 2048,  # A100
    (8, 6): 1536,  # GA10x
    (8, 7): 1536,  # Orin
    (8, 9): 1536,  # Ada
    (9, 0): 2048,  # Hopper
    (10, 0): 2048,  # B200 (sm_100)
    (12, 0): 1536,  # RTX 50 series, RTX PRO 6000 Blackwell (sm_120; deviceQuery: 1536)
}
_DEFAULT_MAX_THREADS_PER_SM = 2048  # newer architectures: the larger value, to stay safe

# The rest of a bare context (driver structures, the kernel images of the first few kernels),
# with lazy loading. Calibrated on bare-context measurements minus the local-memory term:
# * RTX 3090, torch 2.7.1+cu128, driver 610: 256 MiB in nvidia-smi (invoke-ai/InvokeAI
#   issue #9413) -> 256 - 82 SMs x 1536 x 1 KiB (123 MiB) = 133 MiB;
# * RTX 6000 Ada, torch 2.10+cu130: 426 MiB in nvidia-smi after mem_get_info
#   (unslothai/unsloth-zoo PR #1053) -> 426 - 142 x 1536 x 1 KiB (213 MiB) = 213 MiB;
# * PyTorch 1.13 / CUDA 11.7, GPU not named: cudaMemGetInfo used 287,047,680 bytes after a
#   6.4 MB tensor (whose 20 MiB allocator segment is included), i.e. ~254 MiB context in all
#   (pytorch/pytorch PR #86509);
# * ptrblck (NVIDIA) on pytorch/pytorch #107667 and #109888: "~300MB" / "around 400MB" with
#   lazy loading.
CUDA_CONTEXT_BASE_BYTES = 176 * MIB
CUDA_CONTEXT_BASE_LOW_BYTES = 128 * MIB
CUDA_CONTEXT_BASE_HIGH_BYTES = 256 * MIB

# Eager module loading (CUDA < 11.7, or CUDA_MODULE_LOADING=EAGER): every kernel of every
# loaded library goes into the context at startup.
# * Hugging Face Transformers docs, "Model training anatomy": torch.ones((1, 1)).to("cuda")
#   -> "GPU memory occupied: 1343 MB" ("the kernels alone take up 1.3GB").
# * pytorch/pytorch PR #86509: CUDA_MODULE_LOADING=DEFAULT (eager) used 666,632,192 bytes
#   with a 20 MiB allocator segment in it -> ~616 MiB.
# * ptrblck on #107667: before 11.7 "all kernels were loaded ... which took >1000MB";
#   csarofeen on PR #4918 (2018): "about 1.5GB".
CUDA_CONTEXT_EAGER_BYTES = 1343 * MIB
CUDA_CONTEXT_EAGER_LOW_BYTES = 616 * MIB
CUDA_CONTEXT_EAGER_HIGH_BYTES = 1536 * MIB

# With lazy loading the kernels a training step touches (PyTorch's own elementwise /
# reduction / optimizer kernels, cuBLAS(Lt) GEMM kernels, cuDNN engines, Triton kernels from
# torch.compile) are loaded into the context on first use and stay. Estimate: ptrblck's
# 300-400 MB after running a model vs ~250 MiB bare contexts gives ~50-150 MiB; the ceiling
# is eager loading of everything (1343 MB above minus a bare context, ~1.1 GB).
LAZY_KERNEL_IMAGES_BYTES = 128 * MIB
LAZY_KERNEL_IMAGES_LOW_BYTES = 32 * MIB
LAZY_KERNEL_IMAGES_HIGH_BYTES = 1 * GIB

# ------------------------------------------------------------------ cuBLAS / cuBLASLt
#
# aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize(): with
# CUBLAS_WORKSPACE_CONFIG unset the workspace is ":4096:2:16:8" = 2 x 4096 KiB + 8 x 16 KiB,
# "32MiB for Hopper and Blackwell" (cudaDeviceProp.major in 9, 10, 11, 12 in current
# PyTorch; older releases only sm_90 exactly).
CUBLAS_WORKSPACE_DEFAULT_BYTES = 4096 * KIB * 2 + 16 * KIB * 8  # 8,519,680 bytes
CUBLAS_WORKSPACE_HOPPER_PLUS_BYTES = 4096 * 8 * KIB  # 32 MiB
CUBLAS_WORKSPACE_32MIB_MAJORS = (9, 10, 11, 12)
# CublasHandlePool.cpp, parseCUDABlasLtWorkspaceSize(): CUBLASLT_WORKSPACE_SIZE defaults to
# 1024 KiB, but on CUDA (non-fbcode) builds TORCH_CUBLASLT_UNIFIED_WORKSPACE defaults to on,
# and then getCUDABlasLtWorkspace() hands cuBLASLt the cuBLAS workspace of the same
# (handle, stream): no second buffer. Only with TORCH_CUBLASLT_UNIFIED_WORKSPACE=0 does Lt
# get its own 1 MiB per (handle, stream). Not modelled as an item for that reason.
CUBLASLT_WORKSPACE_DEFAULT_BYTES = 1024 * KIB
# Through the allocator? Yes: getNewWorkspace() / allocateCUDABlasWorkspace() call
# c10::cuda::CUDACachingAllocator::get()->allocate(size), and the DataPtr stays in
# cublas_handle_stream_to_workspace() -- keyed by (handle, stream) -- until
# torch._C._cuda_clearCublasWorkspaces(). So it counts in memory_allocated() AND
# memory_reserved() for the life of the process. (PyTorch sets the workspace explicitly so
# that cuBLAS >= 12.2 does not cudaMallocAsync one outside the allocator; comment in
# getCurrentCUDABlasHandle().) The allocator serves an 8.1 MiB request from a 20 MiB
# large-pool segment that other tensors may share, and a 32 MiB one from its own segment.
#
# How many (handle, stream) pairs: handles come from a thread-local PoolWindow, and the
# autograd engine runs CUDA backward on its own device thread, so a plain training loop
# has two (forward on the main thread, backward on the autograd thread), each on the
# current stream. Extra streams (DDP/FSDP communication hooks, user streams) add more.
CUBLAS_HANDLE_STREAM_PAIRS = 2
# Inference (no backward) runs every matmul on the caller's thread: one pair.
CUBLAS_HANDLE_STREAM_PAIRS_INFERENCE = 1
CUBLAS_HANDLE_STREAM_PAIRS_LOW = 1
CUBLAS_HANDLE_STREAM_PAIRS_HIGH = 4

# ------------------------------------------------------------------ cuDNN convolutions
#
# Through the allocator, transient: aten/src/ATen/native/cudnn/Conv_v8.cpp run_conv_plan()
# does c10::cuda::CUDACachingAllocator::get()->allocate(plan.getWorkspaceSize()) and frees it
# when the call returns (Conv_v7.cpp likewise). It raises the peak of the op that owns it.
# Its size is per layer and per algorithm: implicit-GEMM engines need none; PyTorch accepts
# any engine whose workspace fits in free memory (pytorch/pytorch #49207: "the first layer
# uses 36GB workspace" is possible; a forum report of an 8.7 GB block for one conv2d
# forward). Estimate, not a measurement: 128 MiB, between CuPy/Chainer's default 8 MiB
# workspace cap (cupy/cupy #591) and LBANN's fixed 1 GiB cuDNN workspace (LLNL/lbann #439);
# high end 1 GiB ("many big-memory cards can and do use workspace bigger than 1 GB", ngimel
# on pytorch/pytorch PR #552). CUDNN_CONV_WSCAP_DBG=<MiB> caps it.
CUDNN_CONV_WORKSPACE_BYTES = 128 * MIB
CUDNN_CONV_WORKSPACE_LOW_BYTES = 0
CUDNN_CONV_WORKSPACE_HIGH_BYTES = 1 * GIB

# ------------------------------------------------------------------ NCCL
#
# NCCL allocates its buffers itself (cuMem* / cudaMalloc), never through PyTorch's caching
# allocator. Per connection and channel it keeps one FIFO per protocol; defaults from NVIDIA
# nccl src/init.cc (computeBuffSizes) and src/include/device.h:
NCCL_LL_BUFFSIZE_BYTES = 8 * 512 * 8 * 16  # LL: lines/thread 8 x 512 threads x 8 steps x 16 B
NCCL_LL128_BUFFSIZE_BYTES = 120 * 640 * 8 * 8  # LL128: 120 elems x 640 threads x 8 steps x 8 B
NCCL_BUFFSIZE_BYTES = 1 << 22  # Simple: 4 MiB, env NCCL_BUFFSIZE
# 524,288 + 4,915,200 + 4,194,304 = 9,633,792 bytes, rounded up to the 2 MiB cuMem
# granularity = 10 MiB: exactly the 10485760-byte allocations NCCL_DEBUG_SUBSYS=ALLOC shows
# on 8 x H100 (NVIDIA/nccl #1685).
NCCL_ALLOC_GRANULARITY_BYTES = 2 * MIB
# Channels: NCCL picks them from the topology; memory is linear in channels (sjeaugey on
# NVIDIA/nccl #864/#986). PCIe-only boxes get 2 ("2 coll channels, 2 p2p channels" in an
# NCCL_DEBUG log of 4 PCIe GPUs, ultralytics/ultralytics #12905; "Channel 00/02" in
# rwth-i6/returnn #1469). NVLink/NVSwitch boards use many more (32 per peer for all-to-all on
# 8 x H100 in NVIDIA/nccl #1685); 24 is the value that reproduces the A100 measurement below.
NCCL_CHANNELS_PCIE = 2
NCCL_CHANNELS_NVLINK = 24
# Connections per channel held by one rank: ring (one peer) plus tree up/down with > 2 ranks.
NCCL_CONNECTIONS_TWO_RANKS = 2
NCCL_CONNECTIONS_MULTI_RANK = 3
# Fixed per-communicator device memory (channel/peer structures, work FIFOs, proxy state).
# Estimate: calibrated so that the model gives the 544 MB that one communicator + a 4 MB
# all-reduce cost per GPU for 2 of 4 NVLink A100s (NVIDIA/nccl #964: 544 MB for 2-GPU
# groups, 688 MB for larger ones; the model gives 784 MiB for the latter, i.e. errs high).
NCCL_FIXED_BYTES = 64 * MIB
# Range: half the modelled figure, up to the measured all-to-all blow-up on 8 x H100
# (1.06 GB -> 4.34 GB of non-PyTorch memory after the first all_to_all_single,
# NVIDIA/nccl #1685) for NVLink boards, and twice the model on PCIe.
NCCL_LOW_FACTOR = 0.5
NCCL_HIGH_BYTES_NVLINK = 4_340_000_000 - 1_060_000_000
NCCL_HIGH_FACTOR_PCIE = 2.0


@dataclass(frozen=True, kw_only=True)
class OverheadItem:
    """One piece of device memory outside what a tensor trace sees."""

    name: str
    bytes: int  # point estimate
    low_bytes: int
    high_bytes: int
    through_allocator: bool  # True: inside memory_reserved(); False: only nvidia-smi sees it
    source: str


@dataclass(frozen=True, kw_only=True)
class DeviceOverhead:
    """The overhead items for one GPU of a job."""

    items: tuple[OverheadItem, ...]

    def outside_allocator_bytes(self) -> int:
        """Memory nvidia-smi shows on top of ``torch.cuda.memory_reserved()``."""
        return sum(i.bytes for i in self.items if not i.through_allocator)

    def through_allocator_bytes(self) -> int:
        """Allocator memory that C++ code (cuBLAS/cuDNN workspaces) adds to the traced tensors."""
        return sum(i.bytes for i in self.items if i.through_allocator)

    def total_bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    def range_bytes(self) -> tuple[int, int]:
        """(low, high) of all items together, inside and outside the allocator."""
        return sum(i.low_bytes for i in self.items), sum(i.high_bytes for i in self.items)

    def outside_allocator_range_bytes(self) -> tuple[int, int]:
        outside = [i for i in self.items if not i.through_allocator]
        return sum(i.low_bytes for i in outside), sum(i.high_bytes for i in outside)

    def item(self, name: str) -> OverheadItem | None:
        return next((i for i in self.items if i.name == name), None)


def cuda_local_memory_bytes(gpu: GPU) -> int:
    """Default per-thread stack reservation: SMs x max resident threads per SM x 1 KiB."""
    threads = MAX_THREADS_PER_SM.get(gpu.compute_capability, _DEFAULT_MAX_THREADS_PER_SM)
    return gpu.sm_count * threads * CUDA_DEFAULT_STACK_BYTES_PER_THREAD


def cublas_workspace_bytes(gpu: GPU) -> int:
    """PyTorch's default cuBLAS workspace per (handle, stream) for this GPU."""
    if gpu.compute_capability[0] in CUBLAS_WORKSPACE_32MIB_MAJORS:
        return CUBLAS_WORKSPACE_HOPPER_PLUS_BYTES
    return CUBLAS_WORKSPACE_DEFAULT_BYTES


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def nccl_connection_bytes() -> int:
    """Device memory of one NCCL connection on one channel (LL + LL128 + Simple FIFOs)."""
    raw = NCCL_LL_BUFFSIZE_BYTES + NCCL_LL128_BUFFSIZE_BYTES + NCCL_BUFFSIZE_BYTES
    return _round_up(raw, NCCL_ALLOC_GRANULARITY_BYTES)


def _context_items(gpu: GPU, cuda_version: tuple[int, int]) -> list[OverheadItem]:
    if cuda_version < LAZY_LOADING_MIN_CUDA:
        return [
            OverheadItem(
                name="cuda_context",
                bytes=CUDA_CONTEXT_EAGER_BYTES,
                low_bytes=CUDA_CONTEXT_EAGER_LOW_BYTES,
                high_bytes=CUDA_CONTEXT_EAGER_HIGH_BYTES,
                through_allocator=False,
                source=(
                    f"CUDA {cuda_version[0]}.{cuda_version[1]} < 11.7: eager module loading, all "
                    "kernels loaded at startup; HF Transformers 'Model training anatomy' 1343 MB, "
                    "pytorch/pytorch PR #86509 ~616 MiB, PR #4918 ~1.5 GB"
                ),
            )
        ]
    lmem = cuda_local_memory_bytes(gpu)
    return [
        OverheadItem(
            name="cuda_context",
            bytes=CUDA_CONTEXT_BASE_BYTES + lmem,
            low_bytes=CUDA_CONTEXT_BASE_LOW_BYTES + lmem,
            high_bytes=CUDA_CONTEXT_BASE_HIGH_BYTES + 2 * lmem,
            through_allocator=False,
            source=(
                f"lazy-loading context: ~176 MiB driver state + {gpu.sm_count} SMs x max resident "
                "threads x 1 KiB default stack; calibrated on RTX 3090 256 MiB (InvokeAI #9413) "
                "and RTX 6000 Ada 426 MiB (unsloth-zoo PR #1053); ptrblck ~300-400 MB "
                "(pytorch #107667, #109888)"
            ),
        ),
        OverheadItem(
            name="lazy_kernel_images",
            bytes=LAZY_KERNEL_IMAGES_BYTES,
            low_bytes=LAZY_KERNEL_IMAGES_LOW_BYTES,
            high_bytes=LAZY_KERNEL_IMAGES_HIGH_BYTES,
            through_allocator=False,
            source=(
                "estimate: kernels (PyTorch, cuBLAS, cuDNN, Triton) loaded into the context on "
                "first use; 300-400 MB after a model run vs ~250 MiB bare (ptrblck), ceiling = "
                "eager loading of everything (~1.1 GB more)"
            ),
        ),
    ]


def _cublas_item(gpu: GPU, training: bool) -> OverheadItem:
    ws = cublas_workspace_bytes(gpu)
    config = "32 MiB (sm90+)" if ws == CUBLAS_WORKSPACE_HOPPER_PLUS_BYTES else ":4096:2:16:8"
    pairs = CUBLAS_HANDLE_STREAM_PAIRS if training else CUBLAS_HANDLE_STREAM_PAIRS_INFERENCE
    threads = "forward thread + autograd backward thread" if training else "the forward thread"
    return OverheadItem(
        name="cublas_workspace",
        bytes=ws * pairs,
        low_bytes=ws * CUBLAS_HANDLE_STREAM_PAIRS_LOW,
        high_bytes=ws * (CUBLAS_HANDLE_STREAM_PAIRS_HIGH if training else 2 * pairs),
        through_allocator=True,
        source=(
            f"PyTorch CublasHandlePool.cpp: {ws} bytes ({config}) per (handle, stream), allocated "
            "with CUDACachingAllocator and kept for the process; cuBLASLt shares it "
            f"(TORCH_CUBLASLT_UNIFIED_WORKSPACE on by default); {pairs} pair(s) = {threads}"
        ),
    )


def _cudnn_item() -> OverheadItem:
    return OverheadItem(
        name="cudnn_conv_workspace",
        bytes=CUDNN_CONV_WORKSPACE_BYTES,
        low_bytes=CUDNN_CONV_WORKSPACE_LOW_BYTES,
        high_bytes=CUDNN_CONV_WORKSPACE_HIGH_BYTES,
        through_allocator=True,
        source=(
            "estimate: PyTorch Conv_v8.cpp run_conv_plan allocates plan.getWorkspaceSize() "
            "through CUDACachingAllocator for the duration of the call; size is per layer "
            "(0 for implicit GEMM, >1 GB possible, pytorch #49207); CUDNN_CONV_WSCAP_DBG caps it"
        ),
    )


def _nccl_item(gpu: GPU, n_gpus: int) -> OverheadItem:
    channels = NCCL_CHANNELS_NVLINK if gpu.nvlink else NCCL_CHANNELS_PCIE
    connections = NCCL_CONNECTIONS_TWO_RANKS if n_gpus == 2 else NCCL_CONNECTIONS_MULTI_RANK
    point = channels * connections * nccl_connection_bytes() + NCCL_FIXED_BYTES
    high = max(point, NCCL_HIGH_BYTES_NVLINK) if gpu.nvlink else int(point * NCCL_HIGH_FACTOR_PCIE)
    return OverheadItem(
        name="nccl_communicator",
        bytes=point,
        low_bytes=int(point * NCCL_LOW_FACTOR),
        high_bytes=high,
        through_allocator=False,
        source=(
            f"one NCCL communicator over {n_gpus} GPUs: {channels} channels "
            f"({'NVLink' if gpu.nvlink else 'PCIe'}) x {connections} connections x 10 MiB "
            "(LL 512 KiB + LL128 4.69 MiB + Simple NCCL_BUFFSIZE 4 MiB, nccl src/init.cc) + "
            "64 MiB fixed; NVIDIA/nccl #964 measured 544/688 MB on A100 NVLink; all-to-all "
            "can add ~3.3 GB (nccl #1685)"
        ),
    )


def device_overhead(
    gpu: GPU,
    *,
    n_gpus: int = 1,
    uses_conv: bool = False,
    uses_matmul: bool = True,
    cuda_version: tuple[int, int] = (12, 8),
    training: bool = True,
) -> DeviceOverhead:
    """The per-GPU memory a training process uses beyond its traced tensors.

    ``n_gpus`` is the number of GPUs in the data-parallel job (one NCCL communicator is
    assumed); ``uses_conv`` adds the cuDNN convolution workspace, ``uses_matmul`` the cuBLAS
    workspace (one per thread that runs matmuls: two when ``training``, the autograd engine
    running backward on its own thread, else one); ``cuda_version`` (the CUDA PyTorch was
    built with) decides lazy vs eager kernel loading.
    """
    if isinstance(n_gpus, bool) or not isinstance(n_gpus, int) or n_gpus < 1:
        raise BadInputError(f"n_gpus must be a whole number >= 1, got {n_gpus!r}.")
    if (
        not isinstance(cuda_version, tuple)
        or len(cuda_version) != 2
        or not all(isinstance(v, int) and v >= 0 for v in cuda_version)
    ):
        raise BadInputError(
            f"cuda_version must be a (major, minor) tuple such as (12, 8), got {cuda_version!r}."
        )
    if gpu.rocm:
        raise BadInputError(
            f"{gpu.display_name} runs PyTorch's ROCm build. memfit models the memory CUDA takes "
            "beside the tensors (the CUDA context, cuBLAS and cuDNN workspaces), not ROCm's "
            "(the HIP context, hipBLASLt's workspace): its estimates are not available yet. "
            "`memfit gpus` lists its capacity."
        )
    items = _context_items(gpu, cuda_version)
    if uses_matmul:
        items.append(_cublas_item(gpu, training))
    if uses_conv:
        items.append(_cudnn_item())
    if n_gpus > 1:
        items.append(_nccl_item(gpu, n_gpus))
    return DeviceOverhead(items=tuple(items))
