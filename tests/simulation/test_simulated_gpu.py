"""`memfit.simulate` (real CPU code on a simulated GPU's memory) and `memfit.simulation.oom`.

Hand numbers used below:
- the CUDA caching allocator rounds requests to 512 B, packs requests <= 1 MiB into 2 MiB
  segments, gives 1-10 MiB requests a 20 MiB segment and larger ones their size rounded up to
  2 MiB (CUDACachingAllocator.cpp);
- a cuBLAS workspace (memfit.cuda.overhead) is 2 x 4096 KiB + 8 x 16 KiB = 8,519,680 B per
  (handle, stream) before Hopper (the default GPU, a100-80gb, is sm80), 32 MiB on sm90. The
  caller's thread gets one at its first matmul, the autograd thread (backward) another at its
  first. 8,519,680 B is a 1-10 MiB request: a 20 MiB segment, split, whose 11.875 MiB rest
  then holds the second workspace too;
- outside the allocator on an RTX 4090 (128 SMs x 1536 threads x 1 KiB stack + 176 MiB driver
  state + 128 MiB lazily loaded kernels) = 496 MiB = 520,093,696 B; on a T4 (40 SMs x 1024
  threads) 344 MiB.

The model of the comparison with the estimate:

    Linear(64, 512) -> ReLU -> Linear(512, 512) -> ReLU -> Linear(512, 16), no bias, fp32
    W0 = 512 x 64 x 4 = 131,072 B   W2 = 512 x 512 x 4 = 1,048,576 B   W4 = 16 x 512 x 4 = 32,768 B
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import memfit
from memfit.cuda.allocator_replay import simulate as replay
from memfit.cuda.target import get_gpu
from memfit.errors import BadInputError
from memfit.events import ALLOC
from memfit.simulation.oom import explain_oom, render_oom
from memfit.simulation.simulated_gpu import simulate
from memfit.techniques.optimizer import optimizer_for_trace
from tests.conftest import module_spec

MiB = 1 << 20
WORKSPACE = 2 * 4096 * 1024 + 8 * 16 * 1024  # 8,519,680, one (handle, stream)
WORKSPACE_SEGMENT = 20 * MiB
W0, W2, W4 = 512 * 64 * 4, 512 * 512 * 4, 16 * 512 * 4
PARAMS = W0 + W2 + W4  # 1,212,416
BATCH = 256


# ------------------------------------------------------------------ allocator bookkeeping


def test_storages_are_malloced_and_freed_with_exact_sizes():
    with simulate(workspaces=False) as gpu:
        a = torch.empty(1000)  # 4000 B -> one 4096-B block in a 2 MiB small segment
        b = torch.empty(0)  # nothing
        assert (gpu.allocated_bytes, gpu.reserved_bytes) == (4096, 2 * MiB)
        c = torch.empty(3 * MiB // 4)  # 3 MiB: a 1-10 MiB request gets a 20 MiB segment
        assert gpu.allocated_bytes == 4096 + 3 * MiB
        assert gpu.reserved_bytes == 2 * MiB + 20 * MiB
        v = a[10:]  # a view: same storage, no new block
        del a, c
        assert gpu.allocated_bytes == 4096  # `v` keeps a's storage alive
        del v, b
        assert gpu.allocated_bytes == 0
        assert gpu.reserved_bytes == 22 * MiB  # cached, as in PyTorch
        gpu.empty_cache()
        assert gpu.reserved_bytes == 0
    assert gpu.peak_allocated_bytes == 4096 + 3 * MiB
    assert gpu.peak_reserved_bytes == 22 * MiB


def test_existing_tensors_count_only_when_passed():
    torch.manual_seed(0)
    model = nn.Linear(64, 32)  # weight 8192 B, bias 128 B -> a 512-B block
    stray = torch.empty(1024)
    extra = torch.empty(100)  # 400 B -> 512
    with simulate(model=model, tensors=[extra], workspaces=False) as gpu:
        live = gpu.live_tensors()
    assert sorted((t.category, t.block_bytes, t.module) for t in live) == [
        ("inputs", 512, ""),
        ("parameters", 512, ""),
        ("parameters", 8192, ""),
    ]
    assert gpu.allocated_bytes == 8192 + 512 + 512
    del stray


def test_cublas_workspace_at_the_first_matmul():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with simulate() as gpu:
        y = x @ w  # mm: the workspace, then the 128-B output (one 512-B block)
        z = x @ w  # the workspace is allocated once
    assert gpu.allocated_bytes == WORKSPACE + 2 * 512
    assert gpu.reserved_bytes == WORKSPACE_SEGMENT + 2 * MiB
    ws = [t for t in gpu.live_tensors() if t.category == "workspaces"]
    assert [(t.nbytes, t.op) for t in ws] == [(WORKSPACE, "mm.default")]
    with simulate("h100-sxm") as hopper:
        y = x @ w
    assert hopper.allocated_bytes == 32 * MiB + 512
    with simulate(workspaces=False) as none:
        y = x @ w
    assert none.allocated_bytes == 512
    del y, z


def test_backward_gets_its_own_cublas_workspace():
    # Backward runs on the autograd engine's thread, with its own cuBLAS handle: a second
    # workspace at its first matmul, which fits in the rest of the first one's 20 MiB segment.
    x, w = torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)
    with simulate() as gpu:
        (x @ w).sum().backward()
    ws = [t for t in gpu.live_tensors() if t.category == "workspaces"]
    in_backward = [(t.nbytes, t.phase == "backward") for t in ws]
    assert in_backward == [(WORKSPACE, False), (WORKSPACE, True)]
    assert gpu.reserved_bytes == WORKSPACE_SEGMENT + 2 * MiB
    with simulate() as inference, torch.no_grad():
        x @ w
        x @ w
    assert [t.nbytes for t in inference.live_tensors() if t.category == "workspaces"] == [WORKSPACE]


def test_capacity_is_the_gpu_minus_what_lives_outside_the_allocator():
    total = get_gpu("rtx-4090").total_memory_bytes
    outside = 520_093_696  # 496 MiB, see the module docstring
    assert simulate("rtx-4090").capacity_bytes == total - outside
    assert simulate("rtx-4090", budget_bytes=8 << 30).capacity_bytes == (8 << 30) - outside
    assert simulate(budget_bytes=12_345_678).capacity_bytes == 12_345_678
    assert simulate().capacity_bytes is None


def test_oom_message_is_pytorchs_with_the_gpu_total():
    with simulate("t4", budget_bytes=344 * MiB + 4 * MiB, workspaces=False) as gpu:
        a = torch.empty(MiB // 4)  # 1 MiB: small pool, segment 1 of 2
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(3 * MiB // 4)  # 3 MiB wants a 20 MiB segment; 2 MiB are free
    assert str(info.value) == (
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
        "348.00 MiB of which 2.00 MiB is free. Of the allocated memory 1024.00 KiB is allocated "
        "by PyTorch, and 1024.00 KiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:"
        "True to avoid fragmentation.  See documentation for Memory Management  "
        "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-"
        "pytorch-cuda-alloc-conf) (at op empty.memory_format in module <top>)"
    )
    assert gpu.oom is not None and gpu.oom.op == "empty.memory_format"
    del a


def test_alloc_conf_is_used():
    with simulate(alloc_conf="expandable_segments:True", workspaces=False) as gpu:
        a = torch.empty(3 * MiB // 4)  # 3 MiB in a large-pool page of 20 MiB
        b = torch.empty(3 * MiB // 4)  # the same page: no new segment
    assert gpu.reserved_bytes == 20 * MiB
    del a, b


# ------------------------------------------------------------------------------ bad input


def test_unknown_gpu_lists_the_closest_names():
    with pytest.raises(BadInputError, match=r"Unknown GPU 'rtx-4091'.*Did you mean.*rtx-4090"):
        simulate("rtx-4091")


def test_budget_below_the_cuda_context():
    with pytest.raises(BadInputError) as info:
        simulate("rtx-4090", budget_bytes=100 * MiB)
    text = str(info.value)
    assert "smaller than the CUDA context of rtx-4090" in text
    assert str(100 * MiB) in text and "520093696" in text
    assert not re.search(r"(^|[\s(=])-\d", text)  # no negative number


@pytest.mark.parametrize("budget", [0, -5, True, 1.5])
def test_budget_must_be_positive_bytes(budget):
    with pytest.raises(BadInputError, match="budget_bytes must be a positive whole number"):
        simulate(budget_bytes=budget)


def test_budget_above_the_gpu():
    with pytest.raises(BadInputError, match="is more than t4 has"):
        simulate("t4", budget_bytes=16 << 30)


def test_entered_once():
    gpu = simulate()
    with gpu:
        pass
    with pytest.raises(RuntimeError, match="entered once"), gpu:
        pass


# ------------------------------------------------- the OOM point agrees with memfit.estimate


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 512, bias=False), nn.ReLU(), nn.Linear(512, 512, bias=False), nn.ReLU(),
        nn.Linear(512, 16, bias=False),
    )  # fmt: skip


def clean_loop(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 2) -> None:
    """The step memfit.estimator.trace.step_runner traces, on real tensors."""
    for _ in range(steps):
        batch = torch.randn(BATCH, 64)
        out = model(batch)
        loss = out.float().sum()
        del out
        loss.backward()
        del loss, batch
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.fixture(scope="module")
def estimate_stream():
    spec = module_spec(build(), lambda b: torch.randn(b, 64))
    est = memfit.estimate(spec, memfit.Workload(batch_size=BATCH, optimizer="sgd"))
    recs, events = est.profile.records, est.profile.events
    stream = [(ev[0], ev[1], 0 if recs[ev[1]].host else recs[ev[1]].nbytes) for ev in events]
    return est, events, stream


def run_simulated(budget: int | None):
    model = build()
    opt = optimizer_for_trace("sgd", list(model.parameters()))
    with simulate(budget_bytes=budget, model=model, optimizer=opt) as gpu:
        try:
            clean_loop(model, opt)
        except torch.OutOfMemoryError as e:
            return gpu, e
    return gpu, None


def test_a_loop_that_fits_runs_with_the_estimated_peaks(estimate_stream):
    est, _, stream = estimate_stream
    free_run = replay(stream)
    gpu, err = run_simulated(free_run.peak_reserved_bytes)
    assert err is None
    # At the peak (backward): both workspaces, the weights and the live activations.
    assert gpu.peak_allocated_bytes == est.profile.peak_allocated_bytes == 20_972_544
    # The workspaces' 20 MiB segment and three 2 MiB small segments.
    assert gpu.peak_reserved_bytes == free_run.peak_reserved_bytes == 26 * MiB


@pytest.mark.parametrize(
    ("budget_mib", "op", "module", "phase"),
    [(22, "relu.default", "1", "forward"), (24, "mm.default", "2", "backward")],
)
def test_oom_at_the_op_the_estimate_predicts(estimate_stream, budget_mib, op, module, phase):
    _, events, stream = estimate_stream
    budget = budget_mib * MiB
    predicted = replay(stream, capacity_bytes=budget).oom
    assert predicted is not None
    ev = events[predicted.event_index]
    assert (ev[4], ev[5], ev[2]) == (op, module, phase)
    gpu, err = run_simulated(budget)
    assert isinstance(err, torch.OutOfMemoryError)
    assert (gpu.oom.op, gpu.oom.module, gpu.oom.phase) == (op, module, phase)
    # Same allocator state at the failure, so the very same message.
    assert str(err) == predicted.message(op=op, module=module)


def test_oom_at_the_cublas_workspace(estimate_stream):
    # The estimate puts the workspace in its own event right after the first matmul's output
    # (cuBLAS allocates it inside that call, memfit.estimator.device_memory); simulate
    # allocates it inside that op (mm of module 0), as a real run would report it.
    _, events, stream = estimate_stream
    budget = 21 * MiB  # the parameters' 2 MiB small segment + a 20 MiB segment do not fit
    predicted = replay(stream, capacity_bytes=budget).oom
    ev = events[predicted.event_index]
    before = next(e for e in reversed(events[: predicted.event_index]) if e[0] == ALLOC)
    assert (ev[4], before[4], before[5]) == ("cublas_workspace", "mm.default", "0")
    gpu, err = run_simulated(budget)
    assert (gpu.oom.op, gpu.oom.module) == ("mm.default", "0")
    assert gpu.oom.request.category == "workspaces"
    assert str(err) == predicted.message(op="mm.default", module="0")


# --------------------------------------------------------------------------- explain_oom


def test_explain_oom_in_forward(estimate_stream):
    gpu, err = run_simulated(22 * MiB)
    report = explain_oom(err, gpu)
    # Live at relu of module 1 in the first forward: the weights, the workspace, the batch
    # (256 x 64 x 4) and the output of module 0 (256 x 512 x 4).
    assert report.by_category == {
        "workspaces": WORKSPACE, "parameters": PARAMS, "activations": BATCH * 512 * 4,
        "inputs": BATCH * 64 * 4,
    }  # fmt: skip
    assert report.allocated_bytes == sum(report.by_category.values())
    assert report.by_module == {
        "<top>": WORKSPACE + BATCH * 64 * 4, "2": W2, "0": W0 + BATCH * 512 * 4, "4": W4,
    }  # fmt: skip
    assert (report.op, report.module, report.phase) == ("relu.default", "1", "forward")
    # relu's 512 KiB output needs a new 2 MiB small segment; 22 MiB are all reserved.
    assert (report.alloc_bytes, report.free_bytes, report.shortfall_bytes) == (2 * MiB, 0, 2 * MiB)
    top = report.top_tensors[0]
    assert (top.category, top.nbytes, top.op) == ("workspaces", WORKSPACE, "mm.default")
    act = next(t for t in report.top_tensors if t.category == "activations")
    assert (act.shape, act.dtype, act.module, act.op) == (
        (BATCH, 512),
        "float32",
        "0",
        "mm.default",
    )
    by_name = {s.name: s for s in report.suggestions}
    # Halving the micro-batch halves the batch and the activation (and the request): the
    # small segment then has room for relu's output.
    half = by_name["half_micro_batch"]
    assert half.saved_bytes == (BATCH * 64 * 4 + BATCH * 512 * 4) // 2
    assert half.fits and report.smallest_fix is half
    # Expandable segments map the workspace in a 20 MiB page: no room left for the rest.
    assert not by_name["expandable_segments"].fits
    assert not report.fragmentation
    text = render_oom(report)
    assert "Out of memory at op relu.default in module 1 (forward)." in text
    assert "halve the micro-batch and double gradient accumulation" in text
    assert "approximate" in text


def test_explain_oom_categories_with_optimizer_state():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))  # 2 x (16384 + 256)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randn(8, 64)
    model(x).sum().backward()
    opt.step()  # state exists before entering: exp_avg, exp_avg_sq (2 x params), step on host
    gpu = simulate(budget_bytes=22 * MiB, model=model, optimizer=opt, workspaces=False)
    with gpu, pytest.raises(torch.OutOfMemoryError) as info:
        # 32768 x 64 x 4 = 8 MiB tensors: the batch and the first Linear's output share a
        # 20 MiB segment; ReLU's output needs a second one (2 MiB small + 2 x 20 > 22 MiB).
        model(torch.randn(32768, 64)).sum().backward()
    report = explain_oom(info.value)  # the error carries its state
    assert (report.op, report.module, report.phase) == ("relu.default", "1", "forward")
    p = 2 * (16384 + 512)  # a 256-B bias is a 512-B block
    assert report.by_category == {
        "inputs": 8 * MiB, "activations": 8 * MiB, "optimizer_state": 2 * p, "parameters": p,
        "gradients": p,  # .grad from before entering, still there
    }  # fmt: skip
    names = {s.name: s for s in report.suggestions}
    # Half the micro-batch: the batch, the Linear's output and ReLU's output (4 MiB each) fit
    # in the first 20 MiB segment.
    assert names["half_micro_batch"].saved_bytes == 8 * MiB and names["half_micro_batch"].fits
    assert report.smallest_fix is names["half_micro_batch"]
    # 8-bit: only tensors of >= 4096 elements (the weights' states): 16384 fp32 -> 4096 B of
    # uint8 + 64 fp32 absmax (256 B -> one 512-B block); biases keep fp32 state; the two
    # quantisation maps (256 fp32 each, 1 KiB blocks) exist once.
    assert names["adamw-8bit"].saved_bytes == 2 * 2 * (16384 - 4096 - 512) - 2 * 1024
    # Adafactor: per weight a row and a column vector, 4 x 64 = 256 B each -> two 512-B
    # blocks; per bias one 4 x 64 = 256 B vector -> one 512-B block.
    assert names["adafactor"].saved_bytes == 2 * p - 2 * (2 * 512 + 512)
    assert gpu.oom is not None


def test_explain_oom_without_state_is_bad_input():
    with pytest.raises(BadInputError, match="explain_oom explains OOMs raised under"):
        explain_oom(torch.OutOfMemoryError("CUDA out of memory."))


def test_checkpointing_is_priced_on_repeated_blocks():
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(3)]
    model = nn.Sequential(*blocks)
    gpu = simulate(budget_bytes=6 * MiB, model=model, workspaces=False)
    with gpu, pytest.raises(torch.OutOfMemoryError) as info:
        model(torch.randn(1024, 64)).sum().backward()
    report = explain_oom(info.value, gpu)
    # Blocks 0 and 1 have run: each keeps Linear-1's output (saved by GELU, 1024 x 256 x 4 =
    # 1 MiB), GELU's output (saved by Linear-2, 1 MiB) and its output (1024 x 64 x 4 = 256 KiB).
    # Block 2's first Linear cannot get its 1 MiB.
    assert (report.op, report.module, report.phase) == ("addmm.default", "2.0", "forward")
    assert report.by_category["activations"] == 2 * (MiB + MiB + 256 * 1024)
    names = {s.name: s for s in report.suggestions}
    # Checkpointed, blocks 0 and 1 keep only their outputs: 2 x 2 MiB saved.
    assert names["activation_checkpointing"].saved_bytes == 4 * MiB
    # Half the micro-batch halves the activations and the 256 KiB batch.
    assert names["half_micro_batch"].saved_bytes == (2 * (2 * MiB + 256 * 1024) + 256 * 1024) // 2
    assert "checkpoint each of the 3 repeated blocks" in render_oom(report)


def test_memory_fraction_is_of_the_named_gpu():
    # allowed = fraction x the T4's total: a 40 MiB allowance holds one 30 MiB tensor, not two.
    total = get_gpu("t4").total_memory_bytes
    with simulate("t4", alloc_conf=f"per_process_memory_fraction:{40 * MiB / total}"):
        a = torch.empty(30 * MiB // 4)
        with pytest.raises(torch.OutOfMemoryError, match=r"40\.00 MiB allowed"):
            torch.empty(30 * MiB // 4)
    del a
    with pytest.raises(BadInputError, match="name the GPU"):
        simulate(alloc_conf="per_process_memory_fraction:0.5")
