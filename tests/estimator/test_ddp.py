"""DistributedDataParallel's gradient buckets (memfit.estimator.ddp): the bucket sizes by hand,
PyTorch's own DDP (gloo, one process) allocating the buckets memfit places, and the estimate of
a DDP process against the same step on one GPU."""

from __future__ import annotations

import socket

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import memfit
from memfit.cuda.allocator_config import cuda_block_size
from memfit.errors import BadInputError
from memfit.estimator.ddp import BUCKET_OP, rebuilt_buckets
from memfit.estimator.estimation import trace_spec
from memfit.events import ALLOC, FREE
from memfit.models.sources import resolve_model
from memfit.workload import LoraConfig
from tests.conftest import module_spec, tiny_llama_config

MIB = 1024 * 1024
WIDTH = 1024  # a Linear(1024, 1024): 4 MiB of weight and 4 KiB of bias in fp32
LAYERS = 8


def test_rebuilt_buckets_by_hand() -> None:
    # Ready order is the reverse of the layers: bias then weight of the last one first. The
    # first bucket closes past 1 MiB (one layer), the next past 25 MiB: 7 layers of 4,198,400 B
    # (6 make 25,190,400 < 26,214,400).
    layer = [4 * WIDTH, 4 * WIDTH * WIDTH]
    assert rebuilt_buckets(layer * LAYERS) == [4_198_400, 7 * 4_198_400]
    assert rebuilt_buckets([MIB] * 30) == [MIB, 25 * MIB, 4 * MIB]
    assert rebuilt_buckets([10, 20]) == [30]


