"""Gradient accumulation: tracing 2 micro-batches gives the memory of any k >= 2."""

from __future__ import annotations

import pytest

import memfit
import memfit.estimator.trace.step_runner as trace_mod
from memfit.estimator.estimation import steady_flops
from memfit.estimator.trace.step_runner import run_trace
from memfit.models.sources import resolve_model
from memfit.profile import MemoryProfile


@pytest.mark.parametrize("precision", ["fp32", "fp16-mixed"])
def test_two_micro_batches_stand_for_four(monkeypatch, precision):
    spec = resolve_model("pythia-70m")
    w = memfit.Workload(batch_size=2, seq_len=32, grad_accum=4, precision=precision)
    short = run_trace(spec, w, (8, 0))
    monkeypatch.setattr(trace_mod, "MAX_TRACED_MICRO_BATCHES", 4)
    full = run_trace(spec, w, (8, 0))
    a = MemoryProfile.from_events(short.records, short.events)
    b = MemoryProfile.from_events(full.records, full.events)
    assert a.peak_allocated_bytes == b.peak_allocated_bytes
    assert a.breakdown == b.breakdown
    assert {(p.step, p.phase): p.peak_bytes for p in a.phases} == {
        (p.step, p.phase): p.peak_bytes for p in b.phases
    }
    # FLOPs: the 2 traced micro-batches, scaled by 4 / 2, equal the 4 traced.
    assert steady_flops(short.flops, 4 / 2) == steady_flops(full.flops)
