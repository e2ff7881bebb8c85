"""cuDNN convolution workspaces: one transient allocation per cuDNN call, sized from the
operands (memfit.estimator.trace.cudnn_workspace), checked against the H200 recorded trace."""

from __future__ import annotations

import torch

from memfit.estimator.trace.cudnn_workspace import (
    WGRAD_SPLIT_K_BYTES,
    WORKSPACE_PAD_BYTES,
    conv_workspaces,
)


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, device="meta", dtype=dtype)


def _traced_conv_step():
    """A 3->4 channel 3x3 conv (no bias) on a 2x3x8x8 batch: forward and backward traced with
    cuDNN's workspaces recorded."""
    from memfit.estimator.trace.cudnn_workspace import record_conv_workspaces
    from memfit.estimator.trace.tracker import Tracker

    conv = torch.nn.Conv2d(3, 4, 3, bias=False)
    tracker = Tracker(conv)
    tracker.op_workspaces = record_conv_workspaces
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    with tracker:
        tracker.set_phase("forward")
        y = conv(x)
        tracker.set_phase("backward")
        y.sum().backward()
    return tracker


def test_resnet18_stem_forward_matches_the_recorded_h200_request():
    # tests/data/allocator_traces/resnet18-fp32-sgd-b16-h200-2026-11-27.json, event 125:
    # the stem conv's workspace request, right after its 51,380,224-byte output.
    x, w, out = _meta(16, 3, 224, 224), _meta(64, 3, 7, 7), _meta(16, 64, 112, 112)
    args = (x, w, None, [2, 2], [3, 3], [1, 1], False, [0, 0], 1)
    assert conv_workspaces("convolution.default", args, out) == [61_051_664]
    assert 9_633_792 + 51_380_224 + 37_632 + WORKSPACE_PAD_BYTES == 61_051_664


def test_backward_input_gradient_matches_the_recorded_request_and_weight_adds_split_k():
    # layer1's 3x3 convs: recorded input-gradient request 25,837,584 B (event 537).
    go, x, w = _meta(16, 64, 56, 56), _meta(16, 64, 56, 56), _meta(64, 64, 3, 3)
    args = (go, x, w, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    base = 12_845_056 * 2 + 147_456 + WORKSPACE_PAD_BYTES
    assert base == 25_837_584
    assert conv_workspaces("convolution_backward.default", args, None) == [
        base,
        base + WGRAD_SPLIT_K_BYTES,
    ]
    # The stem has no input gradient (the images do not require grad): one call.
    go, x, w = _meta(16, 64, 112, 112), _meta(16, 3, 224, 224), _meta(64, 3, 7, 7)
    args = (go, x, w, [0], [2, 2], [3, 3], [1, 1], False, [0, 0], 1, [False, True, False])
    assert conv_workspaces("convolution_backward.default", args, None) == [
        51_380_224 + 9_633_792 + 37_632 + WORKSPACE_PAD_BYTES + WGRAD_SPLIT_K_BYTES
    ]


def test_other_ops_and_non_cudnn_convolutions_have_none():
    x, w = _meta(2, 3, 8, 8), _meta(4, 3, 3, 3)
    assert conv_workspaces("mm.default", (x, w), x) == []
    xd, wd = _meta(2, 3, 8, 8, dtype=torch.float64), _meta(4, 3, 3, 3, dtype=torch.float64)
    args = (xd, wd, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    assert conv_workspaces("convolution.default", args, xd) == []


def test_a_traced_conv_step_records_each_workspace_freed_at_once():
    from memfit.events import ALLOC, FREE

    tracker = _traced_conv_step()
    ws = [r for r in tracker.records.values() if r.category == "workspaces"]
    # forward: 2*3*8*8*4 + 2*4*6*6*4 + 4*3*3*3*4 = 1536 + 1152 + 432, + 16
    fwd = 1536 + 1152 + 432 + WORKSPACE_PAD_BYTES
    # backward: grad_output 1152 + input 1536 + weight 432 + 16, input then weight gradient
    assert [r.nbytes for r in ws] == [fwd, fwd, fwd + WGRAD_SPLIT_K_BYTES]
    assert [r.phase for r in ws] == ["forward", "backward", "backward"]
    for r in ws:
        kinds = [ev.kind for ev in tracker.events if ev.sid == r.sid]
        assert kinds == [ALLOC, FREE]


def test_backward_workspaces_follow_their_own_gradient_allocation():
    # ConvShared.cpp cudnn_convolution_backward: grad_input is allocated and its plan run
    # (workspace allocated and freed) before grad_weight is allocated, as in the recorded H200
    # trace (events 294-299): grad_input, its workspace, grad_weight, the weight's workspace.
    from memfit.events import ALLOC

    tracker = _traced_conv_step()
    allocs = [
        tracker.records[ev.sid]
        for ev in tracker.events
        if ev.kind == ALLOC and ev.phase == "backward" and ev.op.startswith("convolution_backward")
    ]
    fwd = 1536 + 1152 + 432 + WORKSPACE_PAD_BYTES
    # grad_input (2*3*8*8*4 = 1536 B), its workspace, grad_weight (432 B), its workspace.
    assert [(r.nbytes, r.category == "workspaces") for r in allocs] == [
        (1536, False),
        (fwd, True),
        (432, False),
        (fwd + WGRAD_SPLIT_K_BYTES, True),
    ]