class _FlatAllocations(TorchDispatchMode):
    """The float32 one-dimensional tensors `aten.empty` makes: DDP's flat buckets."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        empty = func is torch.ops.aten.empty.memory_format
        if empty and out.dtype == torch.float32 and out.dim() == 1:
            self.seen.append(out.numel() * 4)
        return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_pytorch_ddp_allocates_the_buckets_memfit_places() -> None:
    dist = torch.distributed
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{_port()}")
    try:
        built = _FlatAllocations()
        with built:
            ddp = torch.nn.parallel.DistributedDataParallel(model)
        steps = []
        for _ in range(2):
            probe = _FlatAllocations()
            with probe:
                ddp(torch.randn(2, WIDTH)).sum().backward()
            steps.append(probe.seen)
    finally:
        dist.destroy_process_group()
    total = sum(p.numel() * 4 for p in model.parameters())
    # Construction: one bucket of every parameter (after the flat copy that syncs them).
    assert built.seen[-1] == total
    # The first iteration allocates none; the second rebuilds them in ready order.
    assert [b for b in steps[0] if b >= 4 * WIDTH] == []
    ready = [4 * WIDTH, 4 * WIDTH * WIDTH] * LAYERS
    assert [b for b in steps[1] if b >= 4 * WIDTH] == rebuilt_buckets(ready)


def _buckets(tr) -> list[tuple[int, str, int, int]]:
    return [(ev.kind, ev.phase, ev.step, tr.records[ev.sid].nbytes)
            for ev in tr.events if ev.op == BUCKET_OP]  # fmt: skip


@pytest.mark.parametrize("lora", [False, True])
def test_a_ddp_process_holds_the_gradients_twice(tmp_path, lora: bool) -> None:
    spec = resolve_model(tiny_llama_config(tmp_path))
    one = memfit.Workload(seq_len=16, batch_size=2, grad_accum=2, precision="bf16-mixed",
                          lora=LoraConfig(rank=4) if lora else None)  # fmt: skip
    tr, _, _ = trace_spec(spec, one.with_(gpus=4, ddp=True), (8, 0), verify=False)
    plain, _, _ = trace_spec(spec, one, (8, 0), verify=False)
    # The gradients of step 0, in the order the backward made them.
    grads = [plain.records[ev.sid].nbytes for ev in plain.events
             if ev.kind == ALLOC and ev.step == 0 and ev.phase == "backward"
             and plain.records[ev.sid].category == "gradients"]  # fmt: skip
    trainable = 4 * plain.trainable_parameter_count  # fp32 master weights
    assert sum(grads) == trainable
    got = _buckets(tr)
    assert got[0] == (ALLOC, "setup", 0, trainable)
    assert got[1][:3] == (FREE, "inputs", 1)
    assert [b[3] for b in got[2:]] == rebuilt_buckets(grads)
    # Everything else is the step on one GPU.
    assert [ev for ev in tr.events if ev.op != BUCKET_OP] == plain.events
    a = memfit.estimate(spec, one, gpu="a100-80gb").profile
    b = memfit.estimate(spec, one.with_(gpus=4, ddp=True), gpu="a100-80gb").profile
    # The buckets are alive from setup on, as large as the gradients: the peak (in step 1,
    # after the rebuild) moves up by exactly their blocks (the allocator rounds to 512 B).
    assert a.peak_step == b.peak_step == 1
    rebuilt = sum(cuda_block_size(n) for n in rebuilt_buckets(grads))
    assert b.peak_allocated_bytes == a.peak_allocated_bytes + rebuilt


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        (dict(ddp=True), "gpus=1: DDP runs one process per GPU"),
        (dict(ddp=True, gpus=2, mode="inference"), "DDP synchronizes gradients"),
        (dict(ddp=True, gpus=2, fsdp_cpu_offload=True), "fsdp_cpu_offload=True, an FSDP2"),
        (dict(ddp=True, gpus=2, optimizer_in_backward=True), "fused optimizer hook"),
        (dict(ddp="yes", gpus=2), "ddp must be True or False"),
    ],
)
def test_ddp_refuses_what_does_not_apply(changes: dict, needle: str) -> None:
    with pytest.raises(BadInputError, match=needle):
        memfit.Workload(**changes)


def test_ddp_is_not_fsdp() -> None:
    w = memfit.Workload(gpus=2, ddp=True, precision="bf16-mixed", quantize="nf4",
                        lora=LoraConfig(rank=4))  # fmt: skip
    assert not w.fsdp and w.autocast and w.fsdp_param_dtype is None
    assert memfit.Workload(gpus=2).fsdp
    with pytest.raises(BadInputError, match="DDP needs an initialised process group"):
        memfit.apply_(torch.nn.Linear(2, 2), memfit.Workload(gpus=2, ddp=True))


def test_apply_wraps_in_ddp_and_the_measured_step_is_the_estimate() -> None:
    """apply_ a DDP workload in a real one-process gloo group: the setup steps through
    PyTorch's DistributedDataParallel (no_sync but on the last micro-batch), and the measured
    peak of two steps is the estimate's, buckets included. SGD: CUDA's foreach AdamW keeps
    temporaries of all parameters at once, the CPU's loop one at a time."""
    from memfit.techniques import DDPConfig

    dist = torch.distributed
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))
    w = memfit.Workload(batch_size=2, grad_accum=2, gpus=2, ddp=True, optimizer="sgd")
    assert DDPConfig(world_size=2) in memfit.techniques.configs_from_workload(w)
    x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(0))
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{_port()}")
    try:
        setup = memfit.apply_(model, w, lr=1e-3, loss_fn=lambda out, _batch: out.sum())
        assert isinstance(setup.model, torch.nn.parallel.DistributedDataParallel)
        assert setup.model.module is model and "DDP over 2 GPUs (gradient buckets)" in (
            setup.techniques)  # fmt: skip
        with memfit.measure(model, setup.optimizer) as m:
            for _ in range(2):
                setup.step(x)
    finally:
        dist.destroy_process_group()
    fresh = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))
    est = memfit.estimate(module_spec(fresh, lambda b: torch.randn(b, WIDTH)), w).profile
    got = m.profile
    total = sum(p.numel() * 4 for p in model.parameters())
    # The rebuilt buckets: measure sees them as temporaries (it does not know DDP's Reducer),
    # the estimate as the second copy of the gradients.
    assert got.breakdown["temporaries"] >= total and est.breakdown["gradients"] == 2 * total
    want = est.peak_allocated_bytes - est.breakdown["workspaces"]
    # Measured 105,043,968 B against 105,035,264 B: the caller's whole batch (4 rows) is alive
    # beside the micro-batch the estimate holds.
    assert abs(got.peak_allocated_bytes - want) <= 0.001 * want


def test_the_cost_model_all_reduces_the_buckets_once_a_step(tmp_path) -> None:
    from memfit.planner.work import work_of

    spec = resolve_model(tiny_llama_config(tmp_path))
    w = memfit.Workload(seq_len=16, batch_size=2, grad_accum=2, gpus=4, ddp=True)
    est = memfit.estimate(spec, w, gpu="a100-80gb")
    rec = est.records_summary
    grads = 4 * est.trainable_parameter_count  # fp32 gradients; the buckets copy them
    assert rec["ddp_buckets"] >= grads and rec["gradients"] >= grads
    # Gradients are counted once for the update, not with their bucket copy.
    assert rec["gradients"] < grads + 512 * len(list(spec.build(None, "sdpa").parameters()))
    # A ring all-reduce of the buckets: 2 (N - 1) / N of them, once (no_sync accumulates).
    assert work_of(est).sharded_bytes_per_step == 2 * 3 * rec["ddp_buckets"] // 4
