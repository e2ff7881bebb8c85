"""The engine's gradient accumulation, in place where the real engine adds in place
(memfit.estimator.trace.grad_accumulation): checked against real CPU tensors, which run the same
input_buffer.cpp ``accumulate``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

from memfit.estimator.trace.grad_accumulation import AccumulationWatch, fold
from memfit.estimator.trace.tracker import Tracker
from memfit.events import ALLOC, Category

Build = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _cast_tied(w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    # Tied input/output embedding under autocast: the output layer gets a 16-bit cast of the
    # weight, so its gradient arrives through ToCopyBackward0, a fresh fp32 tensor.
    return F.linear(F.embedding(ids, w).bfloat16(), w.bfloat16()).float().sum()


def _fp32_tied(w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    # The same in fp32: the output layer's weight gradient arrives as a transposed view.
    return F.linear(F.embedding(ids, w), w).sum()


def _real_accumulation(build: Build) -> list[str]:
    w = torch.randn(10, 4, requires_grad=True)
    loss = build(w, torch.tensor([[1, 2, 3]]))
    with profile() as p:
        loss.backward()
    return [e.name for e in p.events() if e.name in ("aten::add", "aten::add_")]


@pytest.mark.parametrize(("build", "real_op", "folds"), [
    (_cast_tied, "aten::add_", 1),
    (_fp32_tied, "aten::add", 0),
])  # fmt: skip
def test_fold_follows_the_real_engine(build: Build, real_op: str, folds: int):
    # Ground truth: real tensors, no dispatch mode, so the engine's own choice.
    assert _real_accumulation(build) == [real_op]

    w = torch.randn(10, 4, requires_grad=True)  # 160 B of fp32
    tracker = Tracker(torch.nn.Module())
    watch = AccumulationWatch()
    tracker.op_workspaces = watch.hook

    def on_grad(p: torch.Tensor) -> None:
        tracker.mark(p.grad, Category.GRADIENTS)

    w.register_post_accumulate_grad_hook(on_grad)
    with tracker:
        tracker.set_phase("forward")
        loss = build(w, torch.tensor([[1, 2, 3]]))
        tracker.set_phase("backward")
        loss.backward()
        grad_sid = tracker.sid_of(w.grad)
    tracker.close()  # as the step runner does before folding
    assert grad_sid is not None
    grad_bytes = [ev for ev in tracker.events
                  if ev.kind == ALLOC and ev.phase == "backward"
                  and tracker.records[ev.sid].nbytes == 160]  # fmt: skip
    # Under the tracker (a dispatch mode) the engine always sums out of place: the first
    # gradient, the embedding's, and their sum.
    assert len(grad_bytes) == 3
    first = grad_bytes[0].sid
    fold(tracker.records, tracker.events, watch.pairs, tracker.grad_sids)
    left = [ev for ev in tracker.events
            if ev.kind == ALLOC and ev.phase == "backward" and ev.sid in tracker.records
            and tracker.records[ev.sid].nbytes == 160]  # fmt: skip
    assert len(left) == 3 - folds
    if folds:  # the sum is the first gradient's block, now the parameter's gradient
        assert grad_sid not in tracker.records
        assert tracker.records[first].category == Category.GRADIENTS
        assert all(ev.sid != grad_sid for ev in tracker.events)
    else:
        assert tracker.records[grad_sid].category == Category.GRADIENTS


def test_a_sum_that_is_not_a_parameter_gradient_is_left_alone():
    # A residual-like non-leaf sum: the first gradient may still be shared in the real engine.
    x = torch.randn(3, 4, requires_grad=True)
    tracker = Tracker(torch.nn.Module())
    watch = AccumulationWatch()
    tracker.op_workspaces = watch.hook
    with tracker:
        tracker.set_phase("forward")
        h = x.exp()
        loss = (h * 3 + (h * 2).sin()).sum()
        tracker.set_phase("backward")
        loss.backward()
    tracker.close()
    assert watch.pairs  # the engine's sum into h's buffer was seen
    before = list(tracker.events)
    fold(tracker.records, tracker.events, watch.pairs, tracker.grad_sids)
    assert tracker.events == before
