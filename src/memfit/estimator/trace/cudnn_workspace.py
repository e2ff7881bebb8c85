"""cuDNN convolution workspaces as the caching allocator sees them: one transient block per call.

Mechanism (torch 2.8-2.13): ``aten/src/ATen/native/cudnn/Conv_v8.cpp`` ``run_conv_plan`` asks the
caching allocator for ``plan.getWorkspaceSize()`` bytes right before it launches the plan and
frees them when the call returns (``c10::cuda::CUDACachingAllocator::get()->allocate``). On
CUDA a training convolution makes up to three such calls: the forward, and in
``convolution_backward`` one for the input gradient (``cudnn_convolution_backward_input``) and
one for the weight gradient (``cudnn_convolution_backward_weight``), each after its own output
is allocated. So the workspace is not a constant beside the trace: it is a short-lived
allocation inside the op's event stream, and it reaches the allocator's peak (and can force a
new segment) exactly when the op runs under the highest pressure.

Its size is the engine's. The engines cuDNN 9 picks for NCHW float tensors on sm80/sm90 run on
NHWC tensor-core kernels and convert their operands into the workspace; the recorded H200 trace
(tests/data/allocator_traces/resnet18-fp32-sgd-b16-h200-2026-11-27.json, cuDNN 9.19) shows
forward workspaces of exactly ``input + output + weight + 16`` bytes (ResNet-18's stem conv:
9,633,792 + 51,380,224 + 37,632 + 16 = 61,051,664) and of ``input + weight + 16`` where the
engine converts only some operands, and backward ones within 0.7-1.8 x that sum. The model
here is the full conversion, ``input + output + weight`` bytes plus the 16-byte alignment pad,
for each cuDNN call: an engine that converts fewer operands uses less, so it errs high, which
is the safe direction for reserved memory. See docs/accuracy.md for the replay against the
recorded trace.
"""

from __future__ import annotations

from typing import Any

import torch

from memfit.estimator.trace.op_transients import after_alloc_of, insert_events, new_records
from memfit.events import Category

#: cudnn_frontend pads the variant pack's workspace pointer to 16 bytes (the "+16" in every
#: recorded cuDNN workspace request on the H200 trace: 61,051,664 = 61,051,648 + 16).
WORKSPACE_PAD_BYTES = 16

#: The weight-gradient engines' split-K partial sums beside the operand copies. Engine-chosen:
#: on the H200 trace the weight-gradient requests exceed the operand sum by 0.39-7.08 MB over
#: ResNet-18's 11 convolution shapes (e.g. layer3's 3x3: 15,860,319 - 8,781,840 = 7,078,479 B,
#: three fp32 copies of its weight). Modelled at that observed maximum rounded up to 8 MiB,
#: the high side; its per-layer choice (cuDNN's heuristics) is not modelled.
WGRAD_SPLIT_K_BYTES = 8 << 20

_FORWARD = ("convolution.default", "convolution_overrideable.default")
_BACKWARD = ("convolution_backward.default", "convolution_backward_overrideable.default")


def _nbytes(t: Any) -> int:
    if not isinstance(t, torch.Tensor):
        return 0
    return t.numel() * t.element_size()


def _is_cudnn_conv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """cuDNN runs 2-d and 3-d float convolutions (aten ConvUtils.h ``use_cudnn``: not for
    1-element batches of depthwise 1-d ones, not for double on every arch); plain 1-d ones are
    run as 2-d with a unit height. Integer and complex convolutions never reach it."""
    return x.is_floating_point() and x.dtype != torch.float64 and weight.dim() >= 3


def conv_workspaces(name: str, args: Any, out: Any) -> list[int]:
    """The workspace requests (bytes, in call order) of one convolution aten op on CUDA.

    ``name``: the op's name as the tracker sees it; ``args``: its positional arguments
    (``convolution(input, weight, bias, stride, padding, dilation, transposed, ...)``,
    ``convolution_backward(grad_output, input, weight, bias_sizes, ..., output_mask)``);
    ``out``: what it returned. Empty for any other op.
    """
    if name in _FORWARD:
        x, weight = args[0], args[1]
        if not _is_cudnn_conv(x, weight):
            return []
        return [_nbytes(x) + _nbytes(out) + _nbytes(weight) + WORKSPACE_PAD_BYTES]
    if name in _BACKWARD:
        grad_out, x, weight = args[0], args[1], args[2]
        if not _is_cudnn_conv(x, weight):
            return []
        mask = args[-1]
        base = _nbytes(grad_out) + _nbytes(x) + _nbytes(weight) + WORKSPACE_PAD_BYTES
        # One call per gradient asked for: input (mask[0]) then weight (mask[1]); the bias
        # gradient is a reduction of grad_output, with no cuDNN workspace. The weight
        # gradient's engine also keeps split-K partial sums: larger than the input
        # gradient's block, it cannot reuse it, which is what grows reserved memory.
        out = [base] if mask[0] else []
        return [*out, base + WGRAD_SPLIT_K_BYTES] if mask[1] else out
    return []


def _anchors(name: str, args: Any, out: Any) -> list[Any]:
    """For each workspace of ``conv_workspaces``, the output tensor allocated right before it.

    The forward allocates its output, then runs the plan. ``cudnn_convolution_backward``
    (aten/src/ATen/native/cudnn/ConvShared.cpp) runs two calls one after the other:
    ``cudnn_convolution_backward_input`` allocates grad_input (``empty_cuda``) and runs its
    plan, then ``cudnn_convolution_backward_weight`` allocates grad_weight (``at::empty``)
    and runs its own. So the input gradient's workspace is freed before grad_weight exists,
    and grad_weight can take the block it left (the recorded H200 trace, events 294-299:
    grad_input, its workspace, grad_weight, the weight gradient's workspace).
    """
    if name in _FORWARD:
        return [out]
    if name in _BACKWARD and isinstance(out, (tuple, list)):
        mask = args[-1]
        return [out[i] for i in (0, 1) if mask[i]]
    return []


def record_conv_workspaces(tracker: Any, name: str, args: Any, out: Any) -> None:
    """The tracker's ``op_workspaces`` hook: each workspace of a convolution op as an
    allocation freed at once, in the op's context, category ``workspaces``, placed in the
    stream right after the output its cuDNN call allocated (``_anchors``).

    It writes the tracker's records and events directly (no tensor of it ever reaches
    Python, so no storage finalizer could see it).
    """
    sizes = conv_workspaces(name, args, out)
    if not sizes:
        return
    anchors = _anchors(name, args, out)
    placed = [after_alloc_of(tracker, a) for a in anchors[: len(sizes)]]
    placed += [len(tracker.events)] * (len(sizes) - len(placed))
    sids = new_records(tracker, name, sizes, Category.WORKSPACES)
    # Insert the later ones first, so that the earlier anchors' indices stay valid.
    for at, _, sid in sorted(zip(placed, range(len(sids)), sids, strict=True), reverse=True):
        insert_events(tracker, at, [sid], together=False)
