"""cuBLAS operand copies (memfit.estimator.trace.cublas_operands): a matrix whose strides cuBLAS
cannot take is cloned for the call, in the trace and in a simulated GPU, with exact bytes."""

from __future__ import annotations

import torch

from memfit.estimator.trace.cublas_operands import needs_copy, operand_copies
from memfit.events import ALLOC, FREE


def test_which_layouts_blas_cpp_clones():
    x = torch.empty(4, 6)
    assert not needs_copy(x)  # row-major
    assert not needs_copy(x.t())  # column-major: passed transposed
    assert not needs_copy(x[:, :3])  # unit stride, leading dimension 6 >= 3
    assert needs_copy(torch.ones(()).expand(4, 6))  # stride 0 (a sum's gradient)
    assert needs_copy(x[:, ::2])  # no unit stride
    assert not needs_copy(torch.ones(1, 1).expand(1, 1))  # one element is dense


def test_copies_of_mm_and_addmm_in_preparation_order():
    g = torch.ones(()).expand(8, 32)  # 8 x 32 fp32: 1,024 B when cloned
    w = torch.empty(32, 16)
    assert operand_copies("mm.default", (g, w)) == [1024]
    assert operand_copies("mm.default", (w.t(), g.t())) == [1024]
    assert operand_copies("addmm.default", (torch.empty(16), g, w)) == [1024]
    assert operand_copies("addmm.default", (torch.empty(16), g, g.t()[:, :4])) == [1024, 512]
    assert operand_copies("mm.default", (torch.empty(8, 32), w)) == []
    assert operand_copies("bmm.default", (g, w)) == []  # bmm is not modelled


def _linear_sum_step():
    """Linear(64, 64, bias=False) on a 4096 x 64 batch, `y.sum().backward()`, traced with
    CUDA's in-op allocations recorded (the estimator's hook)."""
    from memfit.estimator.trace.step_runner import _op_transients
    from memfit.estimator.trace.tracker import Tracker

    lin = torch.nn.Linear(64, 64, bias=False)
    tracker = Tracker(lin)
    tracker.op_workspaces = _op_transients
    x = torch.randn(4096, 64)
    with tracker:
        tracker.set_phase("forward")
        y = lin(x)
        tracker.set_phase("backward")
        y.sum().backward()
    return tracker


def test_the_trace_clones_a_sums_expanded_gradient_once_for_the_weight_gradient():
    tracker = _linear_sum_step()
    copies = [r for r in tracker.records.values()
              if r.category == "temporaries" and r.op == "mm.default"
              and r.nbytes == 4096 * 64 * 4]  # fmt: skip
    # x needs no gradient: one mm in backward (the weight's), whose 4096 x 64 gradient
    # operand is stride 0 and cloned: 1,048,576 B, allocated after the mm's output and
    # freed before the op returns.
    assert len(copies) == 1 and copies[0].phase == "backward"
    sid = copies[0].sid
    i = next(k for k, e in enumerate(tracker.events) if e.sid == sid and e.kind == ALLOC)
    assert tracker.events[i + 1].sid == sid and tracker.events[i + 1].kind == FREE
    out = tracker.events[i - 1]
    assert out.kind == ALLOC and tracker.records[out.sid].nbytes == 64 * 64 * 4


def test_a_fake_run_holds_the_copy_at_its_peak():
    from memfit.simulation.simulated_gpu import simulate

    lin = torch.nn.Linear(64, 64, bias=False)
    with simulate("t4", model=lin, fake=True, workspaces=False) as gpu:
        x = torch.randn(4096, 64)
        y = lin(x)
        y.sum().backward()
    # At the weight gradient's mm: the weight (16,384 B), x and y (1,048,576 B each), the
    # loss and its seed (512 B blocks), the mm's output (16,384 B) and the copy of the
    # stride-0 gradient (1,048,576 B).
    assert gpu.peak_allocated_bytes == 16_384 + 3 * 1_048_576 + 512 + 512 + 16_384
    assert gpu.allocated_bytes == 16_384 + 2 * 1_048_576 + 16_384  # copy freed; .grad kept
