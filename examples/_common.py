"""Shared by the examples: plan, apply, train a few steps under measurement, report."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

import memfit
from memfit.techniques import labels as technique_labels
from memfit.units import format_bytes


def parse_args(description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--gpu", default="t4", help="GPU to plan for (memfit gpus lists them)")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps to train")
    return ap.parse_args()


def plan_apply_train(
    *,
    source: Any,
    build: Callable[[], torch.nn.Module],
    make_batch: Callable[[int], Any],
    goal: memfit.Goal,
    gpu: str,
    steps: int,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
) -> None:
    """Plan `source` for `gpu`, apply the plan to a fresh `build()`, train, and compare."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    plan = memfit.plan(source, gpu=gpu, goal=goal)
    if plan.best is None:
        raise SystemExit(f"Nothing fits on {gpu}; see `memfit plan` for the closest miss.")
    w = plan.best.workload
    est = plan.best.estimate.profile
    print(f"plan for {gpu}: micro-batch {w.batch_size} x {w.grad_accum}, {w.precision}, "
          f"{w.optimizer}; {', '.join(technique_labels(w)) or 'no other technique'}")  # fmt: skip
    print(f"estimated peak allocated {format_bytes(est.peak_allocated_bytes)}, "
          f"device total {format_bytes(est.device_total_bytes)} on {gpu}")  # fmt: skip

    torch.manual_seed(0)
    model = build()
    setup = memfit.apply_(model, plan, device=device, lr=1e-3, loss_fn=loss_fn)
    print("applied:", ", ".join(setup.techniques))
    with memfit.measure(model, setup.optimizer) as m:
        for step in range(steps):
            loss = setup.step(make_batch(goal.global_batch))
            print(f"step {step}: loss {loss:.4f}")
    got = m.profile
    assert got is not None
    print(f"measured peak allocated on {m.device}: {format_bytes(got.peak_allocated_bytes)} "
          f"(at {got.peak_phase}, {got.peak_op})")  # fmt: skip
    if m.cuda_max_allocated is not None:
        print(f"torch.cuda.max_memory_allocated: {format_bytes(m.cuda_max_allocated)}, "
              f"max_memory_reserved: {format_bytes(m.cuda_max_reserved)}")  # fmt: skip
    else:
        print("(on CPU, autocast and kernels differ from CUDA: the estimate is for the GPU)")
