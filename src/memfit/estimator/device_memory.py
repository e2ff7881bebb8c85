"""From the traced stream to device memory: allocator simulation, workspaces, CUDA context.

- The cuBLAS workspace is allocated through the caching allocator at the first matmul and kept
  (CublasHandlePool.cpp), so it enters the event stream as a "workspaces" allocation at the
  first forward op and counts in allocated and reserved memory alike.
- The stream is replayed through the caching-allocator simulator (`memfit.cuda.allocator`) for peak
  reserved memory, fragmentation, and the OOM point under the GPU's capacity.
- The CUDA context, lazily loaded kernels and NCCL buffers never go through the allocator; they
  are added on top of reserved memory to give what nvidia-smi shows (`device_total_bytes`).
- A cuDNN convolution workspace (an estimate with a range, see memfit.cuda.overhead) is added
  to reserved memory when the model runs convolutions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memfit.cuda.allocator_config import AllocatorConfig, cuda_block_size
from memfit.cuda.allocator_replay import AllocatorResult, simulate_shared
from memfit.cuda.gpus import fit_limit
from memfit.cuda.overhead import cublas_workspace_bytes, device_overhead
from memfit.cuda.target import DEFAULT_GPU, get_gpu
from memfit.estimator.ddp import BUCKET_OP
from memfit.estimator.host_memory import HostMemory, host_memory
from memfit.estimator.trace.step_runner import traced_micro_batches
from memfit.events import ALLOC, FREE, Category, Event, StorageRecord
from memfit.profile import MemoryProfile
from memfit.techniques.optimizer import paged_state_note
from memfit.units import format_bytes

#: The GPU assumed for context/workspace sizes and the attention kernel when none is named.

#: aten ops that run through a cuBLAS(Lt) handle (CUDABlas.cpp gemm / bgemm / gemv callers).
_CUBLAS_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "_addmm_activation", "_scaled_mm"}
)
_CONV_OPS = ("convolution", "cudnn_convolution", "convolution_backward")


def place_on_host(
    records: dict[int, StorageRecord], *, optimizer_on_cpu: bool, embedding_path: str | None
) -> dict[int, StorageRecord]:
    """Records as they are when techniques keep some storages in CPU memory.

    - optimizer_on_cpu (optimizer offload, FSDP2's CPU offload): optimizer state and the
      update's temporaries live on the CPU.
    - embedding_path: the input embedding's weights, gradients and optimizer state live on the
      CPU, and so does its backward; its forward output is moved to the GPU (device memory).
    The trace is shared between these variants; only where storages live changes.
    """
    if not optimizer_on_cpu and embedding_path is None:
        return records
    out = {}
    for sid, r in records.items():
        host = r.host
        optimizer_work = r.category == "optimizer_state" or (
            r.phase == "optimizer" and r.category == "temporaries"
        )
        in_embedding = embedding_path is not None and (
            r.module == embedding_path or r.module.startswith(embedding_path + ".")
        )
        embedding_side = r.category in (
            "parameters",
            "gradients",
            "optimizer_state",
        ) or r.phase in (
            "backward",
            "optimizer",
        )
        if (optimizer_on_cpu and optimizer_work) or (in_embedding and embedding_side):
            host = True
        out[sid] = r if host == r.host else replace(r, host=host)
    return out


def micro_batches(w: Any) -> int:
    return traced_micro_batches(w)


def summarize(
    records: dict[int, StorageRecord], embedding_path: str | None, micro: int
) -> dict[str, int]:
    """Device bytes of the step's state, for the cost model.

    parameters and optimizer state as allocated; gradients of the last step (each step
    allocates them anew), DDP's buckets of it apart; the input embedding's output of one
    micro-batch (what crosses PCIe when the embedding runs on the CPU); the bytes saved to
    the host in one micro-batch's forward (offloaded activations: they come back in
    backward).
    """

    last = max((r.step for r in records.values()), default=0)
    out = dict.fromkeys(
        (
            "parameters",
            "gradients",
            "optimizer_state",
            "host_optimizer_state",
            "embedding_output",
            "offloaded_activations",
            "paged_optimizer_state",
            "host_parameters",
            "ddp_buckets",
        ),
        0,
    )
    for r in records.values():
        if r.host and r.step == last and r.phase == "forward" and r.category != "parameters":
            out["offloaded_activations"] += r.nbytes
        size = cuda_block_size(r.nbytes)
        if r.category == "parameters" and r.host:
            out["host_parameters"] += r.nbytes
        elif r.category == "parameters":
            out["parameters"] += size
        elif r.op == BUCKET_OP and r.step == last:  # DDP's second copy of the gradients
            out["ddp_buckets"] += size
        elif r.category == "gradients" and not r.host and r.step == last:
            out["gradients"] += size
        elif r.category == "optimizer_state" and r.paged:
            out["paged_optimizer_state"] += r.nbytes
        elif r.category == "optimizer_state":
            out["host_optimizer_state" if r.host else "optimizer_state"] += (
                r.nbytes if r.host else size
            )
        elif (
            embedding_path is not None
            and r.phase == "forward"
            and r.step == last
            and r.module == embedding_path
        ):
            out["embedding_output"] += r.nbytes
    out["embedding_output"] //= max(micro, 1)
    out["offloaded_activations"] //= max(micro, 1)
    return out


def add_workspaces(
    records: dict[int, StorageRecord], events: list[Event], nbytes: int, pairs: int = 1
) -> tuple[dict[int, StorageRecord], list[Event]]:
    """Insert the cuBLAS workspaces: `pairs` (1 or 2) allocations of `nbytes` each.

    A handle's workspace is allocated at its first cuBLAS call (CublasHandlePool.cpp
    getCurrentCUDABlasHandle -> getNewWorkspace), after that op's output: the first is
    inserted after the first forward matmul's allocation (the main thread's handle), a second
    after the first backward matmul's (the autograd engine's thread has its own handle). A
    phase without a matmul event (a trace cut short) gets it at its first event. The H200
    ResNet-18 trace has them there: at the classifier's addmm and its backward mm.
    """
    if nbytes <= 0 or pairs <= 0:
        return records, events
    new_records = dict(records)
    new_events = list(events)
    for phase in ("forward", "backward")[:pairs]:
        # A generation's first model call is its "prefill" (memfit.estimator.generation.figures).
        names = ("forward", "prefill") if phase == "forward" else (phase,)
        at = next(
            (i + 1 for i, ev in enumerate(new_events)
             if ev.phase in names and ev.kind == ALLOC and ev.op.split(".")[0] in _CUBLAS_OPS),
            None,
        )  # fmt: skip
        if at is None:
            at = next((i for i, ev in enumerate(new_events) if ev.phase in names), None)
        if at is None:
            at = next(
                (i for i, ev in enumerate(new_events) if ev.phase == "forward"), len(new_events)
            )
        step = new_events[at][3] if at < len(new_events) else 0
        sid = max(new_records, default=-1) + 1
        new_records[sid] = StorageRecord(
            sid, nbytes, Category.WORKSPACES, phase, step, "cublas_workspace", "", -1, 0
        )
        new_events.insert(at, Event(ALLOC, sid, phase, step, "cublas_workspace", "", -1))
    return new_records, new_events


def uses_convolution(events: list[Event]) -> bool:
    return any(ev.op.startswith(_CONV_OPS) for ev in events if ev.kind == ALLOC)


@dataclass(frozen=True)
class DeviceMemory:
    """What the device holds for a traced stream: the profile with reserved and device totals,
    the host RAM, the per-category device bytes, the CUDA overheads, the verdict on a named GPU
    (`fits`, `oom`) and the notes they call for."""

    profile: MemoryProfile
    host: HostMemory
    records_summary: dict[str, int]
    overhead: Any
    device_total_range: tuple[int, int]
    fits: bool | None
    oom: str | None
    notes: tuple[str, ...]


def device_memory(
    records: dict[int, StorageRecord], events: list[Event], w: Any, *, gpu: Any,
    embedding_path: str | None, alloc_conf: AllocatorConfig | None = None, n_gpus: int = 1,
) -> DeviceMemory:  # fmt: skip
    """The device memory of a traced stream on `gpu` (None: the default GPU's overheads, no
    verdict): the allocator replayed, CUDA's context and workspaces added."""
    named = gpu
    gpu = gpu or get_gpu(DEFAULT_GPU)
    notes: list[str] = []
    emb = embedding_path if w.embedding_on_cpu else None
    records = place_on_host(records, optimizer_on_cpu=w.optimizer_on_cpu, embedding_path=emb)
    if (paged := paged_state_note(records)) is not None:
        notes.append(paged)
    host = host_memory(records, events, w, embedding_path=emb)
    conv = uses_convolution(events)
    overhead = device_overhead(gpu, n_gpus=n_gpus, uses_conv=conv, training=w.training)
    cublas = overhead.item("cublas_workspace")
    records_summary = summarize(records, embedding_path, micro_batches(w))
    if cublas is not None:  # device_overhead decided how many (handle, stream) pairs
        per_pair = cublas_workspace_bytes(gpu)
        records, events = add_workspaces(records, events, per_pair, cublas.bytes // per_pair)
    stream = [
        (
            1 if ev.kind == ALLOC else -1,
            ev.sid,
            0 if records[ev.sid].host else records[ev.sid].nbytes,
        )
        for ev in events
        if ev.kind in (ALLOC, FREE)
    ]
    cfg = alloc_conf or AllocatorConfig()
    capacity = gpu.total_memory_bytes
    outside = overhead.outside_allocator_bytes()
    cudnn = overhead.item("cudnn_conv_workspace")
    # Traced per call (memfit.estimator.trace.cudnn_workspace) when the trace holds them; the
    # flat estimate only for traces made without that hook.
    traced_cudnn = any(
        r.category == Category.WORKSPACES and r.op.startswith(_CONV_OPS) for r in records.values()
    )
    cudnn_bytes = cudnn.bytes if (cudnn and conv and not traced_cudnn) else 0
    # The memory the traced tensors can get: the device less what the allocator never sees,
    # less the cuDNN workspace (allocated through it, but not part of the trace).
    allocator_capacity = capacity - outside - cudnn_bytes
    run, failed = _replay(stream, cfg, capacity, allocator_capacity, bounded=named is not None)
    # Allocated as PyTorch counts it: whole blocks (a block is not split when the rest would
    # be too small), not requested bytes.
    profile = MemoryProfile.from_events(records, events, block_bytes=run.block_bytes)
    reserved = run.peak_reserved_bytes + cudnn_bytes
    profile.peak_reserved_bytes = reserved
    profile.device_total_bytes = reserved + outside
    profile.device_breakdown = {
        "allocated": profile.peak_allocated_bytes,
        "allocator_cache": reserved - profile.peak_allocated_bytes,
        "workspaces": (cublas.bytes if cublas else 0) + cudnn_bytes,
        "cuda_context": sum(
            i.bytes
            for i in overhead.items
            if not i.through_allocator and i.name != "nccl_communicator"
        ),
        "nccl": sum(i.bytes for i in overhead.items if i.name == "nccl_communicator"),
    }
    low, high = overhead.outside_allocator_range_bytes()
    oom = None
    if failed is not None and failed.oom is not None:
        oom_ev = events[failed.oom.event_index]
        oom = failed.oom.message(
            op=oom_ev.op, module=oom_ev.module or "<top>", total_capacity_bytes=capacity
        )
    fits = None
    if named is not None:
        fits = (
            failed is None
            and allocator_capacity > 0
            and profile.device_total_bytes <= (fit_limit(capacity))
        )
    else:
        notes.append(f"No GPU named: CUDA context and workspace sizes assume {gpu.display_name}.")
    if host.fits is False:
        # The verdict is for a named GPU; without one the note still says it.
        if named is not None:
            fits = False
        notes.append(_host_note(host))
    return DeviceMemory(
        profile=profile, host=host, records_summary=records_summary, overhead=overhead,
        device_total_range=(reserved + low, reserved + high), fits=fits, oom=oom,
        notes=tuple(notes),
    )  # fmt: skip


def _host_note(host: Any) -> str:
    where = "host_memory" if host.budget_source == "host_memory" else "this machine's RAM"
    return (
        f"Host memory: the step keeps {format_bytes(host.peak_bytes)} on the CPU "
        f"({format_bytes(host.pinned_bytes)} pinned), more than {where} "
        f"({format_bytes(host.budget_bytes or 0)}): the CPU runs out of memory first. Offload "
        "less, or give a larger host_memory if the run has more RAM."
    )


def _replay(
    stream: list[tuple[int, int, int]],
    cfg: AllocatorConfig,
    capacity: int,
    allocator_capacity: int,
    *,
    bounded: bool,
) -> tuple[AllocatorResult, AllocatorResult | None]:
    """The allocator replay of the stream, and the run that failed (None if none did).

    Unbounded first (only a memory fraction caps it); on a named GPU (`bounded`), when that
    needs more than the allocator can get, again within that capacity: cudaMalloc fails
    first, PyTorch frees its cache and retries, so a step that needs more than fits can
    still run, with less reserved.
    """
    run = simulate_shared(stream, config=cfg, total_bytes=capacity, record_blocks=True)
    failed = run if run.oom is not None else None
    if bounded and failed is None and 0 < allocator_capacity < run.peak_reserved_bytes:
        capped = simulate_shared(
            stream, config=cfg, capacity_bytes=allocator_capacity, total_bytes=capacity,
            record_blocks=True,
        )  # fmt: skip
        if capped.oom is None:
            run = capped
        else:
            failed = capped
    return run, failed
